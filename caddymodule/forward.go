package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/claim"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// Sync mode, the second half of ServeHTTP: a delivery the intake took in
// is answered from the cache of completed events, or claimed
// (internal/claim), forwarded once to the next handler while the provider
// waits, and settled by the forward's verdict. The provider gets the
// upstream's own answer.

// mode serves a delivery the intake took in.
type mode interface {
	serve(w http.ResponseWriter, next caddyhttp.Handler, d *delivery) error
}

// syncMode is mode sync.
type syncMode struct{ h *Handler }

func (m syncMode) serve(w http.ResponseWriter, next caddyhttp.Handler, d *delivery) error {
	h := m.h
	if h.answerCached(w, d, true) {
		return nil
	}
	cl, err := h.claims.Claim(d.r.Context(), h.Scope, d.eventID, d.fingerprint)
	if err != nil {
		h.claimFailed(w, d, err)
		return nil
	}
	h.storeAnswered()
	d.attempt = cl.Attempts
	if cl.Outcome != store.Claimed {
		return h.answerClaim(w, d, cl)
	}
	d.ambiguousBefore = cl.Ambiguous
	h.noteReforward(d.eventID, cl)
	refs := []claim.Ref{h.refOf(d.eventID, cl)}
	noteClaim(d.r, cl.Attempts)
	if h.replayRecord { // replayguard.go
		bc, ok := h.claimBody(w, d, refs[0])
		if !ok {
			return nil
		}
		refs = append(refs, bc)
	}
	return h.forward(w, h.withClaim(d.forwardable(), refs[0]), next, refs, d)
}

// answerCached answers a delivery of an event this instance knows is
// completed: the duplicate answer, or with replay response its stored
// answer. It reports false (nothing written) on a miss. sameBody: under
// dedupe_body, a completed event ID arriving with another body is logged.
func (h *Handler) answerCached(w http.ResponseWriter, d *delivery, sameBody bool) bool {
	if h.completed == nil {
		return false
	}
	if !h.replayOn {
		if !d.knownOK { // looked up by ServeHTTP (eventIDValue)
			h.cacheMiss.Inc()
			return false
		}
		h.cacheHit.Inc()
		d.status, d.cached = d.known.Status, true
		if h.dedupeBody && sameBody {
			h.checkSameBody(d.r.Context(), d.eventID, d)
		}
		h.answer(w, d, ansDuplicate, say{})
		return true
	}
	resp, ok := h.completed.Response(h.Scope, d.eventID)
	if !ok {
		h.cacheMiss.Inc()
		return false
	}
	h.cacheHit.Inc()
	d.cached = true
	if resp.Fingerprint != d.fingerprint {
		h.refuseReused(w, d)
		return true
	}
	d.outcome, d.status = outcomeDuplicate, resp.Status
	if h.dedupeBody {
		h.checkSameBody(d.r.Context(), d.eventID, d)
	}
	h.replay(w, resp, d)
	return true
}

// answerClaim answers a delivery whose event the store did not let it
// claim: completed (the duplicate or replayed answer), in flight, or held.
// A key reused with another request fingerprint is refused
// (Idempotency-Key; a webhook's claim has no fingerprint).
func (h *Handler) answerClaim(w http.ResponseWriter, d *delivery, cl store.Claim) error {
	switch cl.Outcome {
	case store.Duplicate, store.InFlight:
		switch {
		case cl.Fingerprint != d.fingerprint:
			h.refuseReused(w, d)
		case cl.Outcome == store.InFlight:
			h.answer(w, d, ansInFlight, say{retryAfter: cl.RetryAfter})
		case h.replayOn:
			h.replayStored(w, d, cl)
		default:
			d.status = cl.Status
			h.completed.Add(h.Scope, d.eventID, cl.Status)
			if h.dedupeBody {
				h.checkSameBody(d.r.Context(), d.eventID, d)
			}
			h.answer(w, d, ansDuplicate, say{})
		}
	case store.Held:
		h.noteHeldNow(d.eventID, cl)
		h.answer(w, d, ansHeld, say{})
	default:
		return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("unexpected claim outcome %v", cl.Outcome))
	}
	return nil
}

// noteReforward warns about, and counts, a claim that forwards an event
// again although an earlier forward of it may have run the upstream: it
// ended with no known outcome and was released (on_ambiguous reforward), or
// its gateway stopped and the lease expired. The alert "an event may have
// run twice" watches ambiguous_reforwards_total.
func (h *Handler) noteReforward(id string, cl store.Claim) {
	if cl.Ambiguous == 0 {
		return
	}
	h.ambiguousReforwards.Inc()
	h.logger.Warn("forwarding an event again that an earlier forward may already have run (it ended with no known outcome, or its lease expired); the upstream may run it twice",
		zap.String("scope", h.Scope), zap.String("event_id", id), zap.Int("attempt", cl.Attempts),
		zap.Int("ambiguous_endings", cl.Ambiguous))
}

