package e2e_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// pgbouncerEnv runs the tests behind a real PgBouncer; scripts/pgbouncer.sh
// (a step of scripts/test.sh) installs PgBouncer when missing and sets it.
const pgbouncerEnv = "WEBHOOK_IDEMPOTENCY_PGBOUNCER"

// pgbouncer starts a PgBouncer in transaction pooling in front of the test
// server, stopped in t.Cleanup (its log tail printed when the test failed).
func (b *bundle) pgbouncer(cfg e2e.PgBouncerConfig) *e2e.PgBouncer {
	b.t.Helper()
	if os.Getenv(pgbouncerEnv) == "" {
		b.t.Skipf("behind PgBouncer: set %s=1 (scripts/pgbouncer.sh does)", pgbouncerEnv)
	}
	cfg.Target = b.db.Host()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pb, err := e2e.StartPgBouncer(ctx, cfg)
	require.NoError(b.t, err)
	b.t.Cleanup(func() {
		if b.t.Failed() {
			b.t.Logf("--- pgbouncer log (last 20 lines):\n%s", pb.LogTail(20))
		}
		pb.Close()
	})
	return pb
}

// otherClient keeps one more client busy on dsn's pool (short transactions
// on 2 connections) until the returned stop is called.
func otherClient(t *testing.T, dsn string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pool, err := pgxpool.New(ctx, dsn+"&pool_max_conns=2")
	require.NoError(t, err)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for ctx.Err() == nil {
				qctx, qcancel := context.WithTimeout(ctx, 5*time.Second)
				_, _ = pool.Exec(qctx, "SELECT pg_sleep(0.005)")
				qcancel()
			}
		})
	}
	return func() {
		cancel()
		wg.Wait()
		pool.Close()
	}
}

// Three gateways start at the same moment through a PgBouncer in
// transaction pooling (4 server connections, another client using the
// pool), on a fresh database each round, so their migrations (events,
// learned secrets, queue) race: every start succeeds, in 10 rounds, with
// server connections used most-recent-first and in turn
// (server_round_robin).
func TestPgBouncerGatewaysStartTogether(t *testing.T) {
	t.Parallel()
	for _, rr := range []bool{false, true} {
		t.Run(fmt.Sprintf("server_round_robin=%v", rr), func(t *testing.T) {
			b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{} })
			pb := b.pgbouncer(e2e.PgBouncerConfig{PoolSize: 4, RoundRobin: rr})
			const rounds, instances = 10, 3
			failed := 0
			for round := range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				db, err := e2e.CreateDatabase(ctx, e2e.AdminDSN(), "e2e_pgb")
				cancel()
				require.NoError(t, err)
				dsn := pb.DSN(db.DSN)
				stop := otherClient(t, dsn)

				var (
					wg   sync.WaitGroup
					gws  = make([]*e2e.Gateway, instances)
					errs = make([]error, instances)
				)
				for i := range instances {
					wg.Go(func() {
						gws[i], errs[i] = e2e.StartGateway(e2e.GatewayConfig{
							Binary: caddyBin, Dir: b.dir, Name: fmt.Sprintf("r%d_%d", round, i),
							Upstream: b.up.Addr(),
							Handler: e2e.StripeHandler(b.secret, dsn,
								"mode async", "deliver_to http://"+b.up.Addr()),
						})
					})
				}
				wg.Wait()
				for i, err := range errs {
					if err != nil {
						failed++
						t.Logf("round %d, gateway %d: %v", round, i, err)
						continue
					}
					if i == 0 { // it serves: an event is queued and delivered
						id := e2e.NewEventID()
						r := b.deliver(gws[i], id)
						require.Equal(t, 200, r.Status, "round %d: %s", round, r.Body)
						wctx, wcancel := context.WithTimeout(context.Background(), 15*time.Second)
						require.NoError(t, b.up.WaitFor(wctx, id, func(cs []e2e.Call) bool { return len(cs) == 1 }))
						wcancel()
					}
				}
				for _, g := range gws {
					if g != nil {
						if t.Failed() {
							t.Logf("--- log of %s:\n%s", g.Name, g.LogTail(12))
						}
						g.Kill()
					}
				}
				stop()
				ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
				require.NoError(t, db.Drop(ctx))
				cancel()
			}
			t.Logf("%d rounds of %d gateways starting together behind PgBouncer: %d failed starts", rounds, instances, failed)
			require.Zero(t, failed, "failed starts")
		})
	}
}

