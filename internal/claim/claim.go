// Package claim is the life of a synchronous forward's claims, the sync
// twin of internal/dispatch: take a claim (Keeper.Claim, after waiting for a
// completion this process is still writing), keep it while the upstream
// runs (Keeper.Keep), settle it by the forward's verdict (Keeper.Settle:
// complete, release or hold, retried in the background after a store
// error), complete it after the provider has its answer
// (Keeper.CompleteAfterAnswer, awaited by duplicates and drained by
// Keeper.Drain), and delete expired rows (Sweeper). Settings, logger and
// metrics come from Options; the package reads no state of the Caddy layer
// and runs, and is tested, without Caddy.
package claim

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/lease"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// Defaults of Options, applied by New when a field is zero.
const (
	// DefaultStoreTimeout bounds every store call (claim, settle, sweep).
	DefaultStoreTimeout = 5 * time.Second
	// DefaultRetryFor bounds how long a settle that failed on a store
	// error is retried in the background.
	DefaultRetryFor = 10 * time.Minute
	// DefaultDrainFor bounds how long Drain waits for completions still
	// being written after their answers; then they finish in the
	// background, as settles retried after a store error do.
	DefaultDrainFor = 5 * time.Second
)

// Op is how a claim is settled.
type Op int

const (
	// Complete: the upstream did the work; later deliveries are duplicates.
	Complete Op = iota + 1
	// Release: the next delivery is forwarded again.
	Release
	// Hold: the outcome is unknown (on_ambiguous hold); an operator decides.
	Hold
	// ReleaseAmbiguous: the outcome is unknown and the next delivery is
	// forwarded again (on_ambiguous reforward); the ending is counted on
	// the row (store.Event.Ambiguous), so the next claim knows the
	// upstream may already have run the event.
	ReleaseAmbiguous
)

// String is the op's name in log lines ("complete", "release", "hold").
func (o Op) String() string {
	switch o {
	case Complete:
		return "complete"
	case Hold:
		return "hold"
	case ReleaseAmbiguous:
		return "release_ambiguous"
	}
	return "release"
}

// Ref is one claim a delivery holds: the event ID's, and with dedupe_body
// the body hash's.
type Ref struct {
	Scope, ID, Token string
	// Attempt is the claim's Attempts (store.Claim): a settle retried after
	// an error whose outcome was unknown finds the row as it left it, and
	// no claim since (the count unchanged), when its first try committed.
	Attempt int
	// Resp is the upstream's answer stored when the claim completes
	// (replay response); nil stores none.
	Resp *store.Response
	// HoldReason is why the claim is held (Hold), stored for the admin API.
	HoldReason string
	// ByUpstream: the upstream completes this claim in its own transaction
	// (complete_by upstream): renewed without waiting for its row lock,
	// settled by Conclude (upstream.go).
	ByUpstream bool
}

// RefOf is the reference to claim c of (scope, id), as Settle and
// KeepAlive take it.
func RefOf(scope, id string, c store.Claim) Ref {
	return Ref{Scope: scope, ID: id, Token: c.Token, Attempt: c.Attempts}
}

// Timers are the store_duration_seconds series of the claim's store calls;
// nil fields are not observed.
type Timers struct {
	Claim, Complete, Release, Hold, Heartbeat prometheus.Observer
}

// Options configure a Keeper. Zero values mean the defaults above.
type Options struct {
	// Store records the claims. Required.
	Store store.Store
	// Completions registers the completions being written after their
	// answers, shared by every Keeper of one store in this process (one
	// registry per pooled store), so a duplicate through another route of
	// the scope, or through a reloaded config, waits for them. Default: a
	// registry of this Keeper's own.
	Completions *Completions
	// Lease is a claim's lease, renewed every third of it while the
	// forward runs. Required.
	Lease time.Duration
	// HoldOnExpiry: a claim whose lease expired is held by the next claim
	// instead of taken over (on_ambiguous hold).
	HoldOnExpiry bool
	// StoreTimeout, RetryFor and DrainFor: see the Default constants.
	StoreTimeout, RetryFor, DrainFor time.Duration
	// Background is the context of settles retried after a store error and
	// of completions written after their answers, detached from its
	// cancellation (they outlive a config reload on purpose: giving up
	// would let the event be forwarded again). Nil: a settle is not retried.
	Background context.Context
	// Logger receives lost leases and failed settles with scope and event
	// ID; never bodies or secrets. Default: zap.NewNop().
	Logger *zap.Logger
	// Timers are observed on each store call.
	Timers Timers
	// Scope names the route in the drain's log line.
	Scope string
}

// Keeper runs the claims of one route.
type Keeper struct {
	o Options
	// busy counts forwards and background settles still running: Cleanup
	// keeps the store open until they end.
	busy busy
	// own counts this Keeper's completions after answers, for Drain.
	own sync.WaitGroup
	// givingBack holds a slot per claim being given back, and
	// givingBackKeys their keys (giveback.go).
	givingBack     chan struct{}
	givingBackKeys sync.Map // key → struct{}
}

