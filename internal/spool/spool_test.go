package spool_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/spool"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// The outage of issue 20: 110 deliveries of 100 events (every tenth event
// delivered twice) arrive while the store is down; once it is back each
// event is forwarded once, in arrival order, and the second deliveries
// settle as duplicates. The spool is then empty and its files deleted.
func TestOutageForwardsEachEventOnceInArrivalOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *spool.Options) { o.Concurrency = 1 }) // one at a time: forwards in arrival order
	b.storeDown(t)
	detach := b.sp.Attach(b.deliver)
	defer detach()

	var arrivals, firsts []string
	seen := map[string]bool{}
	for i := range 100 {
		id := fmt.Sprintf("evt-%03d", i)
		arrivals = append(arrivals, id)
		if i%10 == 5 {
			arrivals = append(arrivals, fmt.Sprintf("evt-%03d", i-3)) // a redelivery, later
		}
	}
	for _, id := range arrivals {
		if !seen[id] {
			firsts = append(firsts, id)
			seen[id] = true
		}
	}
	require.Len(t, arrivals, 110)
	var wg sync.WaitGroup
	for _, id := range arrivals {
		require.NoError(t, b.sp.Append(t.Context(), record(id)))
	}
	wg.Wait()
	st := b.sp.Stats()
	require.Equal(t, 110, st.Records)
	require.Positive(t, st.Bytes)
	require.False(t, st.Oldest.IsZero())
	time.Sleep(100 * time.Millisecond) // tries while down: nothing forwarded
	require.Zero(t, b.up.count())
	require.True(t, b.sp.Stats().StoreDown)

	b.storeUp(t)
	waitFor(t, 10*time.Second, "the spool to drain", func() bool { return b.sp.Stats().Records == 0 })
	require.Equal(t, firsts, b.up.ids(), "each event forwarded once, in arrival order")
	st = b.sp.Stats()
	require.EqualValues(t, 100, st.Counts.Forwarded)
	require.EqualValues(t, 10, st.Counts.Duplicates)
	require.EqualValues(t, 110, st.Counts.Spooled)
	require.Zero(t, st.Bytes)
	require.True(t, st.Oldest.IsZero())
	for _, id := range firsts {
		ev, err := b.claimStore().Get(t.Context(), "github", id)
		require.NoError(t, err)
		require.Equal(t, store.StateCompleted, ev.State, id)
	}
	require.Empty(t, segmentFiles(t, b.dir), "settled segments are deleted")
}

// A spooled record keeps the request exactly: method, target, peer,
// headers (signatures included) and raw body; across a restart too. The
// directory is 0700 and every file 0600.
func TestRecordsSurviveRestartExactly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := record("evt-1")
	in.Header.Add("X-Multi", "a")
	in.Header.Add("X-Multi", "b")
	in.Body = []byte{0x1f, 0x8b, 0, 1, 2, 255} // a gzip body stays bytes
	in.BodyKey = "sha256:abc"
	require.NoError(t, b.sp.Append(t.Context(), in))
	require.EqualValues(t, 1, in.Seq)
	appendAll(t, b.sp, "evt-2", "evt-3")

	require.Equal(t, os.FileMode(0o700), mode(t, b.dir))
	for _, f := range append(segmentFiles(t, b.dir), filepath.Join(b.dir, "LOCK")) {
		require.Equal(t, os.FileMode(0o600), mode(t, f), f)
	}

	b.reopen(t)
	list := b.sp.List(10)
	require.Len(t, list, 3)
	for i, e := range list {
		require.EqualValues(t, i+1, e.Seq)
		require.Equal(t, "evt-"+strconv.Itoa(i+1), e.EventID)
	}
	appendAll(t, b.sp, "evt-4") // a new segment after a restart
	got := make(chan *spool.Record, 10)
	b.sp.Attach(func(_ context.Context, r *spool.Record) spool.Result {
		got <- r
		return spool.Result{Outcome: spool.Forwarded}
	})
	out := <-got
	require.Equal(t, in.Method, out.Method)
	require.Equal(t, in.Host, out.Host)
	require.Equal(t, in.URI, out.URI)
	require.Equal(t, in.Proto, out.Proto)
	require.Equal(t, in.RemoteAddr, out.RemoteAddr)
	require.Equal(t, in.Scheme, out.Scheme)
	require.Equal(t, in.Header, out.Header)
	require.Equal(t, in.Body, out.Body)
	require.Equal(t, in.BodyKey, out.BodyKey)
	require.Equal(t, in.Arrived.UnixNano(), out.Arrived.UnixNano())
	var rest []string
	for range 3 {
		rest = append(rest, (<-got).EventID)
	}
	require.ElementsMatch(t, []string{"evt-2", "evt-3", "evt-4"}, rest) // tried together: any order
	waitFor(t, 5*time.Second, "the spool to drain", func() bool { return b.sp.Stats().Records == 0 })
	waitFor(t, 5*time.Second, "its files to go", func() bool { return len(segmentFiles(t, b.dir)) == 0 })
}

