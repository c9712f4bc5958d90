package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/claim"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/sendonce"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// Batches: deliveries that carry several events, each with its own ID
// (signature.Batch). Under batch set the delivery is one claim keyed on the
// set of its item IDs (signature.SetKey) and goes through the ordinary
// path; under batch split each item not yet completed is forwarded alone,
// under its own claim, and the provider gets 2xx only when every item is
// completed.

// checkBatch checks the batch field against the preset (part of
// checkConfig): a policy only for a provider that batches, never with the
// route's own event_id, split not in async mode.
func (h *Handler) checkBatch(preset signature.Preset) error {
	b := preset.Batch
	switch {
	case h.Batch != "" && h.Batch != string(signature.BatchSet) && h.Batch != string(signature.BatchSplit):
		return fmt.Errorf("batch: want set or split, got %q", h.Batch)
	case h.Batch != "" && b == nil:
		return fmt.Errorf("batch: provider %s sends one event per delivery", h.Provider)
	case b == nil:
		return nil
	case len(h.EventID) > 0 && h.Batch != "":
		return errors.New("batch: keys on the provider's item IDs; it cannot be combined with event_id")
	}
	policy := b.Policy
	if h.Batch != "" {
		policy = signature.BatchPolicy(h.Batch)
	}
	if policy == signature.BatchSet && b.ItemsSigned {
		return fmt.Errorf("batch: set is not available for %s, which signs each item: items of captured deliveries "+
			"combine into a new set that verifies and would be forwarded again; remove batch set (split claims each item)", h.Provider)
	}
	if policy == signature.BatchSplit && h.Mode == "async" && len(h.EventID) == 0 {
		if b.ItemsSigned {
			return fmt.Errorf("batch: mode async is not available for %s, which signs each item: its items are claimed one by one "+
				"(batch split), in mode sync only; remove mode async", h.Provider)
		}
		return errors.New("batch: split is not available in mode async; use batch set")
	}
	return nil
}

// provisionBatch resolves the route's batch policy (checkBatch has
// accepted it). A route with its own event_id keys each delivery as
// configured, unbatched.
func (h *Handler) provisionBatch() {
	b := h.preset.Batch
	if b == nil || len(h.EventID) > 0 {
		h.batch = nil
		return
	}
	bb := *b
	if h.Batch != "" {
		bb.Policy = signature.BatchPolicy(h.Batch)
	}
	h.batch = &bb
}

// batchKey is the event ID of a batch under batch set: the key of the set
// of its item IDs. A body without a usable items array wraps
// eventid.ErrMissing.
func (h *Handler) batchKey(body []byte) (string, error) {
	items, err := h.batchItems(body)
	if err != nil {
		return "", err
	}
	return signature.SetKey(items), nil
}

// batchItems splits a batch body. Its items and their IDs are read as a
// top-level event ID is (signature.Batch.Split): an items array or item ID
// named twice wraps eventid.ErrAmbiguous, refused whatever on_missing_id
// says; other errors wrap eventid.ErrMissing. Errors name the item's
// position, never its content.
func (h *Handler) batchItems(body []byte) ([]signature.BatchItem, error) {
	items, err := h.batch.Split(body)
	switch {
	case errors.Is(err, eventid.ErrAmbiguous):
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("%w: %w", eventid.ErrMissing, err)
	}
	return items, nil
}

// batched reports whether a delivery is keyed as a batch: the route has a
// batch policy and the body has the items array (or names it twice, which
// batchItems refuses), or the preset has no event ID of its own to fall
// back on (Okta's eventId names the whole delivery; a body without
// data.events is keyed on it).
func (h *Handler) batched(body []byte) bool {
	if h.batch == nil {
		return false
	}
	return len(h.preset.EventID) == 0 || h.batch.Present(body)
}

// itemVerifier returns the route's verifier when its provider signs each
// item of a batch (signature.ItemVerifier) and the delivery is split: its
// items are then verified one by one (serveSplit), so one forged item is
// refused alone. Otherwise nil: the whole delivery is verified.
func (h *Handler) itemVerifier(body []byte) signature.ItemVerifier {
	iv, ok := h.verifier.(signature.ItemVerifier)
	if !ok || h.learned != nil || !h.splitting(body) {
		return nil
	}
	return iv
}

