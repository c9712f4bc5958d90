package claim_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/claim"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/sqlite"
)

// testBundle is what setup builds: a real SQLite store, with faults a test
// may inject around it (faulty), and a Keeper on it.
type testBundle struct {
	store  *faulty
	keeper *claim.Keeper
}

// setup opens a fresh SQLite store in the test's directory and a Keeper on
// it with opts (Store and, unless set, Lease filled in).
func setup(t *testing.T, opts claim.Options) *testBundle {
	t.Helper()
	s, err := sqlite.New(t.Context(), sqlite.Options{Path: filepath.Join(t.TempDir(), "events.db")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	f := &faulty{Store: s, release: make(chan struct{})}
	close(f.release) // not blocking unless a test says so
	opts.Store = f
	if opts.Lease == 0 {
		opts.Lease = time.Minute
	}
	return &testBundle{store: f, keeper: claim.New(opts)}
}

// faulty is the real store with faults injected: Complete fails the first
// failCompletes times, and waits for release.
type faulty struct {
	store.Store
	failCompletes atomic.Int32
	completes     atomic.Int32
	release       chan struct{}
	// loseAnswers: that many completions commit, then fail as if their
	// answer was lost on the way back.
	loseAnswers atomic.Int32
	// retryGate, when set, holds every completion after the first.
	retryGate chan struct{}
	// failGets: that many reads of a row fail.
	failGets atomic.Int32
	// lostConnection: a lost answer is the store's ErrConnectionLost (it
	// wrote the completion once more and found no row under the token).
	lostConnection bool
}

func (f *faulty) Get(ctx context.Context, scope, id string) (store.Event, error) {
	if f.failGets.Add(-1) >= 0 {
		return store.Event{}, errDown
	}
	return f.Store.Get(ctx, scope, id)
}

var errDown = errors.New("store down")

func (f *faulty) Complete(ctx context.Context, scope, id, token string, status int) error {
	if f.completes.Add(1) > 1 && f.retryGate != nil {
		<-f.retryGate
	}
	<-f.release
	if f.failCompletes.Add(-1) >= 0 {
		return errDown
	}
	err := f.Store.Complete(ctx, scope, id, token, status)
	if err == nil && f.loseAnswers.Add(-1) >= 0 {
		if f.lostConnection {
			return fmt.Errorf("completing event: %w", store.ErrConnectionLost)
		}
		return errDown
	}
	return err
}

func (b *testBundle) state(t *testing.T, scope, id string) store.State {
	t.Helper()
	e, err := b.store.Get(context.Background(), scope, id)
	require.NoError(t, err)
	return e.State
}

// TestNewDefaults: zero Options fields get the package's defaults.
func TestNewDefaults(t *testing.T) {
	t.Parallel()
	b := setup(t, claim.Options{})
	o := b.keeper.Options()
	require.NotNil(t, o.Logger, "a no-op logger")
	require.NotNil(t, o.Completions, "a registry of its own")
	o.Logger, o.Completions = nil, nil
	require.Equal(t, claim.Options{
		Store: b.store, Lease: time.Minute, StoreTimeout: claim.DefaultStoreTimeout,
		RetryFor: claim.DefaultRetryFor, DrainFor: claim.DefaultDrainFor,
	}, o)
}

// TestClaimSettle: a claim completed, released or held reads so in the
// store; a second claim of a completed event is a duplicate with its
// status.
func TestClaimSettle(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		op   claim.Op
		want store.State
	}{
		{claim.Complete, store.StateCompleted},
		{claim.Release, store.StateReleased},
		{claim.Hold, store.StateHeld},
	} {
		t.Run(tc.op.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, claim.Options{})
			c, err := b.keeper.Claim(t.Context(), "s", "evt_1", "")
			require.NoError(t, err)
			require.Equal(t, store.Claimed, c.Outcome)
			b.keeper.Settle(t.Context(), []claim.Ref{{Scope: "s", ID: "evt_1", Token: c.Token, HoldReason: "test"}}, 200, tc.op)
			require.Equal(t, tc.want, b.state(t, "s", "evt_1"))
			if tc.op == claim.Complete {
				again, err := b.keeper.Claim(t.Context(), "s", "evt_1", "")
				require.NoError(t, err)
				require.Equal(t, store.Duplicate, again.Outcome)
				require.Equal(t, 200, again.Status)
			}
		})
	}
}