// storm sends perEvent deliveries of each event at once, spread over gws,
// and returns each event's answers; a transport error fails the test.
func (b *bundle) storm(gws []*e2e.Gateway, ids []string, perEvent int) [][]e2e.Result {
	b.t.Helper()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		errs    []error
		byEvent = make([][]e2e.Result, len(ids))
		start   = make(chan struct{})
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for n := range len(ids) * perEvent {
		ev, gw := n%len(ids), gws[n%len(gws)]
		wg.Go(func() {
			<-start
			r, err := e2e.Deliver(ctx, b.client, gw.URL(), b.secret, ids[ev])
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			byEvent[ev] = append(byEvent[ev], r)
		})
	}
	close(start)
	wg.Wait()
	require.Empty(b.t, errs, "transport errors")
	return byEvent
}

// requireOnceEach checks a storm's answers (the upstream's 2xx, a
// duplicate's 200, or 409 while in flight: never a 5xx) and that each
// event reached the upstream exactly once. It returns the answers counted
// by kind.
func (b *bundle) requireOnceEach(ids []string, byEvent [][]e2e.Result) map[string]int {
	b.t.Helper()
	counts := map[string]int{}
	for i, id := range ids {
		for _, r := range byEvent[i] {
			switch {
			case r.Forwarded():
				counts["forwarded"]++
			case r.Status == 200 && r.Replayed:
				counts["duplicate"]++
			case r.Status == 409:
				counts["409"]++
			default:
				counts[fmt.Sprint(r.Status)]++
				b.t.Errorf("event %s: answer %d %s (%s)", id, r.Status, r.Body, summary(byEvent[i]))
			}
		}
		require.Len(b.t, b.up.Calls(id), 1, "event %s: upstream calls", id)
	}
	return counts
}

// A duplicate storm through PgBouncer (transaction pooling, 4 server
// connections, server_round_robin): 200 deliveries of 20 events at once
// over three gateways; each event reaches the upstream once, no delivery
// is refused.
func TestPgBouncerDuplicateStorm(t *testing.T) {
	t.Parallel()
	b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{Delay: 300 * time.Millisecond} })
	pb := b.pgbouncer(e2e.PgBouncerConfig{PoolSize: 4, RoundRobin: true})
	dsn := pb.DSN(b.db.DSN)
	gws := []*e2e.Gateway{b.gatewayOn("a", "", dsn), b.gatewayOn("b", "", dsn), b.gatewayOn("c", "", dsn)}
	ids := make([]string, 20)
	for i := range ids {
		ids[i] = e2e.NewEventID()
	}
	counts := b.requireOnceEach(ids, b.storm(gws, ids, 10))
	require.Equal(t, len(ids), counts["forwarded"], "one forward per event")
	for _, id := range ids {
		row, ok := b.row(id)
		require.True(t, ok)
		require.Equal(t, 1, row.Attempts, "event %s claimed once", id)
	}
	t.Logf("duplicate storm behind PgBouncer: %s", sortedCounts(counts))
}

// The async queue through PgBouncer (transaction pooling, 4 server
// connections, server_round_robin): 90 deliveries of 30 events at once
// over two async gateways are all acknowledged, and the dispatchers
// deliver each event to the upstream once.
func TestPgBouncerAsyncQueue(t *testing.T) {
	t.Parallel()
	b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{Delay: 20 * time.Millisecond} })
	pb := b.pgbouncer(e2e.PgBouncerConfig{PoolSize: 4, RoundRobin: true})
	dsn := pb.DSN(b.db.DSN)
	async := []string{"mode async", "deliver_to http://" + b.up.Addr()}
	gws := []*e2e.Gateway{b.gatewayOn("a", "", dsn, async...), b.gatewayOn("b", "", dsn, async...)}
	ids := make([]string, 30)
	for i := range ids {
		ids[i] = e2e.NewEventID()
	}
	byEvent := b.storm(gws, ids, 3)
	counts := map[string]int{}
	for i, id := range ids {
		for _, r := range byEvent[i] {
			require.Equal(t, 200, r.Status, "event %s: %s (%s)", id, r.Body, summary(byEvent[i]))
			counts[map[bool]string{true: "duplicate", false: "queued"}[r.Replayed]]++
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, id := range ids {
		require.NoError(t, b.up.WaitFor(ctx, id, func(cs []e2e.Call) bool { return len(cs) >= 1 }), "event %s delivered", id)
	}
	time.Sleep(time.Second) // a second delivery of any event would show by now
	for _, id := range ids {
		require.Len(t, b.up.Calls(id), 1, "event %s: upstream calls", id)
	}
	t.Logf("async queue behind PgBouncer: answers %s; each of %d events delivered once", sortedCounts(counts), len(ids))
}
