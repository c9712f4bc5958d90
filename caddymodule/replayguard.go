package caddymodule

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/sjson"
	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/claim"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// What stops a captured delivery from being accepted again, beyond the
// event ID's claim (which retention ends):
//
//   - a signed timestamp within the tolerance (the signature package);
//   - a single-use value the signature covers, for schemes whose signature
//     does not cover the event data (Mailgun's signature.token,
//     signature.Preset.SingleUse): remembered in scope "<scope>#once" for
//     twice the tolerance, and refused with another body (spendSingleUse);
//   - a replay record, for every preset without a signed timestamp: claimed
//     in scope "<scope>#body" next to the event ID and kept for
//     replay_window, longer than the event's row. Under dedupe_body it is the
//     body's hash (the same body under any event ID is a replay); otherwise
//     the hash of the event ID and the body (the same delivery again),
//     unless the ID cannot tell deliveries apart (recordOnSignedContent). "Body"
//     is what the signature covers of it (signature.Preset.Covered).

// onceScope is the scope of single-use values: a scope of its own, so no
// event ID a sender chooses can collide with one.
func (h *Handler) onceScope() string { return h.Scope + "#once" }

// onceKeep is how long a single-use value is remembered: its timestamp is
// accepted from tolerance before the clock to tolerance after it, so a
// value is valid for at most twice the tolerance; a minute more covers the
// sweep's clock against the verifier's.
func (h *Handler) onceKeep() time.Duration {
	return 2*h.tolerance() + time.Minute
}

// tolerance is the route's timestamp tolerance: the configured one or the
// preset's.
func (h *Handler) tolerance() time.Duration {
	if h.Tolerance > 0 {
		return time.Duration(h.Tolerance)
	}
	return h.preset.DefaultTolerance
}

// provisionSingleUse builds the reader of the preset's single-use value.
func (h *Handler) provisionSingleUse() error {
	if h.preset.SingleUse == "" {
		return nil
	}
	kind, name, _ := strings.Cut(h.preset.SingleUse, " ")
	if i := strings.LastIndexByte(name, '.'); kind == "json" && i > 0 {
		h.singleUseBlock = name[:i]
	}
	src, err := eventid.ParseSource(kind, name)
	if err != nil {
		return fmt.Errorf("provider %s: single-use value: %w", h.Provider, err)
	}
	h.singleUse, err = eventid.New([][]eventid.Source{{src}})
	return err
}

// spendSingleUse records the verified delivery's single-use value with the
// hash of its body as the claim's fingerprint, and completes it at once: the
// value is spent whatever the upstream answers (a provider that retries signs
// again, with a new value). The same value with the same body again (the
// provider resending the very delivery) passes on to the event ID's claim;
// with another body it is a signature pasted onto other data: refused 400.
// The fingerprint leaves out the object carrying the value
// (singleUseFingerprint). It reports false when it has answered the
// delivery.
func (h *Handler) spendSingleUse(w http.ResponseWriter, d *delivery) bool {
	if h.singleUse == nil {
		return true
	}
	value, err := h.singleUse.Extract(d.signed, d.r.Header)
	if err != nil {
		// The verifier read it: only a value the extractor refuses (too
		// long, not text) gets here.
		h.answer(w, d, ansBadRequest, say{reason: "signature token is unusable: " + eventIDReason(err)})
		return false
	}
	ctx := d.r.Context()
	fp := h.singleUseFingerprint(d.signed)
	cl, err := h.claims.Claim(ctx, h.onceScope(), value, fp)
	if err != nil {
		if h.providerGone(d, false) {
			return false
		}
		h.warnThrottled("recording the signature token failed; answered 503, nothing forwarded",
			zap.String("scope", h.Scope), zap.Error(err))
		h.answer(w, d, ansStoreUnavailable, say{})
		return false
	}
	switch {
	case cl.Outcome == store.Claimed:
		h.claims.Settle(ctx, []claim.Ref{claim.RefOf(h.onceScope(), value, cl)}, http.StatusOK, claim.Complete)
		return true
	case cl.Fingerprint == fp:
		return true
	}
	h.logger.Warn("signature token used before with another body; refused, nothing forwarded",
		zap.String("scope", h.Scope))
	h.answer(w, d, ansTokenReused, say{})
	return false
}

// singleUseFingerprint hashes what the single-use value must come with:
// the body without the object that carries the value (Mailgun's
// "signature": a provider that signs a retry again, with a new timestamp,
// sends the same event data), else the whole body.
func (h *Handler) singleUseFingerprint(body []byte) string {
	if h.singleUseBlock != "" {
		if b, err := sjson.DeleteBytes(body, h.singleUseBlock); err == nil {
			return bodyKey(b)
		}
	}
	return bodyKey(body)
}

// replayKey is the key of the delivery's replay record in bodyScope: the
// body's hash under dedupe_body, else the hash of the event ID and the body.
// body is what the signature covers (delivery.covered).
func (h *Handler) replayKey(id string, body []byte) string {
	if h.dedupeBody || h.recordOnBody {
		return bodyKey(body)
	}
	return deliveryKey(id, body)
}

