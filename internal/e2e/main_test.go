package e2e_test

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// caddyBin is the custom Caddy, built once per test binary by TestMain;
// "" under -short or without TEST_DATABASE_URL, when every test skips.
var caddyBin string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() || os.Getenv("TEST_DATABASE_URL") == "" {
		os.Exit(m.Run()) // every test skips: no binary to build
	}
	dir, err := os.MkdirTemp("", "e2e-caddy-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	caddyBin, err = e2e.BuildCaddy(ctx, dir)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// bundle is one test's world: its own database, a counting upstream, and
// the gateways started on them. Everything is torn down in t.Cleanup.
type bundle struct {
	t      *testing.T
	dir    string
	db     *e2e.Database
	up     *e2e.Upstream
	secret string
	client *http.Client
}

// setup skips under -short, creates the test's database and starts the
// upstream with the given behaviour.
func setup(t *testing.T, behave e2e.Behaviour) *bundle {
	t.Helper()
	return setupOn(t, e2e.AdminDSN(), behave)
}

// setupOn is setup with the test's database created through adminDSN (a
// temporary cluster's).
func setupOn(t *testing.T, adminDSN string, behave e2e.Behaviour) *bundle {
	t.Helper()
	if testing.Short() {
		t.Skip("e2e: real Caddy processes and PostgreSQL; skipped with -short")
	}
	if os.Getenv("TEST_DATABASE_URL") == "" {
		t.Skip("e2e: TEST_DATABASE_URL is unset (make test sets it)")
	}
	b := &bundle{t: t, dir: t.TempDir(), secret: e2e.NewSecret(), client: e2e.NewClient(64, 30*time.Second)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := e2e.CreateDatabase(ctx, adminDSN, "e2e")
	require.NoError(t, err, "TEST_DATABASE_URL must reach a PostgreSQL where the role may CREATE DATABASE")
	b.db = db
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := db.Drop(ctx); err != nil {
			t.Logf("dropping %s: %v", db.Name, err)
		}
	})
	if behave != nil {
		b.up, err = e2e.NewUpstream(behave)
		require.NoError(t, err)
		t.Cleanup(b.up.Close)
	}
	t.Cleanup(b.client.CloseIdleConnections)
	return b
}

// gateway starts a Caddy instance in front of upstream (host:port; the
// bundle's upstream when "") with the test's secret and database, and the
// extra handler lines. It is killed in t.Cleanup, and its log tail is
// printed when the test failed.
func (b *bundle) gateway(name, upstream string, extra ...string) *e2e.Gateway {
	b.t.Helper()
	return b.gatewayOn(name, upstream, b.db.DSN, extra...)
}

// gatewayOn is gateway with the store reached through dsn (a Link's).
func (b *bundle) gatewayOn(name, upstream, dsn string, extra ...string) *e2e.Gateway {
	b.t.Helper()
	return b.gatewayWith(e2e.GatewayConfig{Name: name, Upstream: upstream}, dsn, extra...)
}

// gatewayWith starts a gateway from cfg (Binary, Dir, Handler and an empty
// Upstream filled in). When it is torn down its log is searched for the
// test's secret and every signature sent (e2e.CheckNoLeaks), unless cfg
// leaves out the log filter on purpose.
func (b *bundle) gatewayWith(cfg e2e.GatewayConfig, dsn string, extra ...string) *e2e.Gateway {
	b.t.Helper()
	if cfg.Upstream == "" {
		cfg.Upstream = b.up.Addr()
	}
	cfg.Handler = e2e.StripeHandler(b.secret, dsn, extra...)
	return b.start(cfg)
}

// start starts a gateway from cfg (Binary and Dir are the bundle's). It is
// killed in t.Cleanup, its log is then searched for the test's secret and
// every signature sent (e2e.CheckNoLeaks) unless cfg leaves out the log
// filter on purpose, and its log tail is printed when the test failed.
func (b *bundle) start(cfg e2e.GatewayConfig) *e2e.Gateway {
	b.t.Helper()
	cfg.Binary, cfg.Dir = caddyBin, b.dir
	g, err := e2e.StartGateway(cfg)
	require.NoError(b.t, err)
	b.t.Cleanup(func() {
		g.Kill()
		if !cfg.NoLogFilter {
			e2e.CheckNoLeaks(b.t, g.LogPath(), b.secret)
		}
		if b.t.Failed() {
			b.t.Logf("--- log of %s (last 12 lines):\n%s", g.Name, g.LogTail(12))
		}
	})
	return g
}

