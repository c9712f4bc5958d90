package sqlite_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/sqlite"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/storetest"
)

func newStore(t *testing.T, opts sqlite.Options) *sqlite.Store {
	t.Helper()
	if opts.Path == "" {
		opts.Path = filepath.Join(t.TempDir(), "events.db")
	}
	s, err := sqlite.New(t.Context(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) store.Store {
		return newStore(t, sqlite.Options{})
	})
}

func TestNewCreatesDirectory(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "a", "b")
	s := newStore(t, sqlite.Options{Path: filepath.Join(dir, "events.db")})

	fi, err := os.Stat(dir)
	require.NoError(t, err)
	require.True(t, fi.IsDir())
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm())

	var mode string
	require.NoError(t, s.DB().QueryRowContext(t.Context(), "PRAGMA journal_mode").Scan(&mode))
	require.Equal(t, "wal", mode)
	// Event IDs and stored answers: the database and its WAL files are
	// Caddy's user's only, whatever the umask.
	c, err := s.Claim(t.Context(), store.ClaimParams{Scope: "s", EventID: "e", Lease: time.Minute})
	require.NoError(t, err)
	require.NoError(t, s.Complete(t.Context(), "s", "e", c.Token, 200))
	for _, name := range []string{"events.db", "events.db-wal", "events.db-shm"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), name)
	}
	var busy int
	require.NoError(t, s.DB().QueryRowContext(t.Context(), "PRAGMA busy_timeout").Scan(&busy))
	require.Positive(t, busy)
}

func TestNewOddPath(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "we?ird #dir %20", "ev ents?.db")
	s := newStore(t, sqlite.Options{Path: path})
	c, err := s.Claim(t.Context(), store.ClaimParams{Scope: "s", EventID: "e", Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c.Outcome)
	_, err = os.Stat(path)
	require.NoError(t, err, "the database is at the exact path given")
}

func TestReopenKeepsData(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "events.db")

	s1, err := sqlite.New(t.Context(), sqlite.Options{Path: path, Table: "hooks"})
	require.NoError(t, err)
	c, err := s1.Claim(t.Context(), store.ClaimParams{Scope: "s", EventID: "e", Lease: time.Minute})
	require.NoError(t, err)
	require.NoError(t, s1.Complete(t.Context(), "s", "e", c.Token, 202))
	require.NoError(t, s1.Close())

	s2 := newStore(t, sqlite.Options{Path: path, Table: "hooks"})
	d, err := s2.Claim(t.Context(), store.ClaimParams{Scope: "s", EventID: "e", Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, store.Duplicate, d.Outcome)
	require.Equal(t, 202, d.Status)
}

func TestNewConcurrentOpen(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "events.db")

	const n = 4
	var (
		wg     sync.WaitGroup
		stores = make([]*sqlite.Store, n)
		errs   = make([]error, n)
	)
	for i := range n {
		wg.Go(func() {
			stores[i], errs[i] = sqlite.New(t.Context(), sqlite.Options{Path: path})
		})
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i], "store %d", i)
		t.Cleanup(func() { _ = stores[i].Close() })
	}

	var applied int
	require.NoError(t, stores[0].DB().QueryRowContext(t.Context(),
		`SELECT count(*) FROM webhook_events_goose_version WHERE version_id = 1`).Scan(&applied))
	require.Equal(t, 1, applied, "migration applied once")

	// Separate handles on one file (as separate processes would be) still
	// agree through the primary key.
	var (
		mu  sync.Mutex
		won int
	)
	for i := range 40 {
		wg.Go(func() {
			c, err := stores[i%n].Claim(t.Context(), store.ClaimParams{Scope: "s", EventID: "e", Lease: time.Minute})
			if err != nil {
				t.Errorf("claim: %v", err)
				return
			}
			if c.Outcome == store.Claimed {
				mu.Lock()
				won++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Equal(t, 1, won)
}

func TestNewInvalidOptions(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	blocker := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(blocker, nil, 0o600))

	tests := []struct {
		name    string
		opts    sqlite.Options
		wantErr string
	}{
		{name: "no path", opts: sqlite.Options{}, wantErr: "path is required"},
		{name: "bad table", opts: sqlite.Options{Path: filepath.Join(dir, "x.db"), Table: `a"b`}, wantErr: "invalid table name"},
		{name: "schema table", opts: sqlite.Options{Path: filepath.Join(dir, "x.db"), Table: "main.events"}, wantErr: "invalid table name"},
		{name: "parent is a file", opts: sqlite.Options{Path: filepath.Join(blocker, "x.db")}, wantErr: "creating directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := sqlite.New(t.Context(), tc.opts)
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestManyTablesOneFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "events.db")
	for i := range 2 {
		s := newStore(t, sqlite.Options{Path: path, Table: fmt.Sprintf("t%d", i)})
		c, err := s.Claim(t.Context(), store.ClaimParams{Scope: "s", EventID: "e", Lease: time.Minute})
		require.NoError(t, err)
		require.Equal(t, store.Claimed, c.Outcome, "tables are independent")
	}
}

func TestSecretsConformance(t *testing.T) {
	t.Parallel()
	var (
		mu    sync.Mutex
		paths = map[store.Store]string{}
	)
	storetest.RunSecrets(t, func(t *testing.T) store.Store {
		path := filepath.Join(t.TempDir(), "events.db")
		s := newStore(t, sqlite.Options{Path: path})
		mu.Lock()
		paths[s] = path
		mu.Unlock()
		return s
	}, func(t *testing.T, s store.Store) store.Store {
		mu.Lock()
		path := paths[s]
		mu.Unlock()
		// A restart: the first store is closed before the second opens.
		require.NoError(t, s.Close())
		reopened, err := sqlite.New(t.Context(), sqlite.Options{Path: path})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, reopened.Close()) })
		return reopened
	})
}