// Acknowledged records are not delivered again after a restart; the ones
// still waiting are, in order.
func TestRestartDeliversOnlyWhatWaits(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *spool.Options) { o.Concurrency = 1 }) // d is not tried with c
	appendAll(t, b.sp, "a", "b", "c", "d")
	var mu sync.Mutex
	var seen []string
	detach := b.sp.Attach(func(_ context.Context, r *spool.Record) spool.Result {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, r.EventID)
		if r.EventID == "c" {
			return spool.Result{Outcome: spool.Unavailable} // the store went away
		}
		return spool.Result{Outcome: spool.Forwarded}
	})
	waitFor(t, 5*time.Second, "a, b settled", func() bool { return b.sp.Stats().Records == 2 })
	detach()
	b.reopen(t)
	require.Equal(t, []string{"c", "d"}, ids(b.sp.List(10)))
	b.sp.Attach(b.deliver)
	waitFor(t, 5*time.Second, "c, d forwarded", func() bool { return b.sp.Stats().Records == 0 })
	require.Equal(t, []string{"c", "d"}, b.up.ids())
}

func ids(es []spool.Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.EventID)
	}
	return out
}

// Another gateway holds a live claim on an event: the spooled record of it
// is not forwarded, it waits (and lets the records behind it go first);
// when the other gateway completes the event, the record settles as a
// duplicate. When the other gateway releases instead, it is forwarded once.
func TestNeverForwardsAnEventClaimedElsewhere(t *testing.T) {
	t.Parallel()
	for _, settle := range []string{"complete", "release"} {
		t.Run(settle, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			st := b.claimStore()
			other, err := st.Claim(t.Context(), store.ClaimParams{Scope: "github", EventID: "x", Lease: time.Minute})
			require.NoError(t, err)
			require.Equal(t, store.Claimed, other.Outcome)

			appendAll(t, b.sp, "x", "y")
			b.sp.Attach(b.deliver)
			waitFor(t, 5*time.Second, "y forwarded", func() bool { return b.sp.Stats().Records == 1 })
			require.Equal(t, []string{"y"}, b.up.ids(), "x is in flight elsewhere: not forwarded")
			l := b.sp.List(10)
			require.Len(t, l, 1)
			require.Equal(t, spool.Wait, l[0].Last)
			require.Equal(t, 1, b.sp.Stats().Waiting)

			if settle == "complete" {
				require.NoError(t, st.Complete(t.Context(), "github", "x", other.Token, 200))
			} else {
				require.NoError(t, st.Release(t.Context(), "github", "x", other.Token))
			}
			// The in-flight wait is the lease left (a minute): a restart
			// tries again at once, as the next Open does.
			b.reopen(t)
			b.sp.Attach(b.deliver)
			waitFor(t, 5*time.Second, "x settled", func() bool { return b.sp.Stats().Records == 0 })
			if settle == "complete" {
				require.Equal(t, []string{"y"}, b.up.ids())
				require.EqualValues(t, 1, b.sp.Stats().Counts.Duplicates)
			} else {
				require.Equal(t, []string{"y", "x"}, b.up.ids())
			}
		})
	}
}