// logCount counts the lines of g's log that contain text.
func logCount(g *e2e.Gateway, text string) int {
	b, err := os.ReadFile(g.LogPath())
	if err != nil {
		return -1
	}
	return strings.Count(string(b), text)
}

// deliver sends one signed delivery of id to g and fails the test on a
// transport error.
func (b *bundle) deliver(g *e2e.Gateway, id string) e2e.Result {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := e2e.Deliver(ctx, b.client, g.URL(), b.secret, id)
	require.NoError(b.t, err)
	return r
}

// deliverGitHub sends one signed GitHub delivery of id to url (a GitHub
// route's) and fails the test on a transport error.
func (b *bundle) deliverGitHub(url, id string) e2e.Result {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := e2e.DeliverGitHub(ctx, b.client, url, b.secret, id)
	require.NoError(b.t, err)
	return r
}

// deliverLater sends one signed delivery of id to g in the background;
// the result comes on the channel, a transport error in its Body.
func (b *bundle) deliverLater(g *e2e.Gateway, id string) <-chan e2e.Result {
	first := make(chan e2e.Result, 1)
	go func() {
		r, err := e2e.Deliver(context.Background(), b.client, g.URL(), b.secret, id)
		if err != nil {
			r.Body = err.Error()
		}
		first <- r
	}()
	return first
}

// deliverForwarded is deliverLater, returning once the upstream has the
// delivery's first call (at most 15s).
func (b *bundle) deliverForwarded(g *e2e.Gateway, id string) <-chan e2e.Result {
	b.t.Helper()
	first := b.deliverLater(g, id)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	require.NoError(b.t, b.up.WaitFor(ctx, id, func(cs []e2e.Call) bool { return len(cs) == 1 }))
	return first
}

// storeLink is a cuttable TCP link to the test database, closed at the end
// of the test: a gateway given b.db.DSNVia(link.Addr()) loses its store when
// the link is cut.
func (b *bundle) storeLink() *e2e.Link {
	b.t.Helper()
	link, err := e2e.NewLink(b.db.Host())
	require.NoError(b.t, err)
	b.t.Cleanup(link.Close)
	return link
}

// deliverUntil redelivers id to g every interval until done accepts a
// result, at most n times; it returns every result.
func (b *bundle) deliverUntil(g *e2e.Gateway, id string, interval time.Duration, n int, done func(e2e.Result) bool) []e2e.Result {
	b.t.Helper()
	var rs []e2e.Result
	for range n {
		r := b.deliver(g, id)
		rs = append(rs, r)
		if done(r) {
			return rs
		}
		time.Sleep(interval)
	}
	return rs
}

// row reads the event's row from the default table.
func (b *bundle) row(id string) (e2e.Row, bool) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, ok, err := b.db.Row(ctx, "", "stripe", id)
	require.NoError(b.t, err)
	return r, ok
}

// waitState polls the event's row until it is in state, for at most 10s.
func (b *bundle) waitState(id, state string) e2e.Row {
	b.t.Helper()
	var last e2e.Row
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		r, ok := b.row(id)
		if ok && r.State == state {
			return r
		}
		last = r
	}
	b.t.Fatalf("event %s: row state %q after 10s, want %q", id, last.State, state)
	return last
}

// summary renders results compactly for failure messages: status, "+r" for
// replayed, and Retry-After.
func summary(rs []e2e.Result) string {
	parts := make([]string, 0, len(rs))
	for _, r := range rs {
		s := fmt.Sprint(r.Status)
		if r.Replayed {
			s += "+r"
		}
		if r.RetryAfter != "" {
			s += "/ra=" + r.RetryAfter
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// collector gathers results from concurrent senders.
type collector struct {
	mu sync.Mutex
	rs []e2e.Result
}

func (c *collector) add(r e2e.Result) {
	c.mu.Lock()
	c.rs = append(c.rs, r)
	c.mu.Unlock()
}

func (c *collector) all() []e2e.Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]e2e.Result(nil), c.rs...)
}