// recordOnSignedContent reports a route whose replay record is of the signed
// content alone, whatever dedupe_body says: the event ID cannot tell two
// deliveries apart where the signature covers a canonical form of the body.
//   - An ID read from the form of a scheme that signs the form's parameters
//     (twilio, plivo, mandrill, braintree) changes when a capture is split
//     at other boundaries (an adversarial trial forwarded a Mandrill
//     capture 5 times under dedupe_body off).
//   - A preset whose default ID is among the fields it signs (adyen, sns,
//     appstore): the signed content is at least as fine as the ID, and the
//     ID has spellings the signature cannot see (Adyen's pspReference
//     written 8.835511210681234e15, or fields re-split at a ':' of the
//     signed text; a verification trial ran one Adyen item 9 times).
func (h *Handler) recordOnSignedContent(parts [][]eventid.Source) bool {
	if h.preset.CoversBytes() {
		return false
	}
	if !h.preset.DedupeBody {
		return true
	}
	for _, alts := range parts {
		for _, s := range alts {
			if s.Kind == eventid.Form || s.Kind == eventid.FormSHA256 {
				return true
			}
		}
	}
	return false
}

// coveredOf is what the signature covers of a verified body: the
// preset's Covered, and the configured url of a scheme that signs it
// (Twilio's, Plivo's, ...), so that one set of parameters posted to two
// URLs of one scope, two signed requests (a caller pressing 1 at two
// menus), are two deliveries.
func (h *Handler) coveredOf(body []byte, hdr http.Header) []byte {
	c := h.preset.Covered(body, hdr)
	if !h.preset.NeedsURL || h.signedURL == "" {
		return c
	}
	return append([]byte("url:"+h.signedURL+"\n"), c...)
}

// deliveryKey hashes an event ID and a body, length-prefixed so that no
// other pair hashes the same bytes.
func deliveryKey(id string, body []byte) string {
	hs := sha256.New()
	writeIDPrefix(hs, id)
	hs.Write(body)
	return "delivery-sha256:" + hex.EncodeToString(hs.Sum(nil))
}

// replayKeyOf is replayKey of a delivery's body, in memory or spilled
// (read back from its file: the error wraps errSpillDisk).
func (h *Handler) replayKeyOf(d *delivery, id string) (string, error) {
	f := d.signedFile()
	switch {
	case f == nil:
		return h.replayKey(id, d.covered()), nil
	case h.dedupeBody:
		return f.key(), nil
	}
	return f.deliveryKey(id)
}

// claimItemRecord claims the replay record of a batch item forwarded on
// its own (batch split): the item's ID and its request body. It returns
// the record's claim, or, having released the item's claim, the item's
// outcome ("duplicate" for a replay) and Retry-After.
func (h *Handler) claimItemRecord(ctx context.Context, it signature.BatchItem, item claim.Ref) (claim.Ref, string, time.Duration) {
	key := h.replayKey(it.ID, h.coveredOf(it.Body, nil))
	rc, err := h.claims.Claim(ctx, h.bodyScope(), key, "")
	if err == nil && rc.Outcome == store.Claimed {
		return claim.RefOf(h.bodyScope(), key, rc), "", 0
	}
	h.claims.Settle(ctx, []claim.Ref{item}, 0, claim.Release)
	switch {
	case err != nil && ctx.Err() != nil:
		return claim.Ref{}, outcomeProviderGone, 0 // not a store failure (see providerGone)
	case err != nil:
		h.warnThrottled("claiming batch item's replay record failed; nothing forwarded",
			zap.String("scope", h.Scope), zap.String("event_id", it.ID), zap.Error(err))
		return claim.Ref{}, outcomeStoreError, unavailableRetryAfter
	case rc.Outcome == store.Duplicate:
		h.logger.Warn(replayedMessage(h.dedupeBody, "forwarded"), zap.String("scope", h.Scope), zap.String("event_id", it.ID))
		return claim.Ref{}, outcomeDuplicate, 0
	case rc.Outcome == store.InFlight:
		return claim.Ref{}, outcomeInFlight, rc.RetryAfter
	}
	return claim.Ref{}, outcomeHeld, unavailableRetryAfter
}

// replayedMessage is the warning of a delivery its replay record stopped
// (not: "forwarded" or "queued").
func replayedMessage(dedupeBody bool, not string) string {
	if dedupeBody {
		return "body already delivered under another event id; answered as a duplicate, not " + not + " (dedupe_body)"
	}
	return "delivery replayed after its event's retention (replay record kept for replay_window); answered as a duplicate, not " + not
}

// keepsReplayRecord reports whether a route claims a replay record: under
// dedupe_body, and for every preset without a signed timestamp.
func (h *Handler) keepsReplayRecord() bool {
	return h.dedupeBody || (h.Provider != providerIdempotencyKey && h.preset.DefaultTolerance == 0)
}
