package caddymodule

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/claim"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// rowLock holds a PostgreSQL row lock on an event's row from another
// session, so that the gateway's completion of it blocks until unlock.
type rowLock struct {
	conn *pgx.Conn
	tx   pgx.Tx
}

func lockRow(t *testing.T, g *gateway, scope, id string) *rowLock {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, g.storage.DSN)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	var state string
	err = tx.QueryRow(ctx, `SELECT state FROM `+pgx.Identifier{g.storage.Table}.Sanitize()+
		` WHERE scope = $1 AND event_id = $2 FOR UPDATE`, scope, id).Scan(&state)
	require.NoError(t, err)
	require.Equal(t, string(store.StateProcessing), state, "locked while claimed")
	return &rowLock{conn: conn, tx: tx}
}

// lockingOK is an upstream answer 200 "ok" that, on call n (its claim
// committed), first locks the row of the stripe event id into *lock.
func lockingOK(t *testing.T, g *gateway, n int, id string, lock **rowLock) func(http.ResponseWriter, *http.Request, int) error {
	return func(w http.ResponseWriter, r *http.Request, call int) error {
		if call == n {
			*lock = lockRow(t, g, "stripe", id)
		}
		return answerWith(http.StatusOK, "text/plain", "ok")(w, r, call)
	}
}

func (l *rowLock) unlock(t *testing.T) {
	t.Helper()
	require.NoError(t, l.tx.Rollback(context.Background()))
}

// TestCompletionAfterAnswer: once the upstream has answered 2xx, the
// provider gets that answer without waiting for the completion's commit
// (here blocked by a row lock); a duplicate on the same handler meanwhile
// waits for the completion and is answered as a duplicate, not 409; the
// upstream runs once; Cleanup's drain waits for a completion still being
// written.
func TestCompletionAfterAnswer(t *testing.T) {
	t.Parallel()
	g := newGateway(t, `webhook_idempotency {
		provider stripe
		secret whsec_after
		cache 0
	}`, onPostgres())
	var lock *rowLock
	g.up.respond = lockingOK(t, g, 1, "evt_after", &lock)
	body := []byte(`{"id":"evt_after","object":"event"}`)

	start := time.Now()
	a := g.serve(g.stripe("whsec_after", body, g.clock.Unix()))
	requireRelayed(t, a)
	require.Less(t, time.Since(start), storeTimeout,
		"answered while the completion was blocked, not after the store gave up on it")
	require.NotNil(t, lock)

	dup := make(chan answer, 1)
	go func() { dup <- g.serve(g.stripe("whsec_after", body, g.clock.Unix())) }()
	select {
	case d := <-dup:
		t.Fatalf("duplicate answered %d before the completion was written: %s", d.status, d.body)
	case <-time.After(300 * time.Millisecond):
	}
	lock.unlock(t)
	select {
	case d := <-dup:
		requireDuplicate(t, d)
	case <-time.After(2 * storeTimeout):
		t.Fatal("duplicate not answered after the completion was written")
	}
	require.Equal(t, 1, g.up.count())
	g.requireRow("stripe", "evt_after", store.StateCompleted)

	// Cleanup's drain: a completion blocked by a lock is waited for.
	body2 := []byte(`{"id":"evt_after_2","object":"event"}`)
	g.up.respond = lockingOK(t, g, 2, "evt_after_2", &lock)
	requireRelayed(t, g.serve(g.stripe("whsec_after", body2, g.clock.Unix())))
	drained := make(chan struct{})
	go func() {
		g.h.claims.Drain()
		close(drained)
	}()
	select {
	case <-drained:
		t.Fatal("drain returned while a completion was still blocked")
	case <-time.After(300 * time.Millisecond):
	}
	lock.unlock(t)
	select {
	case <-drained:
	case <-time.After(claim.DefaultDrainFor + time.Second):
		t.Fatal("drain did not return after the completion was written")
	}
	e, err := g.h.backend.Get(context.Background(), "stripe", "evt_after_2") // no wait: the drain did it
	require.NoError(t, err)
	require.Equal(t, store.StateCompleted, e.State)
}

// TestCompletionAfterAnswerAnotherRoute: a completion one route is writing
// after its answer is awaited by another route of the same scope on the
// same store, as by the route itself: the completions being written are
// registered on the pooled store, which the handlers of a reloaded config
// share too. A duplicate through the other route is then answered as a
// duplicate, not 409, and the upstream runs once.
func TestCompletionAfterAnswerAnotherRoute(t *testing.T) {
	t.Parallel()
	cfg := `webhook_idempotency {
		provider stripe
		secret whsec_routes
		cache 0
	}`
	g1 := newGateway(t, cfg, onPostgres())
	g2 := newGateway(t, cfg, sharingStore(g1))
	require.Same(t, g1.h.backend, g2.h.backend, "two routes, one pooled store")
	var lock *rowLock
	g1.up.respond = lockingOK(t, g1, 1, "evt_routes", &lock)
	body := []byte(`{"id":"evt_routes","object":"event"}`)
	requireRelayed(t, g1.serve(g1.stripe("whsec_routes", body, g1.clock.Unix())))
	require.NotNil(t, lock)

	awaited := make(chan bool, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*storeTimeout)
		defer cancel()
		awaited <- g2.h.claims.Await(ctx, "stripe", "evt_routes")
	}()
	select {
	case ok := <-awaited:
		t.Fatalf("the other route did not wait for the completion being written (awaited: %v)", ok)
	case <-time.After(300 * time.Millisecond):
	}
	lock.unlock(t)
	require.True(t, <-awaited, "the other route waited for the completion")
	requireDuplicate(t, g2.serve(g2.stripe("whsec_routes", body, g2.clock.Unix())))
	require.Equal(t, 1, g1.up.count())
	g2.requireRow("stripe", "evt_routes", store.StateCompleted)
}