// noteHeldNow logs a claim that found the event's lease expired and held
// it (on_ambiguous hold): the forward that held the claim never settled.
func (h *Handler) noteHeldNow(id string, cl store.Claim) {
	if !cl.HeldNow {
		return
	}
	h.logger.Warn("event held: its claim's lease expired before its forward settled; the upstream may have run it, or may still be running it (on_ambiguous hold)",
		zap.String("scope", h.Scope), zap.String("event_id", id), zap.String("reason", store.HoldLeaseExpired))
}

// forward runs the next handler with the claims held, renewing their leases,
// and settles them on the upstream's answer. The forward is detached from the
// provider's connection and bounded by ForwardTimeout instead. Every exit of
// the next handler (a return, an error, a panic: reverse_proxy raises
// http.ErrAbortHandler when the upstream's body is cut or the provider's
// connection fails mid-answer) settles the claims exactly once, balances the
// in-flight gauge and sets the delivery's outcome; a panic is then raised
// again with its own value, as net/http expects.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, claims []claim.Ref, d *delivery) error {
	// Keep the store open until this claim is settled, even if a config
	// reload drops the handler meanwhile (see Cleanup).
	defer h.claims.Track()()
	defer trackForward()()
	wire := new(wireTrace)
	tctx, cancel := context.WithTimeout(wire.with(context.WithoutCancel(r.Context())), time.Duration(h.ForwardTimeout))
	defer cancel()
	// A process exit past the grace period cuts the forward here, so its
	// claims are settled before the process ends (see shutdownForwards).
	fctx, cut := context.WithCancelCause(tctx)
	defer cut(nil)
	defer context.AfterFunc(exiting, func() { cut(errShutdown) })()

	endKeep := h.claims.KeepAlive(fctx, claims)

	h.claimsInFlight.Inc()
	var tee *capture // the answer stored for replay
	if h.replayOn {
		tee = h.newCapture(w)
		w = tee
	}
	rec := caddyhttp.NewResponseRecorder(w, nil, nil)
	upstart := time.Now()
	panicked, err := runNext(next, rec, r.WithContext(fctx))
	d.upstream = time.Since(upstart)
	endKeep()
	h.claimsInFlight.Dec()
	h.upstreamTime.Observe(d.upstream.Seconds())

	end := forwardEnd{status: finalStatus(rec), err: err, panicked: panicked != nil, wire: wire}
	end.refused = refused(err) && !wire.used()
	end.timedOut = errors.Is(fctx.Err(), context.DeadlineExceeded) && end.status == 0
	end.shutdown = errors.Is(context.Cause(fctx), errShutdown) && end.status == 0
	d.status = end.status
	h.settle(r.Context(), claims, end, tee, d)
	if panicked != nil {
		panic(panicked)
	}
	return h.answerProxyError(rec, err, end.refused, d)
}

// settle settles the forward's claims by its verdict: complete (cached at
// once, written after the answer), hold (on_ambiguous hold, or the
// event's second ambiguous ending under reforward), release after an
// ambiguous ending (counted on the row), or release.
func (h *Handler) settle(ctx context.Context, claims []claim.Ref, end forwardEnd, tee *capture, d *delivery) {
	if claims[0].ByUpstream {
		h.conclude(ctx, claims, end, tee, d)
		return
	}
	switch v := h.verdict(end); {
	case v == verdictComplete:
		d.outcome = outcomeCompleted
		if tee != nil {
			claims[0].Resp = h.storedResponse(tee, end, d)
		}
		// Cached first: from now on a duplicate on this instance is
		// answered from the cache, or waits for the completion (claim.Keeper.Claim).
		h.remember(claims[0], end.status)
		h.claims.CompleteAfterAnswer(ctx, claims, end.status)
	case v == verdictAmbiguous && (h.OnAmbiguous == "hold" || d.ambiguousBefore > 0):
		// The upstream may or may not have done the work: park the event
		// as held now, so its retries get 503 and an operator can decide
		// at once. Under reforward an event is forwarded again after one
		// ambiguous ending, never after a second: an upstream slower than
		// forward_timeout would otherwise run once per delivery.
		d.outcome, d.reason = outcomeAmbiguous, end.describe()
		msg := "forward ended with no known outcome; the event is held (on_ambiguous hold)"
		if h.OnAmbiguous != "hold" {
			d.reason = "a second forward ended with no known outcome (on_ambiguous reforward forwards an event again once): " + d.reason
			msg = "forward of an event forwarded again ended with no known outcome again; the event is held, not forwarded a third time (on_ambiguous reforward)"
		}
		h.logger.Warn(msg, zap.String("scope", h.Scope), zap.String("event_id", claims[0].ID), zap.String("reason", d.reason))
		for i := range claims {
			claims[i].HoldReason = d.reason
		}
		h.claims.Settle(ctx, claims, 0, claim.Hold)
	case v == verdictAmbiguous:
		// Released as reforward says, but counted on the row: the next
		// claim warns that the upstream may already have run the event,
		// and holds it if that forward ends ambiguously too.
		d.outcome, d.reason = outcomeAmbiguousReleased, end.describe()
		h.logger.Warn("forward ended with no known outcome; the event is released and its next delivery forwarded again (on_ambiguous reforward)",
			zap.String("scope", h.Scope), zap.String("event_id", claims[0].ID), zap.String("reason", d.reason))
		h.claims.Settle(ctx, claims, 0, claim.ReleaseAmbiguous)
	default:
		d.outcome = outcomeReleased
		h.claims.Settle(ctx, claims, end.status, claim.Release)
	}
}