// New returns a Keeper with o's defaults applied. It does no I/O.
func New(o Options) *Keeper {
	if o.StoreTimeout == 0 {
		o.StoreTimeout = DefaultStoreTimeout
	}
	if o.RetryFor == 0 {
		o.RetryFor = DefaultRetryFor
	}
	if o.DrainFor == 0 {
		o.DrainFor = DefaultDrainFor
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Completions == nil {
		o.Completions = NewCompletions()
	}
	return &Keeper{o: o, givingBack: make(chan struct{}, maxGivingBack)}
}

// Claim claims key in scope with the Keeper's lease and expiry policy
// (fingerprint is the request's, Idempotency-Key; else ""), bounded by
// StoreTimeout, and times it. A completion of the same key that a Keeper of
// this store is writing after its answer is waited for first, so a
// duplicate sent once the provider has its answer finds the event
// completed, not in flight; a claim that finds the event in flight and then
// a completion under way waits for it and claims again.
func (k *Keeper) Claim(parent context.Context, scope, key, fingerprint string) (store.Claim, error) {
	p := store.ClaimParams{Scope: scope, EventID: key, Lease: k.o.Lease,
		HoldOnExpiry: k.o.HoldOnExpiry, Fingerprint: fingerprint, Token: store.NewToken()}
	ctx, cancel := context.WithTimeout(parent, k.o.StoreTimeout)
	defer cancel()
	t0 := time.Now()
	k.o.Completions.await(ctx, p.Scope, p.EventID)
	c, err := k.o.Store.Claim(ctx, p)
	if err == nil && c.Outcome == store.InFlight && k.o.Completions.await(ctx, p.Scope, p.EventID) {
		c, err = k.o.Store.Claim(ctx, p)
	}
	observe(k.o.Timers.Claim, t0)
	if err != nil && unknownOutcome(err) {
		k.giveBack(p.Scope, p.EventID, p.Token) // giveback.go
	}
	if err == nil && c.Outcome == store.InFlight {
		c.RetryAfter = k.givingBackRetry(p.Scope, p.EventID, c.RetryAfter)
	}
	return c, err
}

// KeepAlive renews the claims' leases every third of the lease, on timers
// (no goroutine waits while the forward runs), until the returned func is
// called or ctx ends. That func returns once every renewal under way has
// ended, so a settle after it never races a renewal; a claim whose lease
// was lost is logged then.
func (k *Keeper) KeepAlive(ctx context.Context, refs []Ref) (end func()) {
	if len(refs) == 1 { // the common forward: no slice of leases
		h := k.keepOne(ctx, refs[0])
		return func() { k.ended(refs[0], h) }
	}
	held := make([]*lease.Held, len(refs))
	for i, c := range refs {
		held[i] = k.keepOne(ctx, c)
	}
	return func() {
		for i, h := range held {
			k.ended(refs[i], h)
		}
	}
}

func (k *Keeper) keepOne(ctx context.Context, c Ref) *lease.Held {
	return lease.Start(ctx, lease.Renewal{
		Lease: k.o.Lease,
		Renew: func(ctx context.Context) error {
			defer observe(k.o.Timers.Heartbeat, time.Now())
			return k.renew(ctx, c)
		},
		Lost:   store.ErrLeaseLost,
		Logger: k.o.Logger, Name: "claim lease",
		Fields: []zap.Field{zap.String("scope", c.Scope), zap.String("event_id", c.ID)},
	})
}

// ended stops h and logs a lease it lost.
func (k *Keeper) ended(c Ref, h *lease.Held) {
	if h.Stop() != nil {
		k.o.Logger.Warn("claim lease lost while forwarding", zap.String("scope", c.Scope), zap.String("event_id", c.ID))
	}
}

// Settle completes, releases or holds every claim, with a context detached
// from the provider's connection; a store error is retried in the
// background (settleLater) when the Keeper has a Background context.
func (k *Keeper) Settle(parent context.Context, refs []Ref, status int, op Op) {
	for _, c := range refs {
		ctx := context.WithoutCancel(parent)
		err := k.settleOnce(ctx, c, status, op)
		if errors.Is(err, store.ErrConnectionLost) {
			// The store wrote it once more and found no row under the
			// token: settled by the first try, its answer lost, when the
			// row reads so with the claim's attempts.
			if settled, rerr := k.settledBefore(ctx, c, status, op); rerr == nil && settled {
				continue
			}
		}
		switch {
		case errors.Is(err, store.ErrLeaseLost):
			k.lost(c, op)
		case err != nil:
			k.o.Logger.Warn("settling event failed; retrying in the background",
				zap.String("scope", c.Scope), zap.String("event_id", c.ID), zap.Stringer("settle", op), zap.Error(err))
			if k.o.Background != nil {
				k.busy.add()
				go func() {
					defer k.busy.done()
					k.settleLater(c, status, op)
				}()
			}
		}
	}
}

func (k *Keeper) lost(c Ref, op Op) {
	k.o.Logger.Warn("claim lease lost before settling; another delivery may have been forwarded",
		zap.String("scope", c.Scope), zap.String("event_id", c.ID), zap.Stringer("settle", op))
}

// settleLater retries a settle the store failed (a PostgreSQL restart, a
// network cut), with backoff, until it succeeds, the claim is lost to
// another delivery, or RetryFor has passed. Without it an event whose
// upstream answered 2xx stays processing and, once its lease runs out, is
// forwarded again. Complete needs the claim's token, not a live lease, so it
// still succeeds after the lease expired as long as no other delivery has
// claimed the event.
func (k *Keeper) settleLater(c Ref, status int, op Op) {
	delay, start := 100*time.Millisecond, time.Now()
	ctx := context.WithoutCancel(k.o.Background)
	for time.Since(start) < k.o.RetryFor {
		time.Sleep(delay)
		err := k.settleOnce(ctx, c, status, op)
		switch {
		case err == nil:
			k.o.Logger.Info("settled event after a store error", zap.String("scope", c.Scope),
				zap.String("event_id", c.ID), zap.Stringer("settle", op))
			return
		case errors.Is(err, store.ErrLeaseLost):
			settled, rerr := k.settledBefore(ctx, c, status, op)
			switch {
			case rerr != nil:
				// The row could not be read (the store is failing again):
				// whether this settle committed is unknown; try again.
			case settled:
				k.o.Logger.Info("settled event after a store error (an earlier try had committed; its answer was lost)",
					zap.String("scope", c.Scope), zap.String("event_id", c.ID), zap.Stringer("settle", op))
				return
			default:
				k.lost(c, op)
				return
			}
		}
		// Every 100 ms while the outage is young, so the settle lands within
		// moments of the store's return, before a redelivery to another
		// instance can take the expired lease; then back off to 2 s.
		if time.Since(start) > 30*time.Second {
			delay = min(2*delay, 2*time.Second)
		}
	}
	k.o.Logger.Error("gave up settling event; its lease will expire", zap.String("scope", c.Scope),
		zap.String("event_id", c.ID), zap.Stringer("settle", op))
}

// settledBefore reports whether c's row reads as op leaves it and was
// claimed no more since c (its attempts are c's): a try of this settle
// that failed committed, and only its answer was lost. A row another
// delivery took over and settled alike has more attempts. An error: the
// row could not be read (a row that is gone is no error: not settled).
func (k *Keeper) settledBefore(parent context.Context, c Ref, status int, op Op) (bool, error) {
	ctx, cancel := context.WithTimeout(parent, k.o.StoreTimeout)
	defer cancel()
	ev, err := k.o.Store.Get(ctx, c.Scope, c.ID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	case c.Attempt == 0 || ev.Attempts != c.Attempt:
		return false, nil
	}
	switch op {
	case Complete:
		if c.Resp != nil {
			status = c.Resp.Status
		}
		return ev.State == store.StateCompleted && ev.Status == status, nil
	case Hold:
		return ev.State == store.StateHeld, nil
	}
	return ev.State == store.StateReleased, nil
}

// settleOnce completes, releases or holds one claim, bounded by
// StoreTimeout.
func (k *Keeper) settleOnce(parent context.Context, c Ref, status int, op Op) error {
	ctx, cancel := context.WithTimeout(parent, k.o.StoreTimeout)
	defer cancel()
	t0 := time.Now()
	switch op {
	case Complete:
		defer observe(k.o.Timers.Complete, t0)
		if c.Resp != nil {
			return k.o.Store.CompleteResponse(ctx, c.Scope, c.ID, c.Token, *c.Resp)
		}
		return k.o.Store.Complete(ctx, c.Scope, c.ID, c.Token, status)
	case Hold:
		defer observe(k.o.Timers.Hold, t0)
		return k.o.Store.Hold(ctx, c.Scope, c.ID, c.Token, c.HoldReason)
	case ReleaseAmbiguous:
		defer observe(k.o.Timers.Release, t0)
		return k.o.Store.ReleaseAmbiguous(ctx, c.Scope, c.ID, c.Token)
	}
	defer observe(k.o.Timers.Release, t0)
	return k.o.Store.Release(ctx, c.Scope, c.ID, c.Token)
}

// Track counts a forward that must settle before the store may close
// (Cleanup waits for it); the returned func ends it.
func (k *Keeper) Track() (done func()) {
	k.busy.add()
	return k.busy.done
}

// Active reports whether forwards or background settles are still running.
func (k *Keeper) Active() bool { return k.busy.active() }

// Wait waits for the forwards and background settles still running.
func (k *Keeper) Wait() { k.busy.wait() }

// busy counts forwards and background settles still running.
type busy struct {
	wg sync.WaitGroup
	n  atomic.Int64
}

func (t *busy) add()         { t.n.Add(1); t.wg.Add(1) }
func (t *busy) done()        { t.n.Add(-1); t.wg.Done() } // count first: wait's return implies !active
func (t *busy) active() bool { return t.n.Load() > 0 }
func (t *busy) wait()        { t.wg.Wait() }

// observe records the time since t0 on o, when there is one.
func observe(o prometheus.Observer, t0 time.Time) {
	if o != nil {
		o.Observe(time.Since(t0).Seconds())
	}
}