// verifyDelivery verifies a delivery before it is claimed: whole (verify),
// or, for a split delivery whose provider signs each item, only what
// covers the whole delivery (serveSplit checks each item).
func (h *Handler) verifyDelivery(ctx context.Context, body []byte, hdr http.Header) error {
	if iv := h.itemVerifier(body); iv != nil {
		return iv.VerifyDelivery(body, hdr)
	}
	return h.verify(ctx, body, hdr)
}

// splitting reports whether the delivery is split into its items.
func (h *Handler) splitting(body []byte) bool {
	return h.batch != nil && h.batch.Policy == signature.BatchSplit && h.batched(body)
}

// splitMode is sync mode for a route under batch split: a delivery the
// intake split (delivery.split) has each item not yet completed forwarded
// as its own request (the delivery with its items array reduced to that
// item; Content-Encoding dropped, as the item is built from the decoded
// body), one after the other, each under its own claim with the ordinary
// lease, heartbeat and settle (forward); other deliveries go through sync
// mode. The provider's answer:
//
//   - every item completed now or before: 200 {"received":true,"items":n,
//     "forwarded":k,"duplicates":m} (or the duplicate answer when k is 0);
//   - an item the store could not claim, or held: 503 with Retry-After;
//   - an item in flight in another delivery: 409 with Retry-After;
//   - an item the upstream did not accept: 502.
//
// Items completed before a failure stay completed, so the provider's retry
// forwards only the rest. The upstream's own answers are not relayed.
type splitMode struct{ sync syncMode }

func (m splitMode) serve(w http.ResponseWriter, next caddyhttp.Handler, d *delivery) error {
	if !d.split {
		return m.sync.serve(w, next, d)
	}
	h, items, refused := m.sync.h, d.items, d.refusedItems
	var (
		forwarded, dups, failed int
		worst                   answerID // the answer when an item failed
		retry                   time.Duration
	)
	// 503 outranks 409 outranks 502: the answer names the reason the
	// provider must wait for.
	rank := map[answerID]int{ansItemsFailed: 1, ansItemsInFlight: 2, ansItemsUnavailable: 3}
	for i, it := range items {
		outcome, status, after := h.forwardItem(d.r, it, i, len(items), next)
		if c := h.logger.Check(zapcore.DebugLevel, "batch item"); c != nil {
			c.Write(zap.String("scope", h.Scope), zap.String("event_id", it.ID), zap.String("outcome", outcome), zap.Int("status", status))
		}
		switch outcome {
		case outcomeCompleted:
			forwarded++
		case outcomeDuplicate:
			dups++
		default:
			failed++
			a := ansItemsFailed
			switch outcome {
			case outcomeStoreError, outcomeHeld:
				a = ansItemsUnavailable
			case outcomeInFlight:
				a = ansItemsInFlight
			}
			if rank[a] > rank[worst] {
				worst = a
			}
			retry = max(retry, after)
		}
	}
	// The delivery's log line has no event ID: each item's debug line has
	// its own.
	switch {
	case refused > 0:
		// Items that failed their own signature were neither claimed nor
		// forwarded; the provider's retry of the delivery finds the
		// others completed.
		d.reason = fmt.Sprintf("%d of %d items failed verification", refused, refused+len(items))
		if failed > 0 {
			d.reason += fmt.Sprintf("; %d not completed", failed)
		}
		h.answer(w, d, ansItemsRefused, say{reason: d.reason + "; the other items are forwarded once"})
		d.status = h.RefuseStatus
	case failed > 0 && h.providerGone(d, false):
	case failed > 0:
		d.reason = fmt.Sprintf("%d of %d items not completed", failed, len(items))
		h.answer(w, d, worst, say{reason: d.reason + "; items already completed are skipped on retry", retryAfter: retry})
		d.status = answers[worst].status
	case forwarded == 0:
		d.status = http.StatusOK
		if lit := h.preset.Delivery.Answer.Body; lit != "" {
			h.answer(w, d, ansAcceptedDuplicate, say{body: []byte(lit)})
			return nil
		}
		h.answer(w, d, ansDuplicate, say{})
	default:
		d.status = http.StatusOK
		if lit := h.preset.Delivery.Answer.Body; lit != "" {
			h.answer(w, d, ansAccepted, say{body: []byte(lit)})
			return nil
		}
		b, _ := json.Marshal(map[string]any{"received": true, "items": len(items), "forwarded": forwarded, "duplicates": dups})
		h.answer(w, d, ansItemsDone, say{body: append(b, '\n')})
	}
	return nil
}