// TestCompleteAfterAnswerAwaited: a completion written after the answer
// is waited for by a claim of the same event through another Keeper of the
// same store (another route of the scope, or a reloaded config), which
// then finds it a duplicate instead of in flight; Drain waits for it too.
func TestCompleteAfterAnswerAwaited(t *testing.T) {
	t.Parallel()
	shared := claim.NewCompletions()
	b := setup(t, claim.Options{Completions: shared})
	b.store.release = make(chan struct{}) // the completion blocks until released
	other := claim.New(claim.Options{Store: b.store, Completions: shared, Lease: time.Minute})

	c, err := b.keeper.Claim(t.Context(), "s", "evt_after", "")
	require.NoError(t, err)
	b.keeper.CompleteAfterAnswer(t.Context(), []claim.Ref{{Scope: "s", ID: "evt_after", Token: c.Token}}, 200)

	got := make(chan store.Claim, 1)
	go func() {
		dup, err := other.Claim(context.Background(), "s", "evt_after", "")
		if err == nil {
			got <- dup
		}
		close(got)
	}()
	select {
	case dup := <-got:
		t.Fatalf("the claim did not wait for the completion being written: %v", dup.Outcome)
	case <-time.After(200 * time.Millisecond):
	}
	drained := make(chan struct{})
	go func() {
		b.keeper.Drain()
		close(drained)
	}()
	close(b.store.release)
	dup, ok := <-got
	require.True(t, ok, "the waiting claim failed")
	require.Equal(t, store.Duplicate, dup.Outcome)
	<-drained
	require.Equal(t, store.StateCompleted, b.state(t, "s", "evt_after"))
	require.False(t, b.keeper.Active(), "nothing left running")
}

// TestSettleRetriedAfterStoreError: a completion the store failed is
// retried in the background (with a Background context) until it lands,
// and Wait waits for the retry; without one it is not retried.
func TestSettleRetriedAfterStoreError(t *testing.T) {
	t.Parallel()
	t.Run("retried", func(t *testing.T) {
		t.Parallel()
		b := setup(t, claim.Options{Background: t.Context()})
		b.store.failCompletes.Store(2)
		c, err := b.keeper.Claim(t.Context(), "s", "evt_retry", "")
		require.NoError(t, err)
		b.keeper.Settle(t.Context(), []claim.Ref{{Scope: "s", ID: "evt_retry", Token: c.Token}}, 200, claim.Complete)
		require.True(t, b.keeper.Active(), "a retry runs in the background")
		b.keeper.Wait()
		require.Equal(t, int32(3), b.store.completes.Load(), "two failures, then the completion")
		require.Equal(t, store.StateCompleted, b.state(t, "s", "evt_retry"))
	})
	t.Run("no background", func(t *testing.T) {
		t.Parallel()
		b := setup(t, claim.Options{})
		b.store.failCompletes.Store(1)
		c, err := b.keeper.Claim(t.Context(), "s", "evt_once", "")
		require.NoError(t, err)
		b.keeper.Settle(t.Context(), []claim.Ref{{Scope: "s", ID: "evt_once", Token: c.Token}}, 200, claim.Complete)
		require.False(t, b.keeper.Active())
		require.Equal(t, store.StateProcessing, b.state(t, "s", "evt_once"))
	})
}