// TestUpgradeAddsHoldReason: a file an earlier version migrated (goose at
// version 3, no hold_reason, no ambiguous) is brought up at the next start:
// an event it held reads with no reason and no ambiguous ending, and new
// holds record theirs.
func TestUpgradeAddsHoldReason(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "events.db")
	s, err := sqlite.New(ctx, sqlite.Options{Path: path})
	require.NoError(t, err)
	c, err := s.Claim(ctx, store.ClaimParams{Scope: "s", EventID: "old", Lease: time.Minute})
	require.NoError(t, err)
	require.NoError(t, s.Hold(ctx, "s", "old", c.Token, "before the upgrade"))
	for _, q := range []string{
		`ALTER TABLE webhook_events DROP COLUMN hold_reason`,
		`ALTER TABLE webhook_events DROP COLUMN ambiguous`,
		`DELETE FROM webhook_events_goose_version WHERE version_id >= 4`,
	} {
		_, err := s.DB().ExecContext(ctx, q)
		require.NoError(t, err)
	}
	require.NoError(t, s.Close())

	s = newStore(t, sqlite.Options{Path: path})
	ev, err := s.Get(ctx, "s", "old")
	require.NoError(t, err)
	require.Equal(t, store.StateHeld, ev.State)
	require.Empty(t, ev.HoldReason)
	require.Zero(t, ev.Ambiguous)
	c, err = s.Claim(ctx, store.ClaimParams{Scope: "s", EventID: "new", Lease: time.Minute})
	require.NoError(t, err)
	require.NoError(t, s.Hold(ctx, "s", "new", c.Token, "after the upgrade"))
	ev, err = s.Get(ctx, "s", "new")
	require.NoError(t, err)
	require.Equal(t, "after the upgrade", ev.HoldReason)
	require.Equal(t, 1, ev.Ambiguous)
}

// A database an earlier version made with the umask's 0644 (and its WAL
// files) is closed to other users when opened; the group's bits stay.
func TestNewClosesAnOldFileToOthers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "events.db")
	s := newStore(t, sqlite.Options{Path: path})
	require.NoError(t, s.Close())
	require.NoError(t, os.WriteFile(path+"-wal", nil, 0o600)) // an empty WAL, as a crash leaves one
	for _, p := range []string{path, path + "-wal"} {
		require.NoError(t, os.Chmod(p, 0o644))
	}
	s = newStore(t, sqlite.Options{Path: path})
	_, err := s.Claim(t.Context(), store.ClaimParams{Scope: "s", EventID: "e", Lease: time.Minute})
	require.NoError(t, err)
	for _, name := range []string{"events.db", "events.db-wal"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o640), fi.Mode().Perm(), name)
	}
}