// The upstream refuses a spooled delivery twice: its claim is released
// each time and the spool tries again with backoff (the provider, answered
// long ago, will not); the record behind it is not held back.
func TestRefusedRecordIsTriedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.up.refuse = map[string]int{"a": 2}
	appendAll(t, b.sp, "a", "b")
	b.sp.Attach(b.deliver)
	waitFor(t, 5*time.Second, "both forwarded", func() bool { return b.sp.Stats().Records == 0 })
	require.Equal(t, []string{"a", "b", "a", "a"}, b.up.ids())
	st := b.sp.Stats()
	require.EqualValues(t, 2, st.Counts.Refused)
	require.EqualValues(t, 2, st.Counts.Forwarded)
	ev, err := b.claimStore().Get(t.Context(), "github", "a")
	require.NoError(t, err)
	require.Equal(t, store.StateCompleted, ev.State)
	require.Equal(t, 3, ev.Attempts)
}

// Past MaxBytes an Append fails with ErrFull (the caller answers 503) and
// writes nothing; settled records free their bytes.
func TestFullSpoolRefuses(t *testing.T) {
	t.Parallel()
	one := int64(0)
	{
		b := setup(t)
		appendAll(t, b.sp, "evt-0")
		one = b.sp.Stats().Bytes
	}
	b := setup(t, func(o *spool.Options) { o.MaxBytes = 3*one + one/2 })
	appendAll(t, b.sp, "evt-1", "evt-2", "evt-3")
	err := b.sp.Append(t.Context(), record("evt-4"))
	require.ErrorIs(t, err, spool.ErrFull)
	st := b.sp.Stats()
	require.Equal(t, 3, st.Records)
	require.EqualValues(t, 1, st.Counts.Full)
	require.LessOrEqual(t, st.Bytes, st.MaxBytes)

	b.sp.Attach(b.deliver)
	waitFor(t, 5*time.Second, "the spool to drain", func() bool { return b.sp.Stats().Records == 0 })
	require.NoError(t, b.sp.Append(t.Context(), record("evt-4")))
}

// A second process (or a second Open in this one) cannot use a spool
// directory in use; once it is closed, it can. A directory others can read
// is refused.
func TestDirectoryIsExclusiveAndPrivate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := spool.Open(spool.Options{Dir: b.dir})
	require.ErrorIs(t, err, spool.ErrLocked)
	require.ErrorContains(t, err, "pid "+strconv.Itoa(os.Getpid()))
	require.NoError(t, b.sp.Close())
	sp, err := spool.Open(spool.Options{Dir: b.dir})
	require.NoError(t, err)
	require.NoError(t, sp.Close())

	open := filepath.Join(t.TempDir(), "shared")
	require.NoError(t, os.Mkdir(open, 0o755))
	require.NoError(t, os.Chmod(open, 0o755)) // whatever the umask
	_, err = spool.Open(spool.Options{Dir: open})
	require.ErrorContains(t, err, "chmod 700")
}

// Concurrent Appends are group-committed and all durable; Seq follows the
// order they were written in, and List reports them in that order.
func TestConcurrentAppends(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *spool.Options) { o.SegmentBytes = 2048 })
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 25 {
				require.NoError(t, b.sp.Append(context.Background(), record(fmt.Sprintf("g%d-%02d", g, i))))
			}
		})
	}
	wg.Wait()
	require.Greater(t, len(segmentFiles(t, b.dir)), 2, "rotated")
	b.reopen(t)
	l := b.sp.List(1000)
	require.Len(t, l, 200)
	for i := 1; i < len(l); i++ {
		require.Greater(t, l[i].Seq, l[i-1].Seq)
	}
	b.sp.Attach(b.deliver)
	waitFor(t, 10*time.Second, "the spool to drain", func() bool { return b.sp.Stats().Records == 0 })
	require.Equal(t, 200, b.up.count())
	require.Empty(t, segmentFiles(t, b.dir))
}

