package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/claim"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/dispatch"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// complete_by upstream (docs/exactly-once.md): the upstream completes the
// claim in the transaction of its work, by calling <table>_commit with the
// Webhook-Claim header, and every ending of the forward is settled by what
// the claim's row then says (claim.Keeper.Conclude), never by what the
// forward showed. The header is the route's own: any copy arriving from
// outside is removed on every route.

// claimHeader carries the claim value to the upstream.
const claimHeader = dispatch.ClaimHeader

// Values of CompleteBy.
const (
	completeByGateway  = "gateway"
	completeByUpstream = "upstream"
)

// The placeholders every route sets on the request's replacer, for
// reverse_proxy's header_up and for log formats.
const (
	placeholderScope   = "http.webhook_idempotency.scope"
	placeholderEventID = "http.webhook_idempotency.event_id"
	placeholderAttempt = "http.webhook_idempotency.attempt"
	placeholderClaim   = "http.webhook_idempotency.claim"
)

// byUpstream reports whether the route's claims are completed by the
// upstream.
func (h *Handler) byUpstream() bool { return h.CompleteBy == completeByUpstream }

// refOf is the reference to the route's claim c of event id, completed by
// the upstream under complete_by upstream.
func (h *Handler) refOf(id string, c store.Claim) claim.Ref {
	r := claim.RefOf(h.Scope, id, c)
	r.ByUpstream = h.byUpstream()
	return r
}

// checkCompleteBy checks complete_by: gateway or upstream, the latter only
// on storage postgres and never with on_ambiguous hold.
func (h *Handler) checkCompleteBy() error {
	switch h.CompleteBy {
	case completeByGateway:
		return nil
	case completeByUpstream:
	default:
		return fmt.Errorf("complete_by: want gateway or upstream, got %q", h.CompleteBy)
	}
	if h.Storage == nil || h.Storage.Backend != "postgres" {
		backend := "sqlite (the default)"
		if h.Storage != nil && h.Storage.Backend != "" {
			backend = h.Storage.Backend
		}
		return fmt.Errorf("complete_by upstream: needs storage postgres, got %s: the upstream commits the claim in "+
			"its own transaction, so the events table must live in the upstream's PostgreSQL database "+
			"(write storage postgres <dsn of that database>, or complete_by gateway)", backend)
	}
	if h.Provider == providerIdempotencyKey {
		return errors.New("complete_by upstream: applies to webhook routes, not provider idempotency_key " +
			"(whose stored answers decide a key's outcome); use complete_by gateway")
	}
	if h.OnAmbiguous == "hold" {
		return errors.New("on_ambiguous hold: does not apply with complete_by upstream, which settles every " +
			"ending of a forward by the database (nothing is ambiguous); remove on_ambiguous")
	}
	return nil
}

// stripClaimHeader removes a Webhook-Claim the request brought: only the
// gateway gives one, and the upstream trusts what it gets.
func stripClaimHeader(r *http.Request) {
	if _, ok := r.Header[claimHeader]; ok {
		r.Header.Del(claimHeader)
	}
}

// enter strips a sender's Webhook-Claim header and sets the route's
// placeholders, unless a webhook_idempotency of the same scope already
// took r: one at a site's top level and one in a handle block of the site
// both run since the directive sorts before handle, and the inner one
// would find the outer's claim in flight and answer 409 to every delivery.
// It then reports true, warns (throttled), and r is passed on as it is
// (the outer handler verified, claimed and settles it; under complete_by
// upstream r carries the outer's claim header).
//
// The mark is the scope's budget, a pointer no config can write (a map
// directive can write the scope placeholder, and so skip the handler), under
// a key of its own per scope (scope a, then b, then a again).
func (h *Handler) enter(r *http.Request) (nested bool) {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl != nil {
		if mark, ok := repl.Get(h.budget.enteredKey); ok && mark == any(h.budget) {
			h.warnThrottled("webhook_idempotency runs inside another of the same scope (one at the site's top level, one in a handle block?): "+
				"the inner one passes deliveries on; keep one", zap.String("scope", h.Scope))
			return true
		}
		repl.Set(h.budget.enteredKey, h.budget)
	}
	stripClaimHeader(r)
	setPlaceholders(r, h.scopeValue)
	return false
}