// batchItemsChecked is batchItems for a split delivery: when the
// provider signs each item (itemVerifier), an item failing its signature
// is left out and counted in refused.
func (h *Handler) batchItemsChecked(body []byte) ([]signature.BatchItem, int, error) {
	iv := h.itemVerifier(body)
	if iv == nil {
		items, err := h.batchItems(body)
		return items, 0, err
	}
	items, refused, err := h.batch.SplitChecked(body, iv.VerifyItem)
	switch {
	case errors.Is(err, eventid.ErrAmbiguous):
		return nil, 0, err
	case err != nil:
		return nil, 0, fmt.Errorf("%w: %w", eventid.ErrMissing, err)
	}
	return items, refused, nil
}

// forwardItem claims one batch item and, when claimed, forwards it alone
// and settles its claim. It returns the item's outcome, the upstream's
// status and, for an item in flight, the lease left.
func (h *Handler) forwardItem(r *http.Request, it signature.BatchItem, i, n int, next caddyhttp.Handler) (string, int, time.Duration) {
	if h.completed != nil {
		if e, ok := h.completed.Has(h.Scope, it.ID); ok {
			h.cacheHit.Inc()
			return outcomeDuplicate, e.Status, 0
		}
		h.cacheMiss.Inc()
	}
	cl, err := h.claims.Claim(r.Context(), h.Scope, it.ID, "")
	if err != nil {
		if r.Context().Err() != nil {
			return outcomeProviderGone, 0, 0 // not a store failure (see providerGone)
		}
		h.warnThrottled("claiming batch item failed; nothing forwarded",
			zap.String("scope", h.Scope), zap.String("event_id", it.ID), zap.Error(err))
		return outcomeStoreError, 0, unavailableRetryAfter
	}
	switch cl.Outcome {
	case store.Duplicate:
		h.completed.Add(h.Scope, it.ID, cl.Status)
		return outcomeDuplicate, cl.Status, 0
	case store.InFlight:
		return outcomeInFlight, 0, cl.RetryAfter
	case store.Held:
		h.noteHeldNow(it.ID, cl)
		return outcomeHeld, 0, unavailableRetryAfter
	case store.Claimed:
		h.noteReforward(it.ID, cl)
	default:
		return outcomeStoreError, 0, unavailableRetryAfter
	}
	refs := []claim.Ref{h.refOf(it.ID, cl)}
	if h.replayRecord { // replayguard.go
		rec, outcome, after := h.claimItemRecord(r.Context(), it, refs[0])
		if outcome != "" {
			return outcome, 0, after
		}
		refs = append(refs, rec)
	}
	ir := r.Clone(r.Context())
	sendonce.SetBody(ir, it.Body)
	ir.Header.Del("Content-Length")
	ir.Header.Del("Content-Encoding")
	// Which item of which batch, for the upstream's logs.
	ir.Header.Set("Webhook-Batch-Item", strconv.Itoa(i+1)+"/"+strconv.Itoa(n))
	cw := &itemWriter{header: http.Header{}}
	id := delivery{h: h, r: ir, start: time.Now(), eventID: it.ID, attempt: cl.Attempts, ambiguousBefore: cl.Ambiguous}
	_ = h.forward(cw, h.withClaim(ir, refs[0]), next, refs, &id)
	return id.outcome, id.status, 0
}

// itemWriter takes the upstream's answer to one batch item: the
// provider gets the gateway's summary instead.
type itemWriter struct {
	header http.Header
	status int
}

func (w *itemWriter) Header() http.Header { return w.header }

func (w *itemWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *itemWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return len(b), nil
}
