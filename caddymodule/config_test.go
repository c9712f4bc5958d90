package caddymodule

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/stretchr/testify/require"
)

// A refused config is refused before any I/O: an async route whose DSN
// points at a closed port gets its config error at once, not a connection
// error, and no store is left in the pool. The same route with a valid
// config does dial: the port is closed, so it loads with its store pending
// (opened in the background), and the store is released at cleanup.
func TestRefusedConfigOpensNoStore(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	st := Storage{Backend: "postgres", DSN: "postgres://postgres@" + addr + "/test?sslmode=disable&connect_timeout=5", Table: "refused_config"}

	var pending bool
	provision := func(extra string) (time.Duration, error) {
		h := new(Handler)
		require.NoError(t, h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(
			"webhook_idempotency {\nprovider stripe\nsecret whsec_x\nmode async\ndeliver_to http://127.0.0.1:9\n"+extra+"}")))
		s := st
		h.Storage = &s
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		defer cancel()
		t0 := time.Now()
		err := h.Provision(ctx)
		took := time.Since(t0)
		pending = h.backend != nil && h.backend.pending != nil && !h.backend.pending.Ready()
		_ = h.Cleanup()
		return took, err
	}

	for _, c := range []struct{ extra, want string }{
		{"max_age 100d\n", "max_age: must be positive and at most retention"},
		{"retention 1h\n", "retention: must be at least"},
		{"on_ambiguous maybe\n", "on_ambiguous: want reforward or hold"},
		{"order_key form x\n", "order_key: want json <path> or header <name>"},
		{"refuse_status 200\n", "refuse_status: want a 4xx status"},
		{"verify_token t\n", "verify_token: provider stripe has no handshake with a verify token"},
		{"learned_secret replace\n", "learned_secret: provider stripe learns no secret"},
		{"batch split\n", "batch: provider stripe sends one event per delivery"},
	} {
		took, err := provision(c.extra)
		require.ErrorContains(t, err, c.want, c.extra)
		require.NotContains(t, err.Error(), "storage", c.extra)
		require.Less(t, took, time.Second, c.extra)
		n, used := backends.References(st.poolKey())
		require.False(t, used, "%s: a store is pooled (%d references)", c.extra, n)
	}

	_, err = provision("")
	require.NoError(t, err, "a valid config loads with its store unreachable")
	require.True(t, pending, "a valid config dials the closed port: its store is pending")
	n, used := backends.References(st.poolKey())
	require.False(t, used, "the pending store is released at cleanup (%d references)", n)
}