// setPlaceholders sets the route's placeholders on r's replacer: the
// scope (a string, Handler.scopeValue), and the others empty until known
// (an unset placeholder would reach a header_up as its own text).
func setPlaceholders(r *http.Request, scope any) {
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		repl.Set(placeholderScope, scope)
		repl.Set(placeholderEventID, "")
		repl.Set(placeholderAttempt, "")
		repl.Set(placeholderClaim, "")
	}
}

// setPlaceholder sets http.webhook_idempotency.<name> on r's replacer.
// Always a string: Caddy's expression (CEL) matchers convert only native
// values, and a placeholder of another type (a fmt.Stringer) fails the
// request there.
func setPlaceholder(r *http.Request, key, value string) {
	setPlaceholderValue(r, key, value)
}

// setPlaceholderValue is setPlaceholder with a value already in an
// interface, which must hold a string.
func setPlaceholderValue(r *http.Request, key string, value any) {
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		repl.Set(key, value)
	}
}

// withClaim returns r with the claim's Webhook-Claim header on a copy of
// its headers (the request Caddy logs keeps its own), and the claim
// placeholder set; r itself when the route completes by the gateway.
func (h *Handler) withClaim(r *http.Request, c claim.Ref) *http.Request {
	if !c.ByUpstream {
		return r
	}
	value := store.ClaimValue(c.Scope, c.ID, c.Token)
	fr := r.WithContext(r.Context())
	fr.Header = r.Header.Clone()
	fr.Header.Set(claimHeader, value)
	setPlaceholder(r, placeholderClaim, value)
	return fr
}

// noteClaim sets the attempt placeholder of a won claim.
func noteClaim(r *http.Request, attempts int) {
	setPlaceholder(r, placeholderAttempt, strconv.Itoa(attempts))
}

// conclude settles an upstream-completed forward by the claim's truth.
func (h *Handler) conclude(ctx context.Context, claims []claim.Ref, end forwardEnd, tee *capture, d *delivery) {
	if tee != nil && end.status >= 200 && end.status <= 299 {
		claims[0].Resp = h.storedResponse(tee, end, d)
	}
	truth, err := h.claims.Conclude(ctx, claims, end.status, claim.DefaultCommitWait)
	switch {
	case err != nil:
		// Left to its lease, as after a crash: the next claim reads the row.
		d.outcome, d.reason = outcomePending, "the claim's truth could not be read (store error)"
	case truth == store.TruthCommitted:
		d.outcome = outcomeCompleted
		h.remember(claims[0], end.status)
	case truth == store.TruthCompletedUncommitted:
		d.outcome = outcomeUncommitted
		h.remember(claims[0], end.status)
		if h.warnedUncommitted.CompareAndSwap(false, true) {
			h.logger.Warn("upstream answered 2xx without committing the claim (complete_by upstream): it does not "+
				"call the commit function with the Webhook-Claim header, or uses another database; settled as completed, "+
				"but this route's lost answers are not protected (counted as outcome completed_uncommitted)",
				zap.String("scope", h.Scope), zap.String("event_id", claims[0].ID), zap.Int("status", end.status))
		}
	case truth == store.TruthPending:
		d.outcome, d.reason = outcomePending, "the upstream's transaction still held the claim"
	case truth == store.TruthLost:
		d.outcome, d.reason = outcomeReleased, "the claim was no longer this delivery's"
	default:
		d.outcome = outcomeReleased
		if end.verdict() == verdictAmbiguous {
			d.reason = end.describe()
		}
	}
}