// TestSettleRetriedAfterLostAnswer: a completion that committed but whose
// answer was lost is retried in the background; the retry finds no row
// under its token and reads the row as its own completion left it (same
// attempts): settled, not a lost lease; a read that fails is retried, not
// taken for a lost lease. When another delivery took the event over and
// completed it alike, the retry reports the lease lost.
func TestSettleRetriedAfterLostAnswer(t *testing.T) {
	t.Parallel()
	const lostMsg = "claim lease lost before settling; another delivery may have been forwarded"
	t.Run("committed", func(t *testing.T) {
		t.Parallel()
		b, logs := completeOnce(t, "evt_lost_answer", claim.Options{}, func(f *faulty) { f.loseAnswers.Store(1) })
		b.keeper.Wait()
		require.Equal(t, int32(2), b.store.completes.Load(), "the first try, then the retry")
		require.Equal(t, store.StateCompleted, b.state(t, "s", "evt_lost_answer"))
		require.Zero(t, logs.FilterMessage(lostMsg).Len(), "a lost answer is not a lost lease")
		require.Equal(t, 1, logs.FilterMessageSnippet("an earlier try had committed").Len())
	})
	t.Run("committed, the row unreadable once", func(t *testing.T) {
		t.Parallel()
		b, logs := completeOnce(t, "evt_lost_read", claim.Options{}, func(f *faulty) {
			f.loseAnswers.Store(1)
			f.failGets.Store(1) // the first retry cannot tell; the next one reads it
		})
		b.keeper.Wait()
		require.Equal(t, int32(3), b.store.completes.Load(), "the first try, a retry that could not read the row, another")
		require.Zero(t, logs.FilterMessage(lostMsg).Len(), "an unread row is not a lost lease")
		require.Equal(t, 1, logs.FilterMessageSnippet("an earlier try had committed").Len())
	})
	t.Run("committed, connection lost", func(t *testing.T) {
		t.Parallel()
		b, logs := completeOnce(t, "evt_lost_conn", claim.Options{}, func(f *faulty) {
			f.loseAnswers.Store(1)
			f.lostConnection = true
		})
		require.False(t, b.keeper.Active(), "decided at once from the row: no retry")
		require.Equal(t, int32(1), b.store.completes.Load())
		require.Zero(t, logs.Len(), "settled: nothing to warn of")
	})
	t.Run("taken over", func(t *testing.T) {
		t.Parallel()
		b, logs := completeOnce(t, "evt_taken", claim.Options{Lease: 50 * time.Millisecond}, func(f *faulty) {
			f.failCompletes.Store(1) // the first try does not commit
			f.retryGate = make(chan struct{})
		})
		other := claim.New(claim.Options{Store: b.store.Store, Lease: time.Minute})
		var (
			again store.Claim
			err   error
		)
		require.Eventually(t, func() bool {
			again, err = other.Claim(t.Context(), "s", "evt_taken", "")
			return err == nil && again.Outcome == store.Claimed
		}, 5*time.Second, 20*time.Millisecond, "the expired lease is taken over")
		require.Equal(t, 2, again.Attempts)
		require.NoError(t, b.store.Store.Complete(t.Context(), "s", "evt_taken", again.Token, 200))
		close(b.store.retryGate)
		b.keeper.Wait()
		require.Equal(t, 1, logs.FilterMessage(lostMsg).Len(), "another delivery completed the event")
	})
}

// completeOnce claims event id of scope "s" through a keeper with opts, a
// Background context and an observed logger, over a store prep sets up,
// and completes it with 200 (Settle: the first try, and any retry begun).
func completeOnce(t *testing.T, id string, opts claim.Options, prep func(*faulty)) (*testBundle, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	opts.Background, opts.Logger = t.Context(), zap.New(core)
	b := setup(t, opts)
	prep(b.store)
	c, err := b.keeper.Claim(t.Context(), "s", id, "")
	require.NoError(t, err)
	b.keeper.Settle(t.Context(), []claim.Ref{claim.RefOf("s", id, c)}, 200, claim.Complete)
	return b, logs
}

