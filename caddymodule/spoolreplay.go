package caddymodule

// Replaying a spooled delivery through its own route (spool.go keeps it).

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/claim"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/spool"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// spoolReplay is the context value of a spooled delivery replayed through
// the server: only the handler of its spool acts on it, and reports the
// outcome back in it. It cannot come from outside: context values are not
// headers.
type spoolReplay struct {
	sp  *pooledSpool
	rec *spool.Record
	// to is the handler the spool delivers to, in srv's routes.
	to      *Handler
	srv     *caddyhttp.Server
	reached bool
	result  spool.Result
}

type spoolReplayKey struct{}

// replayOf returns the replay r carries, if any.
func replayOf(r *http.Request) *spoolReplay {
	rp, _ := r.Context().Value(spoolReplayKey{}).(*spoolReplay)
	return rp
}

// unroutedRetry is how long a record that reached no handler of its spool
// waits before it is replayed again.
const unroutedRetry = time.Minute

// deliverSpooled is the route's spool.Deliverer: it replays the record
// through the Caddy server that holds this handler, as a request with the
// record's method, target, headers and body, so the route's matchers and
// handlers before this one see it as they saw the original; this handler
// then claims, forwards and settles it (serveSpooled).
func (h *Handler) deliverSpooled(ctx context.Context, rec *spool.Record) spool.Result {
	st := h.spooler
	if st == nil {
		return spool.Result{Outcome: spool.Wait, RetryAfter: unroutedRetry}
	}
	if !configRunning(h.app) {
		// Provisioned, not yet started (or already replaced): its server
		// and routes are still being set up.
		return spool.Result{Outcome: spool.NotReady, RetryAfter: 200 * time.Millisecond}
	}
	srv := st.srv.Load()
	if srv == nil {
		if srv = serverOf(h.app, h); srv == nil {
			h.logger.Warn("spool: no server of the config holds this route; spooled deliveries wait",
				zap.String("scope", h.Scope))
			return spool.Result{Outcome: spool.Wait, RetryAfter: unroutedRetry}
		}
		st.srv.Store(srv)
	}
	rp := &spoolReplay{sp: st.sp, rec: rec, to: h, srv: srv}
	req, err := replayRequest(context.WithValue(ctx, spoolReplayKey{}, rp), rec)
	if err != nil {
		h.logger.Error("spool: a spooled delivery cannot be replayed; it waits for an operator",
			zap.String("scope", rec.Scope), zap.String("event_id", rec.EventID), zap.Error(err))
		return spool.Result{Outcome: spool.Wait, RetryAfter: time.Hour}
	}
	srv.ServeHTTP(new(replayWriter), req)
	if !rp.reached {
		// Refused, not a wait: tried again with back-off, then set aside
		// (dead) like a delivery the upstream keeps refusing, where an
		// operator can retry or drop it. A wait never ended, and the admin
		// API drops only dead deliveries.
		h.logger.Warn("spool: a spooled delivery did not reach its route when replayed (was the route changed?); "+
			"it is tried again, then set aside for an operator like a refused one",
			zap.String("scope", rec.Scope), zap.String("event_id", rec.EventID))
		return spool.Result{Outcome: spool.Refused}
	}
	return rp.result
}

// configRunning reports whether app is the http app of the config Caddy
// runs now: set once every app of the config has started, so its servers'
// routes are provisioned and no longer change.
func configRunning(app any) bool {
	a, err := caddy.ActiveContext().AppIfConfigured("http")
	return err == nil && app != nil && a == app
}

// replayRequest builds the request of a spooled delivery, as received.
func replayRequest(ctx context.Context, rec *spool.Record) (*http.Request, error) {
	u, err := url.ParseRequestURI(rec.URI)
	if err != nil {
		return nil, fmt.Errorf("request target: %w", err)
	}
	u.Host, u.Scheme = rec.Host, rec.Scheme
	r := &http.Request{
		Method: rec.Method, URL: u, RequestURI: rec.URI, Host: rec.Host, RemoteAddr: rec.RemoteAddr,
		// Replayed as HTTP/1.1 whatever it arrived with: the upstream gets
		// the same method, target, headers and body either way.
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: rec.Header.Clone(), ContentLength: int64(len(rec.Body)),
		Body: io.NopCloser(bytes.NewReader(rec.Body)),
	}
	if rec.Scheme == "https" {
		host, _, err := net.SplitHostPort(rec.Host)
		if err != nil {
			host = rec.Host
		}
		r.TLS = &tls.ConnectionState{HandshakeComplete: true, ServerName: host}
	}
	return r.WithContext(ctx), nil
}

// replayWriter is the answer of a replay: the provider was answered when
// the delivery was spooled, so only the status is kept (for the log line).
type replayWriter struct {
	hdr    http.Header
	status int
}

func (w *replayWriter) Header() http.Header {
	if w.hdr == nil {
		w.hdr = make(http.Header)
	}
	return w.hdr
}

func (w *replayWriter) WriteHeader(status int) {
	if w.status == 0 && status >= 200 {
		w.status = status
	}
}

func (w *replayWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return len(b), nil
}

// serverOf finds the server of app whose routes (subroutes included) hold
// h.
func serverOf(app any, h *Handler) *caddyhttp.Server {
	a, ok := app.(*caddyhttp.App)
	if !ok || a == nil {
		return nil
	}
	for _, srv := range a.Servers {
		if routesHold(srv.Routes, h) {
			return srv
		}
	}
	return nil
}

// routesHold reports whether h is among the handlers of routes.
func routesHold(routes caddyhttp.RouteList, h *Handler) bool {
	return eachHandler(routes, func(v *Handler) bool { return v == h })
}

