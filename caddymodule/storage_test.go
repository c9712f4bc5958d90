package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// provisionFromCaddyfile provisions a Handler from a Caddyfile block with a
// real store, the way Caddy does.
func provisionFromCaddyfile(t *testing.T, ctx caddy.Context, block string) *Handler {
	t.Helper()
	h := new(Handler)
	require.NoError(t, h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(block)))
	require.NoError(t, h.Provision(ctx))
	require.NoError(t, h.Validate())
	return h
}

// Every handler naming one database shares one store (one pgxpool) per
// process; the store lives until the last of them is cleaned up, which is
// what keeps the pool across a config reload (the new config provisions
// before the old one is cleaned up).
func TestStoreSharedAcrossHandlers(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	dsn := pgDSN(t)
	table := "shared_" + randomHex(6)
	t.Cleanup(func() { dropTable(dsn, table) })
	block := func(scope string) string {
		return "webhook_idempotency {\n provider stripe\n secret s\n scope " + scope +
			"\n storage postgres \"" + dsn + "\"\n table " + table + "\n}"
	}

	oldCtx, cancelOld := caddy.NewContext(caddy.Context{Context: context.Background()})
	a := provisionFromCaddyfile(t, oldCtx, block("a"))
	b := provisionFromCaddyfile(t, oldCtx, block("b"))
	require.Same(t, a.backend, b.backend, "one store per DSN and table")

	// A "reload": the new config provisions first, then the old one goes.
	newCtx, cancelNew := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancelNew)
	c := provisionFromCaddyfile(t, newCtx, block("a"))
	require.Same(t, a.backend, c.backend, "the reload reuses the pool")
	cancelOld() // cancels the old config's context and runs Cleanup of its modules...
	require.NoError(t, a.Cleanup())
	require.NoError(t, b.Cleanup())

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl, err := c.backend.Claim(ctx, store.ClaimParams{Scope: "a", EventID: "evt_after_reload", Lease: time.Second})
	require.NoError(t, err, "the store survived the old config's cleanup")
	require.Equal(t, store.Claimed, cl.Outcome)

	// Another table is another store.
	other := "shared_" + randomHex(6)
	t.Cleanup(func() { dropTable(dsn, other) })
	d := provisionFromCaddyfile(t, newCtx, "webhook_idempotency {\n provider stripe\n secret s\n storage postgres \""+dsn+"\"\n table "+other+"\n}")
	require.NotSame(t, c.backend, d.backend)

	be := c.backend
	require.NoError(t, c.Cleanup())
	require.NoError(t, d.Cleanup())
	_, err = be.Claim(ctx, store.ClaimParams{Scope: "a", EventID: "evt_closed", Lease: time.Second})
	require.Error(t, err, "the last cleanup closed the pool")
}

// A reload that changes a route's storage (or removes the route) while a
// forward runs: the old handler is cleaned up mid-forward, yet its claim must
// still settle in its store, or the event would be forwarded again after the
// lease (found by a new user's trial).
func TestForwardOutlivesItsConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	dsn := pgDSN(t)
	table := "outlive_" + randomHex(6)
	t.Cleanup(func() { dropTable(dsn, table) })
	secret := "whsec_" + randomHex(8)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	h := provisionFromCaddyfile(t, ctx, "webhook_idempotency {\n provider stripe\n secret "+secret+
		"\n lease 2s\n storage postgres \""+dsn+"\"\n table "+table+"\n}")

	entered, release := make(chan struct{}), make(chan struct{})
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		close(entered)
		<-release
		w.WriteHeader(http.StatusOK)
		return nil
	})
	id := "evt_" + randomHex(8)
	done := make(chan error, 1)
	req := stripeDelivery(t, "http://127.0.0.1/hook", secret, id, time.Now())
	go func() {
		done <- h.ServeHTTP(httptest.NewRecorder(), req, next)
	}()
	<-entered
	cancel() // the config is unloaded...
	require.NoError(t, h.Cleanup())
	time.Sleep(2500 * time.Millisecond) // ...for longer than the lease: the heartbeat must go on
	close(release)
	require.NoError(t, <-done)

	// A fresh store on the same table sees the event completed.
	ctx2, cancel2 := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel2)
	other := provisionFromCaddyfile(t, ctx2, "webhook_idempotency {\n provider stripe\n secret s\n storage postgres \""+dsn+
		"&application_name=after_reload\"\n table "+table+"\n}")
	t.Cleanup(func() { _ = other.Cleanup() })
	require.Eventually(t, func() bool {
		ev, err := other.backend.Get(context.Background(), "stripe", id)
		return err == nil && ev.State == store.StateCompleted
	}, 5*time.Second, 50*time.Millisecond)
}

// `table` without `storage` names the table of the default SQLite file
// (it used to fail with `unknown storage backend ""`).
func TestTableWithoutStorageUsesDefaultSQLite(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	h := provisionFromCaddyfile(t, ctx, "webhook_idempotency {\n provider stripe\n secret s\n table my_events\n}")
	t.Cleanup(func() { cancel(); _ = h.Cleanup() })
	require.Equal(t, "sqlite\x00"+caddy.AppDataDir()+"/webhook_idempotency/events.db\x00my_events", h.poolKey)
	cl, err := h.backend.Claim(context.Background(), store.ClaimParams{Scope: "stripe", EventID: "evt_t", Lease: time.Second})
	require.NoError(t, err)
	require.Equal(t, store.Claimed, cl.Outcome)
}

func TestScopeMustNotContainHash(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	h := new(Handler)
	require.NoError(t, h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("webhook_idempotency {\n provider stripe\n secret s\n scope a#body\n}")))
	require.ErrorContains(t, h.Provision(ctx), "scope")
}

// Routes of one storage keep their own cache sizes: a route with the
// default size answers its completed events from memory although a route
// with cache 5 opened the store first (one cache of the first route's size
// held 5 of 300); the admin API's forget reaches every cache.
func TestCacheSizePerRoute(t *testing.T) {
	small := newGateway(t, "webhook_idempotency {\nprovider stripe\nsecret whsec_x\nscope "+uniqueScope("small")+"\ncache 5\n}")
	big := newGateway(t, "webhook_idempotency {\nprovider stripe\nsecret whsec_x\nscope "+uniqueScope("big")+"\n}", sharingStore(small))
	require.Same(t, small.h.backend, big.h.backend, "one store")
	require.NotSame(t, small.h.completed, big.h.completed, "a cache per size")
	id := func(n int) string { return fmt.Sprintf("evt_size_%03d", n) }
	for n := range 300 {
		a := big.serve(withReplacer(stripeDelivery(t, "http://gateway.test/webhooks/stripe", "whsec_x", id(n), big.clock.Now())))
		require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	}
	big.h.claims.Settled()
	big.h.completed.Wait()
	known := 0
	for n := range 300 {
		if _, ok := big.h.completed.Has(big.h.Scope, id(n)); ok {
			known++
		}
	}
	require.Greater(t, known, 250, "the default-size route's cache holds its events (ristretto may drop a few writes)")

	forgetCached(big.h.Scope, id(0))
	_, ok := big.h.completed.Has(big.h.Scope, id(0))
	require.False(t, ok, "forgotten in every cache")
}
