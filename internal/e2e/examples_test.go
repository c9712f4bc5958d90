package e2e_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// TestExamplesExactlyOnce runs the legacy payment handlers of
// examples/exactly-once (Go, and Python when Debian's python3-flask and
// python3-psycopg are installed) behind a gateway with complete_by
// upstream. Every other event's first forward has its connection cut, by a
// link between the gateway and the handler, once the handler has committed
// (the answer may or may not have made it through), and every event is
// redelivered until answered 2xx: every order is paid once, with exactly
// one confirmation e-mail, and every forward was co-committed.
func TestExamplesExactlyOnce(t *testing.T) {
	t.Parallel()
	root, err := e2e.RepoRoot()
	require.NoError(t, err)
	dir := filepath.Join(root, "examples", "exactly-once")

	runners := map[string]func(t *testing.T, dsn string, port int) *exec.Cmd{
		"go": func(t *testing.T, dsn string, port int) *exec.Cmd {
			bin := filepath.Join(t.TempDir(), "exactly-once")
			build := exec.Command("go", "build", "-o", bin, "./examples/exactly-once")
			build.Dir = root
			out, err := build.CombinedOutput()
			require.NoError(t, err, "%s", out)
			return exec.Command(bin)
		},
		"python": func(t *testing.T, dsn string, port int) *exec.Cmd {
			py := "/usr/bin/python3"
			if err := exec.Command(py, "-c", "import flask, psycopg").Run(); err != nil {
				t.Skip("python3-flask and python3-psycopg are not installed (apt-get install python3-flask python3-psycopg)")
			}
			return exec.Command(py, filepath.Join(dir, "payment.py"))
		},
	}
	for _, lang := range []string{"go", "python"} {
		t.Run(lang, func(t *testing.T) {
			b := setup(t, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			schema, err := os.ReadFile(filepath.Join(dir, "schema.sql"))
			require.NoError(t, err)
			conn, err := pgx.Connect(ctx, b.db.DSN)
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close(context.Background()) })
			_, err = conn.Exec(ctx, string(schema))
			require.NoError(t, err)

			port, err := e2e.FreePort()
			require.NoError(t, err)
			cmd := runners[lang](t, b.db.DSN, port)
			cmd.Env = append(os.Environ(), "DATABASE_URL="+b.db.DSN, "PORT="+strconv.Itoa(port))
			logPath := filepath.Join(t.TempDir(), "app.log")
			logFile, err := os.Create(logPath)
			require.NoError(t, err)
			cmd.Stdout, cmd.Stderr = logFile, logFile
			require.NoError(t, cmd.Start())
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				_ = logFile.Close()
				if t.Failed() {
					out, _ := os.ReadFile(logPath)
					t.Logf("--- %s handler's log:\n%s", lang, out)
				}
			})
			app := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			require.Eventually(t, func() bool {
				c, err := net.DialTimeout("tcp", app, time.Second)
				if err == nil {
					_ = c.Close()
				}
				return err == nil
			}, 60*time.Second, 50*time.Millisecond, "the %s handler listens", lang)

			// The gateway reaches the handler through a link the test cuts.
			link, err := e2e.NewLink(app)
			require.NoError(t, err)
			t.Cleanup(link.Close)
			g := b.gateway("gw", link.Addr(), "complete_by upstream", "forward_timeout 5s")

			ids := make([]string, exactlyEvents)
			for i := range ids {
				ids[i] = e2e.NewEventID()
				_, err := conn.Exec(ctx, `INSERT INTO orders (id, payment_intent_id) VALUES ($1, $2)`,
					fmt.Sprintf("order_%d", i), "pi_"+ids[i][len(ids[i])-8:])
				require.NoError(t, err)
			}
			for i, id := range ids {
				if i%2 == 0 {
					// The handler commits; the gateway's connection to it is
					// then cut before the answer arrives (or just after: the
					// provider's first answer is not asserted).
					first := b.deliverLater(g, id)
					require.Eventually(t, func() bool {
						var paid bool
						require.NoError(t, conn.QueryRow(ctx, `SELECT status = 'paid' FROM orders WHERE payment_intent_id = $1`,
							"pi_"+id[len(id)-8:]).Scan(&paid))
						return paid
					}, 30*time.Second, 5*time.Millisecond)
					link.Cut()
					<-first
					link.Restore()
				}
				rs := b.retryUntilOK(ctx, g, id)
				require.True(t, rs[len(rs)-1].OK(), "%s: %s", id, summary(rs))
				r := b.deliver(g, id)
				require.True(t, r.OK() && r.Replayed, "%s: a later delivery is a duplicate", id)
			}
			rows, err := conn.Query(ctx, `SELECT o.id, count(e.id) FROM orders o LEFT JOIN email_outbox e ON e.order_id = o.id
				GROUP BY o.id`)
			require.NoError(t, err)
			emails, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (int, error) {
				var (
					id string
					n  int
				)
				return n, r.Scan(&id, &n)
			})
			require.NoError(t, err)
			require.Len(t, emails, len(ids))
			per := map[int]int{}
			for _, n := range emails {
				per[n]++
			}
			t.Logf("%s handler: %d orders, confirmation e-mails per order %v", lang, len(ids), per)
			require.Equal(t, map[int]int{1: len(ids)}, per, "one confirmation e-mail per order")
			// The handler really co-commits: no forward ended completed
			// without its commit.
			require.Zero(t, logCount(g, `"outcome":"completed_uncommitted"`))
			require.GreaterOrEqual(t, logCount(g, `"outcome":"completed"`), len(ids))
		})
	}
}