// remember caches a completed claim: its stored response when it has one,
// else its status.
func (h *Handler) remember(c claim.Ref, status int) {
	if c.Resp != nil {
		h.completed.AddResponse(c.Scope, c.ID, c.Resp, h.responseTTL())
		return
	}
	if h.idem == nil { // a key's fingerprint must be checked: never by status alone
		h.completed.Add(c.Scope, c.ID, status)
	}
}

// responseTTL keeps a cached response no longer than the route's
// retention, after which the row, and the answer, are gone.
func (h *Handler) responseTTL() time.Duration {
	return min(cacheTTL, time.Duration(h.Retention))
}

// passOn runs the next handler for a delivery forwarded without a claim
// (handshakes, on_missing_id forward, requests without an Idempotency-Key)
// and answers its error itself. A panic of the next handler is raised
// again once the delivery's status is noted.
func (h *Handler) passOn(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, d *delivery) error {
	rec := caddyhttp.NewResponseRecorder(w, nil, nil)
	upstart := time.Now()
	panicked, err := runNext(next, rec, r)
	d.upstream = time.Since(upstart)
	d.status = finalStatus(rec)
	if panicked != nil {
		panic(panicked) // the delivery's line is logged on the way out
	}
	return h.answerProxyError(rec, err, refused(err), d)
}

// answerProxyError answers an error of the next handler (the upstream
// refused the connection, timed out, the provider hung up) here instead of
// returning it to Caddy: Caddy's error log line prints the request's headers,
// and with them the signature or, for GitLab, the secret token itself.
// The answer is the error's status (502 when it has none) with a JSON body;
// the log line names the error, never a header. Routes' handle_errors blocks
// therefore do not see upstream errors of this handler.
//
// A next handler that returned no error and wrote no status means nothing
// after this handler answered: the route has no reverse_proxy (Caddy would
// answer an empty 200 and the provider would never deliver the event
// again). It is answered 502, so the provider retries once the route is
// fixed; the claim was released (nothing reached an upstream).
func (h *Handler) answerProxyError(rec caddyhttp.ResponseRecorder, err error, refusal bool, d *delivery) error {
	if err == nil {
		if finalStatus(rec) == 0 {
			h.answer(rec, d, ansNoUpstream, say{status: http.StatusBadGateway})
			d.status = http.StatusBadGateway
			h.logThrottled(zapcore.ErrorLevel, "no handler after webhook_idempotency answered the delivery; answered 502 so the provider delivers it again: "+
				"put reverse_proxy (or the handler that runs the event) after webhook_idempotency in this route",
				zap.String("scope", h.Scope), zap.String("event_id", d.eventID))
		}
		return nil
	}
	status, reason := http.StatusBadGateway, ""
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode >= 400 {
		status = he.StatusCode
	}
	if refusal || status < 500 {
		// A handler's own refusal (file_server's 405 to a POST), not an
		// upstream that could not be reached.
		reason = fmt.Sprintf("the handler after webhook_idempotency refused the request: %d %s", status, http.StatusText(status))
	}
	if finalStatus(rec) == 0 {
		h.answer(rec, d, ansUpstreamError, say{status: status, reason: reason})
		d.status = status
	}
	if c := h.logger.Check(zapcore.WarnLevel, "upstream error"); c != nil {
		c.Write(zap.String("scope", h.Scope), zap.String("event_id", d.eventID), zap.Int("status", status), zap.Error(err))
	}
	return nil
}
