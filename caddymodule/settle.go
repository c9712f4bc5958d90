package caddymodule

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Completing after the answer: once the upstream's 2xx status line has
// arrived the event is completed whatever happens next (DESIGN.md, step 6),
// so the provider's answer does not wait for the completion's commit. The
// handler returns as soon as the upstream's answer is written, and the
// claim is completed on another goroutine (batched with the other
// deliveries' claims and settles, see internal/store/batch.go). Until that
// commit the row reads as in flight; in this process a duplicate that finds
// it so waits for the completion instead of getting 409 (claim), whichever
// route of the scope it came through and also after a config reload (the
// completions being written are registered on the pooled store, which
// outlives both); on another instance it gets 409 for those few
// milliseconds, as it does while the forward runs. A gateway killed in
// between leaves the row processing, as a gateway killed a moment before
// the answer would: its lease expires and on_ambiguous decides. Caddy's
// stop and config reloads wait for these completions (Cleanup, up to
// settleDrainFor).

// settleDrainFor bounds how long Cleanup waits for completions still being
// written after their answers; then they finish in the background, as
// settles retried after a store error do.
const settleDrainFor = 5 * time.Second

// pendingSettles are the completions this handler is writing after their
// answers. m is the registry of the store's backend (backend.completing),
// shared by every handler of that store in this process: (scope, event ID)
// → a channel closed when the completion's first attempt has ended. wg
// counts this handler's own, for Cleanup's drain.
type pendingSettles struct {
	m  *sync.Map // eventKey → chan struct{}; nil until the store is open
	wg sync.WaitGroup
}

type eventKey struct{ scope, id string }

// completeAfterAnswer completes claims on a new goroutine (settle, with its
// retries) and returns at once; a duplicate of any of them waits for it
// (awaitCompletion).
func (h *Handler) completeAfterAnswer(parent context.Context, claims []claimRef, status int) {
	done := make(chan struct{})
	for _, c := range claims {
		h.pending.m.Store(eventKey{c.scope, c.id}, done)
	}
	h.pending.wg.Add(1)
	h.busy.add()
	go func() {
		defer h.busy.done()
		defer h.pending.wg.Done()
		h.settle(parent, claims, status, "complete")
		for _, c := range claims {
			h.pending.m.CompareAndDelete(eventKey{c.scope, c.id}, done)
		}
		close(done)
	}()
}

// awaitCompletion waits, bounded by ctx, for a completion of (scope, id)
// that a handler of this store is writing after its answer, if there is
// one, and reports whether there was one (the caller then claims again and
// finds the event completed).
func (h *Handler) awaitCompletion(ctx context.Context, scope, id string) bool {
	if h.pending == nil || h.pending.m == nil {
		return false
	}
	v, ok := h.pending.m.Load(eventKey{scope, id})
	if !ok {
		return false
	}
	select {
	case <-v.(chan struct{}):
		return true
	case <-ctx.Done():
		return false
	}
}

// drainCompletions waits up to settleDrainFor for the completions still
// being written, so a stopping Caddy does not exit under them.
func (h *Handler) drainCompletions() {
	if h.pending == nil {
		return
	}
	done := make(chan struct{})
	go func() {
		h.pending.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(settleDrainFor):
		h.logger.Warn("completions still being written after their answers; they go on in the background",
			zap.String("scope", h.Scope))
	}
}
