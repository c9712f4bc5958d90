package caddymodule

// dedupe_body: the body-hash claim of presets without a signed ID
// (forward.go calls it).

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"

	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/claim"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// bodyScope is the scope of body-hash keys (dedupe_body): a scope of its
// own, so no event ID a sender chooses can collide with a body hash.
func (h *Handler) bodyScope() string { return h.Scope + "#body" }

func bodyKey(body []byte) string {
	sum := sha256.Sum256(body)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// claimBody claims the SHA-256 of the body next to the event ID (dedupe_body),
// so a replayed body under a fresh, unsigned ID is not forwarded again. When
// it returns false it has answered the delivery and released idClaim.
func (h *Handler) claimBody(w http.ResponseWriter, d *delivery, idClaim claim.Ref) (claim.Ref, bool) {
	ctx := d.r.Context()
	key, err := h.replayKeyOf(d, idClaim.ID)
	if err != nil {
		h.claims.Settle(ctx, []claim.Ref{idClaim}, 0, claim.Release)
		h.warnThrottled("reading the body back from its temporary file failed; answered 503, nothing forwarded",
			zap.String("scope", h.Scope), zap.Error(err))
		h.answer(w, d, ansBodyUnkept, say{})
		return claim.Ref{}, false
	}
	bc, err := h.claims.Claim(ctx, h.bodyScope(), key, "")
	if err == nil && bc.Outcome == store.Claimed {
		return claim.RefOf(h.bodyScope(), key, bc), true
	}
	h.claims.Settle(ctx, []claim.Ref{idClaim}, 0, claim.Release)
	switch {
	case err != nil:
		h.claimFailed(w, d, err)
	case bc.Outcome == store.Duplicate:
		h.logger.Warn(replayedMessage(h.dedupeBody, "forwarded"), zap.String("scope", h.Scope), zap.String("event_id", idClaim.ID))
		h.answer(w, d, ansBodyReplay, say{})
	case bc.Outcome == store.InFlight:
		h.answer(w, d, ansBodyInFlight, say{retryAfter: bc.RetryAfter})
	default:
		h.answer(w, d, ansHeld, say{})
	}
	return claim.Ref{}, false
}

// checkSameBody warns when a completed event ID comes again with a body that
// was never delivered: the provider changed the payload, or someone reuses
// IDs. The delivery is still answered as a duplicate.
func (h *Handler) checkSameBody(parent context.Context, id string, d *delivery) {
	ctx, cancel := context.WithTimeout(parent, storeTimeout)
	defer cancel()
	_, err := h.backend.Get(ctx, h.bodyScope(), d.bodyKey())
	if errors.Is(err, store.ErrNotFound) {
		h.bodyMismatch.Inc()
		h.logger.Warn("completed event id arrived with a different body; answered as a duplicate",
			zap.String("scope", h.Scope), zap.String("event_id", id))
	}
}