// Stats: the oldest waiting record's arrival, by the injected clock.
func TestStatsOldest(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	b := setup(t, func(o *spool.Options) { o.Now = clock })
	appendAll(t, b.sp, "a")
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	appendAll(t, b.sp, "b")
	st := b.sp.Stats()
	require.Equal(t, time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC), st.Oldest.UTC())
	require.Equal(t, 2, st.Records)
	require.Equal(t, st.Bytes, st.DiskBytes)
}

// A Deliverer that is not ready yet (its server still starting) pauses the
// whole spool briefly without marking any record as tried; deliveries then
// go in arrival order.
func TestNotReadyPausesWithoutTrying(t *testing.T) {
	t.Parallel()
	b := setup(t)
	appendAll(t, b.sp, "a", "b", "c")
	var mu sync.Mutex
	ready := false
	var calls []string
	b.sp.Attach(func(ctx context.Context, r *spool.Record) spool.Result {
		mu.Lock()
		calls = append(calls, r.EventID)
		ok := ready
		mu.Unlock()
		if !ok {
			return spool.Result{Outcome: spool.NotReady, RetryAfter: 10 * time.Millisecond}
		}
		return b.deliver(ctx, r)
	})
	waitFor(t, 5*time.Second, "a few tries", func() bool { mu.Lock(); defer mu.Unlock(); return len(calls) >= 3 })
	mu.Lock()
	for _, id := range calls {
		require.Equal(t, "a", id, "paused: the records behind the first are not tried")
	}
	ready = true
	mu.Unlock()
	require.Zero(t, b.sp.Stats().Waiting)
	waitFor(t, 5*time.Second, "the spool to drain", func() bool { return b.sp.Stats().Records == 0 })
	fwd := b.up.ids()
	require.Len(t, fwd, 3)
	require.Equal(t, "a", fwd[0], "the first goes alone")
	require.ElementsMatch(t, []string{"b", "c"}, fwd[1:], "then together")
}

// Close does not wait for a delivery in progress (a forward may run for
// minutes); a record whose delivery ends after Close was not acknowledged,
// so the next Open has it again (its claim then decides: a duplicate).
func TestCloseDuringDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	appendAll(t, b.sp, "a")
	entered, release := make(chan struct{}), make(chan struct{})
	b.sp.Attach(func(context.Context, *spool.Record) spool.Result {
		close(entered)
		<-release
		return spool.Result{Outcome: spool.Forwarded}
	})
	<-entered
	closed := make(chan error)
	go func() { closed <- b.sp.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited for the delivery in progress")
	}
	close(release)
	require.ErrorIs(t, b.sp.Append(t.Context(), record("b")), spool.ErrClosed)

	b.sp = nil
	b.reopen(t)
	require.Equal(t, []string{"a"}, ids(b.sp.List(10)))
}

// The drain tries up to Concurrency records at once, never two of one
// event: 200 records of 150 events (50 delivered twice) after an outage
// are each forwarded once, the copies settle as duplicates.
func TestConcurrentDrainForwardsEachEventOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.storeDown(t)
	var inFlight, most atomic.Int32
	detach := b.sp.Attach(func(ctx context.Context, r *spool.Record) spool.Result {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(2 * time.Millisecond) // the upstream's time
		return b.deliver(ctx, r)
	})
	defer detach()
	for i := range 200 {
		appendAll(t, b.sp, fmt.Sprintf("evt-%03d", i%150))
	}
	b.storeUp(t)
	waitFor(t, 20*time.Second, "the spool to drain", func() bool { return b.sp.Stats().Records == 0 })
	ids := b.up.ids()
	require.Len(t, ids, 150, "each event forwarded once")
	seen := map[string]bool{}
	for _, id := range ids {
		require.False(t, seen[id], "%s forwarded twice", id)
		seen[id] = true
	}
	st := b.sp.Stats()
	require.EqualValues(t, 150, st.Counts.Forwarded)
	require.EqualValues(t, 50, st.Counts.Duplicates)
	require.LessOrEqual(t, most.Load(), int32(spool.DefaultConcurrency))
	require.Greater(t, most.Load(), int32(1), "tried concurrently")
}

