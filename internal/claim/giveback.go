package claim

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// A claim whose answer never came (the statement's connection stalled: a
// load balancer or relay that held the bytes, a network that queued them)
// may still commit after the delivery was answered 503, when the network
// lets the statement through: a processing row under a token nobody holds.
// Every delivery of the event would be answered 409 until its lease ran
// out, and then forwarded as if a forward had ended with no known outcome
// (counted ambiguous, held at once under on_ambiguous hold). The Keeper
// draws a claim's token itself, and gives back a claim whose outcome it does
// not know by that token, in the background, for as long as such a late
// commit could still block the event.

// maxGivingBack bounds the claims a Keeper gives back at once; past it (a
// long outage under load) a claim is not given back: its late commit, if
// any, blocks the event for a lease, as before.
const maxGivingBack = 256

// unknownOutcome reports whether a claim's error leaves open that it
// committed: its statement may have been sent and not answered (the
// connection lost, the store timeout passed, or the provider hung up: the
// cases store.Rules gives a claim back for once, in line).
func unknownOutcome(err error) bool {
	return errors.Is(err, store.ErrConnectionLost) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, context.Canceled)
}

// giveBack releases the claim of id under token if it is, or becomes, a
// row: tries at once and then with growing waits (up to 2s) for a lease
// and a store timeout from now, since a commit later than that finds the
// event claimable again anyway. It stops at the first release that finds
// the row. It does not keep Cleanup waiting: a claim it has not found by
// then is left as it would have been without it.
func (k *Keeper) giveBack(scope, id, token string) {
	select {
	case k.givingBack <- struct{}{}:
	default:
		k.o.Logger.Debug("not giving back a claim whose answer was lost: too many already",
			zap.String("scope", scope), zap.String("event_id", id))
		return
	}
	k.givingBackKeys.Store(key{scope, id}, struct{}{})
	go func() {
		defer func() {
			k.givingBackKeys.Delete(key{scope, id})
			<-k.givingBack
		}()
		deadline := time.Now().Add(k.o.Lease + k.o.StoreTimeout)
		for delay := 250 * time.Millisecond; ; delay = min(2*delay, giveBackWait) {
			ctx, cancel := context.WithTimeout(context.Background(), k.o.StoreTimeout)
			err := k.o.Store.Release(ctx, scope, id, token)
			cancel()
			if err == nil {
				k.o.Logger.Info("gave back a claim that committed after its delivery was answered 503",
					zap.String("scope", scope), zap.String("event_id", id))
				return
			}
			if time.Now().Add(delay).After(deadline) {
				return
			}
			time.Sleep(delay)
		}
	}()
}

// giveBackWait is the longest a claim being given back may take to be
// released once it has committed: the give-back's longest wait between
// tries.
const giveBackWait = 2 * time.Second

// givingBackRetry is the wait to announce for an event found in flight:
// left as the store said (the lease left) unless this Keeper is giving
// back a claim of that event, which is then likely the claim in flight,
// committed late under a token nobody holds, and released within
// giveBackWait. A spooled delivery retried after the whole lease, or a
// provider told so, would wait a lease for a claim about to be gone.
func (k *Keeper) givingBackRetry(scope, id string, left time.Duration) time.Duration {
	if _, ok := k.givingBackKeys.Load(key{scope, id}); ok {
		return min(left, giveBackWait)
	}
	return left
}