// eachHandler calls visit with each handler of this module in routes, in
// the order they run (subroutes in place), until visit returns true, and
// reports whether it did.
func eachHandler(routes caddyhttp.RouteList, visit func(*Handler) bool) bool {
	for _, rt := range routes {
		for _, mh := range rt.Handlers {
			switch v := mh.(type) {
			case *Handler:
				if visit(v) {
					return true
				}
			case *caddyhttp.Subroute:
				if eachHandler(v.Routes, visit) {
					return true
				}
			}
		}
	}
	return false
}

// runsBefore reports whether handler first comes before handler then in
// the order routes run their handlers (subroutes in place).
func runsBefore(routes caddyhttp.RouteList, first, then *Handler) bool {
	seen, before := false, false
	eachHandler(routes, func(v *Handler) bool {
		if v == then {
			before = seen
			return true
		}
		seen = seen || v == first
		return false
	})
	return before
}

// serveReplay is ServeHTTP for a spooled delivery replayed through the
// server: the route that holds its spool claims, forwards and settles it
// (replaySpooled). Another handler passes it on when it runs before that
// route's handler in the server's routes (one of another scope that
// nested it, and already took the delivery when it arrived) or after it
// (nested in it: the route that holds the spool verified and claimed it);
// refused in either place, the replay would wait or be released, and be
// replayed again forever. Any other handler refuses it untouched. The
// delivery was verified when it arrived and is not verified again: a
// signed timestamp may be older than the tolerance by now.
func (h *Handler) serveReplay(w http.ResponseWriter, r *http.Request, rp *spoolReplay, next caddyhttp.Handler) error {
	if rp.reached {
		return next.ServeHTTP(w, r)
	}
	if h.spooler == nil || rp.sp != h.spooler.sp || rp.rec.Scope != h.Scope {
		if rp.srv != nil && runsBefore(rp.srv.Routes, h, rp.to) {
			return next.ServeHTTP(w, r)
		}
		writeBody(w, http.StatusMisdirectedRequest, "application/json", misroutedBody, 0)
		return nil
	}
	rp.reached = true
	d := &delivery{h: h, r: r, start: time.Now(), buf: getBodyBuf(), raw: rp.rec.Body, eventID: rp.rec.EventID}
	defer d.buf.release()
	rp.result = h.replaySpooled(w, rp.rec, next, d)
	spoolMetrics.tries.WithLabelValues(h.Scope, rp.result.Outcome.String()).Inc()
	level := zapcore.InfoLevel
	if rp.result.Outcome == spool.Unavailable {
		level = zapcore.DebugLevel // every few seconds while the store is down
	}
	if c := h.logger.Check(level, "spooled delivery"); c != nil {
		c.Write(zap.String("scope", h.Scope), zap.String("event_id", rp.rec.EventID),
			zap.Uint64("seq", rp.rec.Seq), zap.String("result", rp.result.Outcome.String()),
			zap.String("outcome", d.outcome), zap.Int("status", d.status),
			zap.Duration("waited", time.Since(rp.rec.Arrived)), zap.Duration("upstream", d.upstream))
	}
	return nil
}

var misroutedBody = []byte(`{"error":"spooled delivery of another route"}` + "\n")

// replaySpooled claims a spooled delivery's event with the live path's
// rules and forwards it when the claim is won (spool.ForClaim): a
// completed event is a duplicate, a live claim elsewhere or a held event
// waits, a store error pauses the spool. The body's own claim
// (dedupe_body) is taken next to the event's, as for a live delivery.
func (h *Handler) replaySpooled(w http.ResponseWriter, rec *spool.Record, next caddyhttp.Handler, d *delivery) spool.Result {
	ctx := d.r.Context()
	if h.completed != nil {
		if e, ok := h.completed.Has(h.Scope, rec.EventID); ok {
			d.outcome, d.status, d.cached = outcomeDuplicate, e.Status, true
			return spool.Result{Outcome: spool.Duplicate}
		}
	}
	c, err := h.claims.Claim(ctx, h.Scope, rec.EventID, "")
	if res, decided := spool.ForClaim(c, err); decided {
		if err == nil && c.Outcome == store.Duplicate {
			h.completed.Add(h.Scope, rec.EventID, c.Status)
		}
		d.outcome = res.Outcome.String()
		return res
	}
	d.attempt = c.Attempts
	refs := []claim.Ref{h.refOf(rec.EventID, c)}
	if rec.BodyKey != "" {
		bc, err := h.claims.Claim(ctx, h.bodyScope(), rec.BodyKey, "")
		if res, decided := spool.ForClaim(bc, err); decided {
			h.claims.Settle(ctx, refs, 0, claim.Release)
			d.outcome = res.Outcome.String()
			return res // a body delivered under another event ID settles as a duplicate
		}
		refs = append(refs, claim.RefOf(h.bodyScope(), rec.BodyKey, bc))
	}
	fr := h.withClaim(d.forwardable(), refs[0]) // complete_by upstream: Webhook-Claim
	_ = h.forward(w, fr, next, refs, d)         // answered into the replay's writer
	switch d.outcome {
	case outcomeCompleted, outcomeUncommitted:
		return spool.Result{Outcome: spool.Forwarded}
	case outcomeAmbiguous: // held (on_ambiguous hold): an operator decides
		return spool.Result{Outcome: spool.Wait, RetryAfter: time.Minute}
	case outcomePending: // complete_by upstream: the upstream's transaction still holds the claim
		return spool.Result{Outcome: spool.Wait, RetryAfter: time.Minute}
	}
	return spool.Result{Outcome: spool.Refused}
}
