package sqlite_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/sqlite"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/storetest"
)

// gatedDriver holds every WriteBatch until the test lets it through, the
// way a database stalled by a lock holds a batch that has been sent.
type gatedDriver struct {
	store.BatchDriver
	entered chan *store.Batch // one send per WriteBatch, before it runs
	proceed chan struct{}     // one receive per WriteBatch
	written chan error        // one send per WriteBatch, once it returned
}

func (g gatedDriver) WriteBatch(ctx context.Context, b *store.Batch) error {
	g.entered <- b
	<-g.proceed
	err := g.BatchDriver.WriteBatch(ctx, b)
	g.written <- err
	return err
}

// TestAbandonedClaimReleased: a delivery whose claim batch is held by the
// database past the delivery's own deadline is answered 503 (Claim fails
// with the context's error). When that batch then commits, the claim it
// took for nobody is released at once: the provider's retry is claimed and
// forwarded, not answered 409 for a whole lease and then, under
// on_ambiguous hold, parked as held although it was never forwarded.
func TestAbandonedClaimReleased(t *testing.T) {
	t.Parallel()
	s := newStore(t, sqlite.Options{})
	g := gatedDriver{BatchDriver: sqlite.BatchDriver(s),
		entered: make(chan *store.Batch), proceed: make(chan struct{}), written: make(chan error, 2)}
	r := store.NewBatchedRules(g, store.BatchOptions{Writers: 1})
	lease := time.Hour
	first := make(chan error, 1)
	go func() {
		_, err := r.Claim(t.Context(), store.ClaimParams{Scope: "stripe", EventID: "evt_first", Lease: lease})
		first <- err
	}()
	<-g.entered // the first batch is being written by its caller

	p := store.ClaimParams{Scope: "stripe", EventID: "evt_abandoned", Lease: lease, HoldOnExpiry: true}
	ctx, cancel := context.WithCancel(t.Context())
	claimed := make(chan error, 1)
	go func() {
		_, err := r.Claim(ctx, p)
		claimed <- err
	}()
	for r.Queued() == 0 {
		runtime.Gosched() // the claim waits for the next batch
	}
	g.proceed <- struct{}{}
	require.NoError(t, <-g.written)
	require.NoError(t, <-first)

	<-g.entered // the claim's batch is being written, on another goroutine
	cancel()
	require.ErrorIs(t, <-claimed, context.Canceled)

	g.proceed <- struct{}{} // the claim commits for a caller that is gone
	require.NoError(t, <-g.written)

	// The provider's retry. Its claim is written after the release of the
	// abandoned one, which the claim's batch wrote at once.
	retried := make(chan store.Claim, 1)
	go func() {
		c, err := r.Claim(t.Context(), p)
		assert.NoError(t, err)
		retried <- c
	}()
	b := <-g.entered
	require.Len(t, b.Settles, 1, "the claim taken for a caller that gave up is released")
	require.Equal(t, store.StmtRelease, b.Settles[0].Stmt)
	require.Empty(t, b.Claims)
	g.proceed <- struct{}{}
	require.NoError(t, <-g.written)
	ev, err := s.Get(t.Context(), p.Scope, p.EventID)
	require.NoError(t, err)
	require.Equal(t, store.StateReleased, ev.State)

	<-g.entered
	g.proceed <- struct{}{}
	require.NoError(t, <-g.written)
	require.Equal(t, store.Claimed, (<-retried).Outcome, "the retry is claimed, not answered in flight")
}

// TestGaveUpAfterCommit: the one-statement claim path on SQLite
// (storetest.RunGaveUp).
func TestGaveUpAfterCommit(t *testing.T) {
	t.Parallel()
	s := newStore(t, sqlite.Options{})
	storetest.RunGaveUp(t, sqlite.BatchDriver(s), s.Get)
}