// A record the upstream keeps refusing is set aside (dead) once it has
// been refused for DeadAfter: kept and counted, no longer tried, the
// records behind it delivered. Retry gives it a new round; Drop settles
// it for good (a restart does not bring it back). Nothing is dropped but
// by Drop.
func TestRefusedRecordIsSetAsideUntilRetriedOrDropped(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *spool.Options) { o.DeadAfter = 60 * time.Millisecond })
	b.up.refuse = map[string]int{"a": 1 << 20, "c": 1 << 20}
	appendAll(t, b.sp, "a", "b", "c")
	b.sp.Attach(b.deliver)
	waitFor(t, 5*time.Second, "a and c set aside", func() bool { return b.sp.Stats().Dead == 2 })
	st := b.sp.Stats()
	require.Equal(t, 2, st.Records, "dead records are kept")
	require.Zero(t, st.Waiting)
	require.EqualValues(t, 2, st.Counts.Dead)
	require.EqualValues(t, 1, st.Counts.Forwarded, "b")
	forwards := b.up.count()
	time.Sleep(150 * time.Millisecond)
	require.Equal(t, forwards, b.up.count(), "a dead record is not tried")
	list := b.sp.List(10)
	require.Len(t, list, 2)
	require.True(t, list[0].Dead)
	require.Equal(t, "a", list[0].EventID)
	aSeq, cSeq := list[0].Seq, list[1].Seq

	_, err := b.sp.Drop(999)
	require.ErrorIs(t, err, spool.ErrNoRecord)

	// Retry: a new round, refused again and set aside again.
	require.Equal(t, 1, b.sp.Retry(aSeq))
	waitFor(t, 5*time.Second, "a tried again", func() bool { return b.up.count() > forwards })
	waitFor(t, 5*time.Second, "a set aside again", func() bool { return b.sp.Stats().Dead == 2 })
	// The upstream takes it now.
	b.up.mu.Lock()
	b.up.refuse["a"] = 0
	b.up.mu.Unlock()
	require.Equal(t, 1, b.sp.Retry(aSeq))
	waitFor(t, 5*time.Second, "a forwarded", func() bool { return b.sp.Stats().Records == 1 })
	ev, err := b.claimStore().Get(t.Context(), "github", "a")
	require.NoError(t, err)
	require.Equal(t, store.StateCompleted, ev.State)

	// Drop c: settled without a forward, also after a restart.
	dropped, err := b.sp.Drop(cSeq)
	require.NoError(t, err)
	require.Equal(t, "c", dropped.EventID)
	_, err = b.sp.Drop(cSeq)
	require.ErrorIs(t, err, spool.ErrNoRecord)
	st = b.sp.Stats()
	require.Zero(t, st.Records)
	require.EqualValues(t, 1, st.Counts.Dropped)
	b.reopen(t)
	require.Zero(t, b.sp.Stats().Records, "a dropped record stays dropped")
}

// Drop refuses a record that is not dead: it may be in delivery.
func TestDropRefusesALiveRecord(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.storeDown(t)
	appendAll(t, b.sp, "x")
	_, err := b.sp.Drop(b.sp.List(1)[0].Seq)
	require.ErrorIs(t, err, spool.ErrNotDead)
	require.Equal(t, 1, b.sp.Stats().Records)
}

// CheckDir (caddy validate) checks a spool directory without making it:
// a missing one is left missing, one others can read is refused.
func TestCheckDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spool")
	require.NoError(t, spool.CheckDir(dir))
	_, err := os.Stat(dir)
	require.ErrorIs(t, err, fs.ErrNotExist, "validate creates nothing")
	require.NoError(t, os.Mkdir(dir, 0o755))
	require.ErrorContains(t, spool.CheckDir(dir), "chmod 700")
	require.NoError(t, os.Chmod(dir, 0o700))
	require.NoError(t, spool.CheckDir(dir))
}
