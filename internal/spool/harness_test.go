package spool_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/spool"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/sqlite"
)

// testBundle is a spool in a fresh directory, a real SQLite store that can
// be taken down (closed) and brought back (reopened on the same file), and
// an upstream that records every forward.
type testBundle struct {
	dir   string
	opts  spool.Options
	sp    *spool.Spool
	db    string
	store atomic.Pointer[sqlite.Store]
	up    *upstream
}

func setup(t *testing.T, mutate ...func(*spool.Options)) *testBundle {
	t.Helper()
	base := t.TempDir()
	b := &testBundle{dir: filepath.Join(base, "spool"), db: filepath.Join(base, "events.db"), up: &upstream{}}
	b.opts = spool.Options{Dir: b.dir, StoreRetry: 20 * time.Millisecond, MaxStoreRetry: 50 * time.Millisecond,
		RetryMin: 10 * time.Millisecond, RetryMax: 40 * time.Millisecond}
	for _, m := range mutate {
		m(&b.opts)
	}
	b.storeUp(t)
	t.Cleanup(func() {
		if st := b.store.Swap(nil); st != nil {
			_ = st.Close()
		}
	})
	b.reopen(t)
	return b
}

// reopen closes the spool (if open) and opens it again, as a restarted
// gateway does.
func (b *testBundle) reopen(t *testing.T) {
	t.Helper()
	if b.sp != nil {
		require.NoError(t, b.sp.Close())
	}
	sp, err := spool.Open(b.opts)
	require.NoError(t, err)
	b.sp = sp
	t.Cleanup(func() { _ = sp.Close() })
}

// storeDown closes the store: every call fails as with an unreachable
// database.
func (b *testBundle) storeDown(t *testing.T) {
	t.Helper()
	st := b.store.Swap(nil)
	require.NotNil(t, st)
	require.NoError(t, st.Close())
}

// storeUp opens the store on its file.
func (b *testBundle) storeUp(t *testing.T) {
	t.Helper()
	st, err := sqlite.New(t.Context(), sqlite.Options{Path: b.db})
	require.NoError(t, err)
	require.Nil(t, b.store.Swap(st))
	if b.sp != nil {
		b.sp.Poke()
	}
}

// claimStore is the store as a delivery sees it: nil while down.
func (b *testBundle) claimStore() store.Store {
	if st := b.store.Load(); st != nil {
		return st
	}
	return nil
}

// deliver is the Deliverer a gateway attaches, over the real store: claim
// with the live path's rules (spool.ForClaim), forward, settle.
func (b *testBundle) deliver(ctx context.Context, r *spool.Record) spool.Result {
	st := b.claimStore()
	if st == nil {
		return spool.Result{Outcome: spool.Unavailable}
	}
	c, err := st.Claim(ctx, store.ClaimParams{Scope: r.Scope, EventID: r.EventID, Lease: 30 * time.Second})
	if res, ok := spool.ForClaim(c, err); ok {
		return res
	}
	if status := b.up.forward(r); status/100 != 2 {
		if err := st.Release(ctx, r.Scope, r.EventID, c.Token); err != nil {
			return spool.Result{Outcome: spool.Unavailable}
		}
		return spool.Result{Outcome: spool.Refused}
	}
	if err := st.Complete(ctx, r.Scope, r.EventID, c.Token, http.StatusOK); err != nil {
		// The claim stays processing until its lease ends; the record
		// is tried again and waits for it.
		return spool.Result{Outcome: spool.Unavailable}
	}
	return spool.Result{Outcome: spool.Forwarded}
}

// upstream records the forwards it gets and answers from a script.
type upstream struct {
	mu       sync.Mutex
	forwards []*spool.Record
	// refuse holds, per event ID, how many forwards get 500 first.
	refuse map[string]int
}

func (u *upstream) forward(r *spool.Record) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.forwards = append(u.forwards, r)
	if u.refuse[r.EventID] > 0 {
		u.refuse[r.EventID]--
		return http.StatusInternalServerError
	}
	return http.StatusOK
}

// ids returns the event IDs of every forward, in order.
func (u *upstream) ids() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var ids []string
	for _, r := range u.forwards {
		ids = append(ids, r.EventID)
	}
	return ids
}

func (u *upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.forwards)
}

// record is a GitHub-like delivery of event id.
func record(id string) *spool.Record {
	return &spool.Record{
		Scope: "github", EventID: id, Method: http.MethodPost, Host: "hooks.example.com",
		URI: "/github?x=1", Proto: "HTTP/1.1", Scheme: "https", RemoteAddr: "192.0.2.7:41000",
		Header: http.Header{
			"X-Github-Delivery":   {id},
			"X-Hub-Signature-256": {"sha256=" + id},
			"Content-Type":        {"application/json"},
		},
		Body: []byte(`{"delivery":"` + id + `"}`),
	}
}

func appendAll(t *testing.T, sp *spool.Spool, ids ...string) {
	t.Helper()
	for _, id := range ids {
		require.NoError(t, sp.Append(t.Context(), record(id)))
	}
}

// waitFor polls cond every 5ms for at most within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// segmentFiles lists the spool's segment and ack files.
func segmentFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "seg-*"))
	require.NoError(t, err)
	return m
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	return fi.Mode().Perm()
}