// TestSettleLeaseLost: a settle with a token that no longer holds the row
// changes nothing and is not retried.
func TestSettleLeaseLost(t *testing.T) {
	t.Parallel()
	b := setup(t, claim.Options{Background: t.Context()})
	_, err := b.keeper.Claim(t.Context(), "s", "evt_lost", "")
	require.NoError(t, err)
	b.keeper.Settle(t.Context(), []claim.Ref{{Scope: "s", ID: "evt_lost", Token: "not-the-token"}}, 200, claim.Complete)
	require.False(t, b.keeper.Active(), "a lost lease is not retried")
	require.Equal(t, store.StateProcessing, b.state(t, "s", "evt_lost"))
}

// TestKeepRenews: KeepAlive renews a claim's lease while its work runs, so
// a second claim finds it in flight after the first lease would have
// expired, and its end returns once the renewals have stopped.
func TestKeepRenews(t *testing.T) {
	t.Parallel()
	// A lease long enough that a loaded machine's scheduling cannot let it
	// lapse between renewals (every third of it); the test waits for a
	// renewal instead of sleeping a fixed time.
	b := setup(t, claim.Options{Lease: 3 * time.Second})
	c, err := b.keeper.Claim(t.Context(), "s", "evt_keep", "")
	require.NoError(t, err)
	first, err := b.store.Get(t.Context(), "s", "evt_keep")
	require.NoError(t, err)
	end := b.keeper.KeepAlive(t.Context(), []claim.Ref{{Scope: "s", ID: "evt_keep", Token: c.Token}})
	renewed := false
	for deadline := time.Now().Add(10 * time.Second); !renewed && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		e, err := b.store.Get(t.Context(), "s", "evt_keep")
		require.NoError(t, err)
		renewed = e.LeaseUntil.After(first.LeaseUntil)
	}
	require.True(t, renewed, "the lease was renewed")
	again, err := b.keeper.Claim(t.Context(), "s", "evt_keep", "")
	require.NoError(t, err)
	require.Equal(t, store.InFlight, again.Outcome, "a renewed claim is in flight")
	end()
}

// TestSweeperOnce: rows first seen before their scope's cutoff are
// deleted, others kept; the defaults apply to a zero Sweeper's batch
// sizes and timeout.
func TestSweeperOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, claim.Options{})
	for _, id := range []string{"a", "b"} {
		c, err := b.keeper.Claim(t.Context(), "old", id, "")
		require.NoError(t, err)
		b.keeper.Settle(t.Context(), []claim.Ref{{Scope: "old", ID: id, Token: c.Token}}, 200, claim.Complete)
	}
	c, err := b.keeper.Claim(t.Context(), "kept", "c", "")
	require.NoError(t, err)
	b.keeper.Settle(t.Context(), []claim.Ref{{Scope: "kept", ID: "c", Token: c.Token}}, 200, claim.Complete)

	s := &claim.Sweeper{Store: b.store, Expiries: func(now time.Time) []store.Expiry {
		return []store.Expiry{{Scopes: []string{"old"}, Cutoff: now}, {Scopes: []string{"kept"}, Cutoff: now.Add(-time.Hour)}}
	}}
	n, err := s.Once(t.Context(), time.Now().Add(time.Minute))
	require.NoError(t, err)
	require.Equal(t, 2, n)
	_, err = b.store.Get(t.Context(), "old", "a")
	require.ErrorIs(t, err, store.ErrNotFound)
	require.Equal(t, store.StateCompleted, b.state(t, "kept", "c"))
}

// answerLost commits each claim and then fails it with err, as a
// connection that stalled with the claim in it and let it through after the
// caller gave up (the store timeout passed, or the provider hung up).
type answerLost struct {
	store.Store
	err error
}

func (s answerLost) Claim(ctx context.Context, p store.ClaimParams) (store.Claim, error) {
	if _, err := s.Store.Claim(ctx, p); err != nil {
		return store.Claim{}, err
	}
	return store.Claim{}, fmt.Errorf("claiming event: %w", s.err)
}

