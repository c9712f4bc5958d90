package claim

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Completing after the answer: once the upstream's 2xx status line has
// arrived the event is completed whatever happens next, so the provider's
// answer does not wait for the completion's commit. The caller answers as
// soon as the upstream's answer is written, and the claim is completed on
// another goroutine (batched with the other deliveries' claims and
// settles, see internal/store/batch.go). Until that commit the row reads as
// in flight; in this process a duplicate that finds it so waits for the
// completion instead of getting 409 (Keeper.Claim), whichever route of the
// scope it came through and also after a config reload (the completions
// being written are registered in the store's Completions, which outlive
// both); on another instance it gets 409 for those few milliseconds, as it
// does while the forward runs. A gateway killed in between leaves the row
// processing, as a gateway killed a moment before the answer would: its
// lease expires and on_ambiguous decides. Drain lets a stopping gateway
// wait for these completions, up to DrainFor.

// Completions registers the completions being written after their answers
// by every Keeper of one store: (scope, event ID) → a channel closed when
// the completion's first attempt has ended.
type Completions struct{ m sync.Map }

// NewCompletions returns an empty registry.
func NewCompletions() *Completions { return new(Completions) }

type key struct{ scope, id string }

// await waits, bounded by ctx, for a completion of (scope, id) being
// written, if there is one, and reports whether there was one (the caller
// then claims again and finds the event completed).
func (c *Completions) await(ctx context.Context, scope, id string) bool {
	v, ok := c.m.Load(key{scope, id})
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

// Await is the wait Claim does first: it waits, bounded by ctx, for a
// completion of (scope, id) that a Keeper of this store is writing after
// its answer, and reports whether there was one.
func (k *Keeper) Await(ctx context.Context, scope, id string) bool {
	return k.o.Completions.await(ctx, scope, id)
}

// CompleteAfterAnswer completes refs on a new goroutine (Settle, with its
// retries) and returns at once; a claim of any of them waits for it.
func (k *Keeper) CompleteAfterAnswer(parent context.Context, refs []Ref, status int) {
	done := make(chan struct{})
	for _, c := range refs {
		k.o.Completions.m.Store(key{c.Scope, c.ID}, done)
	}
	k.own.Add(1)
	k.busy.add()
	go func() {
		// own is released last: Drain and Settled return on it, and a
		// caller that then asks Active must find this one done.
		defer k.own.Done()
		defer k.busy.done()
		k.Settle(parent, refs, status, Complete)
		for _, c := range refs {
			k.o.Completions.m.CompareAndDelete(key{c.Scope, c.ID}, done)
		}
		close(done)
	}()
}

// Settled waits, without bound, for this Keeper's completions still being
// written after their answers (tests read the store after them).
func (k *Keeper) Settled() { k.own.Wait() }

// Drain waits up to DrainFor for this Keeper's completions still being
// written, so a stopping gateway does not exit under them.
func (k *Keeper) Drain() {
	done := make(chan struct{})
	go func() {
		k.own.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(k.o.DrainFor):
		k.o.Logger.Warn("completions still being written after their answers; they go on in the background",
			zap.String("scope", k.o.Scope))
	}
}
