package e2e_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite" // the test's own connection to the gateway's SQLite file

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// Issue 20, item 6, on the claim paths other than the batched one: a
// provider that hangs up while its claim waits on a lock is outcome
// provider_gone, and the claim the store commits for it once the lock goes
// is released with its own token, so its retry is forwarded at once (not
// 409 for a lease), each event once. The Idempotency-Key claim carries a
// request fingerprint and is never batched (the one-statement path), on
// PostgreSQL and on SQLite; Stripe on SQLite takes SQLite's batch writer.
func TestProviderHangingUpBeforeItsClaimOnEveryPath(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, backend string
		keyed         bool
	}{
		{"postgres/idempotency-key", "postgres", true},
		{"sqlite/idempotency-key", "sqlite", true},
		{"sqlite/stripe", "sqlite", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{} })
			storage, file := "storage postgres "+strconv.Quote(b.db.DSN), filepath.Join(b.dir, "events.db")
			if tc.backend == "sqlite" {
				storage = "storage sqlite " + strconv.Quote(file)
			}
			handler := []string{"provider idempotency_key", storage}
			provider := "idempotency_key"
			if !tc.keyed {
				handler = []string{"provider stripe", "secret " + strconv.Quote(b.secret), storage}
				provider = "stripe"
			}
			g := b.start(e2e.GatewayConfig{Name: strings.ReplaceAll(tc.name, "/", "-"), Upstream: b.up.Addr(),
				Admin: true, Handler: handler})
			send := func(ctx context.Context, c *http.Client, id string) (int, error) {
				if !tc.keyed {
					r, err := e2e.Deliver(ctx, c, g.URL(), b.secret, id)
					return r.Status, err
				}
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+g.Addr+"/orders",
					bytes.NewReader(fmt.Appendf(nil, `{"id":%q,"amount":100}`, id)))
				if err != nil {
					return 0, err
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", id)
				req.Header.Set("Authorization", "Bearer tok_A")
				resp, err := c.Do(req)
				if err != nil {
					return 0, err
				}
				defer resp.Body.Close()
				_, _ = io.Copy(io.Discard, resp.Body)
				return resp.StatusCode, nil
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			status, err := send(ctx, b.client, e2e.NewEventID())
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, status, "the events table exists")

			unlock := lockEvents(ctx, t, tc.backend, b.db.DSN, file)
			const n = 8
			impatient := e2e.NewClient(n, 500*time.Millisecond) // the provider's timeout
			defer impatient.CloseIdleConnections()
			ids := make([]string, n)
			var wg sync.WaitGroup
			for i := range ids {
				ids[i] = e2e.NewEventID()
				wg.Go(func() {
					_, err := send(ctx, impatient, ids[i])
					var ne net.Error
					if !errors.As(err, &ne) || !ne.Timeout() {
						t.Errorf("request %s: want the client's timeout, got %v", ids[i], err)
					}
				})
			}
			wg.Wait()
			// The claims still wait on the lock, their providers gone. Well
			// within PostgreSQL's statement deadline (2s): a claim cut by it
			// has an unknown commit.
			time.Sleep(500 * time.Millisecond)
			unlock()

			series := func(outcome string) string {
				return `caddy_webhook_idempotency_deliveries_total{outcome="` + outcome + `",provider="` + provider +
					`",scope="` + provider + `"}`
			}
			var gone, completed float64
			require.Eventually(t, func() bool {
				gone, _ = g.Metric(ctx, series("provider_gone"))
				completed, _ = g.Metric(ctx, series("completed"))
				return gone+completed == n+1 // +1: the first request
			}, 20*time.Second, 100*time.Millisecond, "every request counted")
			require.Equal(t, float64(n), gone, "every provider hung up while its claim waited")
			storeErrors, _ := g.Metric(ctx, series("store_error"))
			require.Zero(t, storeErrors, "the store was healthy")
			log, err := os.ReadFile(g.LogPath())
			require.NoError(t, err)
			for _, line := range strings.Split(string(log), "\n") {
				if strings.Contains(line, `"level":"warn"`) || strings.Contains(line, `"level":"error"`) {
					for _, id := range ids {
						require.NotContains(t, line, id, "no warning for a provider that hung up")
					}
					require.NotContains(t, line, "claiming event failed")
				}
			}

			// Retries: forwarded at once (the claim committed for nobody was
			// given back), never 409; each event runs once in all.
			for _, id := range ids {
				status, err := send(ctx, b.client, id)
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, status, "retry of %s", id)
			}
			for _, id := range ids {
				require.Equal(t, 1, b.up.Successes(id), "event %s", id)
			}
			inFlight, _ := g.Metric(ctx, series("in_flight"))
			require.Zero(t, inFlight, "no retry found its event in flight")
			t.Logf("%s: %d providers hung up while their claims waited on a lock: provider_gone %v, store_error %v",
				tc.name, n, gone, storeErrors)
		})
	}
}

// lockEvents holds the events table's write lock in a transaction of the
// test's own (PostgreSQL: LOCK TABLE ... IN SHARE MODE; SQLite: BEGIN
// IMMEDIATE on the gateway's file) until the returned func rolls it back.
func lockEvents(ctx context.Context, t *testing.T, backend, dsn, path string) func() {
	t.Helper()
	if backend == "postgres" {
		conn, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		// SHARE: a claim's statement is parsed and sent whole, then waits
		// to write; it commits once the lock goes, whoever still listens.
		_, err = tx.Exec(ctx, "LOCK TABLE webhook_events IN SHARE MODE")
		require.NoError(t, err)
		return func() { require.NoError(t, tx.Rollback(ctx)) }
	}
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, "BEGIN IMMEDIATE")
	require.NoError(t, err)
	return func() {
		_, err := conn.ExecContext(ctx, "ROLLBACK")
		require.NoError(t, err)
		require.NoError(t, conn.Close())
	}
}