// A claim whose answer was lost but which committed is given back by its
// token: the event is released, not left processing under a token nobody
// holds, and the next claim takes it without an ambiguous ending.
func TestClaimWithLostAnswerGivenBack(t *testing.T) {
	t.Parallel()
	for _, lost := range []error{store.ErrConnectionLost, context.DeadlineExceeded, context.Canceled} {
		t.Run(lost.Error(), func(t *testing.T) {
			t.Parallel()
			s, err := sqlite.New(t.Context(), sqlite.Options{Path: filepath.Join(t.TempDir(), "events.db")})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			k := claim.New(claim.Options{Store: answerLost{s, lost}, Lease: time.Minute})

			_, err = k.Claim(t.Context(), "s", "evt_1", "")
			require.ErrorIs(t, err, lost)
			require.Eventually(t, func() bool {
				e, err := s.Get(context.Background(), "s", "evt_1")
				return err == nil && e.State == store.StateReleased
			}, 5*time.Second, 20*time.Millisecond, "the committed claim is given back")

			c, err := s.Claim(t.Context(), store.ClaimParams{Scope: "s", EventID: "evt_1", Lease: time.Minute})
			require.NoError(t, err)
			require.Equal(t, store.Claimed, c.Outcome)
			require.Zero(t, c.Ambiguous, "no forward ended with no known outcome")
		})
	}
}

// lateGiveBack commits its first claim and loses the answer, and fails
// every release while hold is set (the late commit not visible yet).
type lateGiveBack struct {
	store.Store
	answered, hold atomic.Bool
}

func (s *lateGiveBack) Claim(ctx context.Context, p store.ClaimParams) (store.Claim, error) {
	c, err := s.Store.Claim(ctx, p)
	if err == nil && s.answered.CompareAndSwap(false, true) {
		return store.Claim{}, fmt.Errorf("claiming event: %w", store.ErrConnectionLost)
	}
	return c, err
}

func (s *lateGiveBack) Release(ctx context.Context, scope, id, token string) error {
	if s.hold.Load() {
		return fmt.Errorf("releasing event: %w", store.ErrLeaseLost)
	}
	return s.Store.Release(ctx, scope, id, token)
}

// A delivery that finds in flight the claim this Keeper is giving back is
// told to come back within the give-back's longest wait, not after the
// whole lease: a trial's spooled delivery waited a lease (30 s) for a claim
// released a moment later.
func TestInFlightClaimBeingGivenBackRetriedSoon(t *testing.T) {
	t.Parallel()
	s, err := sqlite.New(t.Context(), sqlite.Options{Path: filepath.Join(t.TempDir(), "events.db")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	late := &lateGiveBack{Store: s}
	late.hold.Store(true)
	k := claim.New(claim.Options{Store: late, Lease: time.Minute})

	_, err = k.Claim(t.Context(), "s", "evt_1", "")
	require.ErrorIs(t, err, store.ErrConnectionLost)
	c, err := k.Claim(t.Context(), "s", "evt_1", "")
	require.NoError(t, err)
	require.Equal(t, store.InFlight, c.Outcome)
	require.Equal(t, 2*time.Second, c.RetryAfter, "the lease left is a minute")

	other := claim.New(claim.Options{Store: s, Lease: time.Minute})
	c, err = other.Claim(t.Context(), "s", "evt_1", "")
	require.NoError(t, err)
	require.Greater(t, c.RetryAfter, 50*time.Second, "a Keeper giving nothing back keeps the lease left")

	late.hold.Store(false)
	require.Eventually(t, func() bool {
		c, err := k.Claim(t.Context(), "s", "evt_1", "")
		return err == nil && c.Outcome == store.Claimed
	}, 5*time.Second, 50*time.Millisecond, "released, then claimed")
}
