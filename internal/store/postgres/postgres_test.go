package postgres_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/storetest"
)

const defaultTestDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

var (
	reachOnce sync.Once
	reachErr  error
)

// testDSN returns the test database's DSN (TEST_DATABASE_URL, else the local
// default). An unreachable server fails the test, or skips it under -short.
func testDSN(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv("TEST_DATABASE_URL")
	if dsn == "" {
		dsn = defaultTestDSN
	}
	reachOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			reachErr = err
			return
		}
		reachErr = conn.Ping(ctx)
		_ = conn.Close(ctx)
	})
	if reachErr != nil {
		if testing.Short() {
			t.Skipf("PostgreSQL unreachable, skipped under -short: %v", reachErr)
		}
		t.Fatalf("PostgreSQL unreachable: %v\n"+
			"Point TEST_DATABASE_URL at a server (default %s), or run with -short to skip.",
			reachErr, defaultTestDSN)
	}
	return dsn
}

// tableName is a fresh table name for one test.
func tableName() string {
	return "wh_test_" + store.NewToken()[:16]
}

// dropTable drops a test table and everything the store made next to it.
func dropTable(t *testing.T, dsn, table string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	tbl, err := store.ParseTable(table)
	require.NoError(t, err)
	require.NoError(t, postgres.Drop(ctx, pool, tbl))
}

func newStore(t *testing.T, opts postgres.Options) *postgres.Store {
	t.Helper()
	dsn := testDSN(t)
	if opts.DSN == "" {
		opts.DSN = dsn
	}
	if opts.Table == "" {
		opts.Table = tableName()
	}
	t.Cleanup(func() { dropTable(t, dsn, opts.Table) })
	s, err := postgres.New(t.Context(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

func TestConformance(t *testing.T) {
	t.Parallel()
	testDSN(t)
	storetest.Run(t, func(t *testing.T) store.Store {
		return newStore(t, postgres.Options{})
	})
}

func TestNewConcurrentMigrations(t *testing.T) {
	t.Parallel()
	dsn := testDSN(t)
	table := tableName()
	t.Cleanup(func() { dropTable(t, dsn, table) })

	const n = 4
	var (
		wg     sync.WaitGroup
		stores = make([]*postgres.Store, n)
		errs   = make([]error, n)
	)
	for i := range n {
		wg.Go(func() {
			stores[i], errs[i] = postgres.New(t.Context(), postgres.Options{DSN: dsn, Table: table})
		})
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i], "store %d", i)
		t.Cleanup(func() { _ = stores[i].Close() })
	}

	// They all see one table.
	c, err := stores[0].Claim(t.Context(), store.ClaimParams{Scope: "s", EventID: "e", Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c.Outcome)
	c, err = stores[n-1].Claim(t.Context(), store.ClaimParams{Scope: "s", EventID: "e", Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, store.InFlight, c.Outcome)

	// One migration recorded, once.
	var applied int
	err = stores[0].Pool().QueryRow(t.Context(),
		"SELECT count(*) FROM "+pgx.Identifier{table + "_goose_version"}.Sanitize()+" WHERE version_id = 1").Scan(&applied)
	require.NoError(t, err)
	require.Equal(t, 1, applied)

	// Retention's index leads with the scope (migration 2); the plain
	// first_seen index it replaced is gone, and so is the (state,
	// updated_at) index (migration 7), so a settle can be a HOT update.
	rows, err := stores[0].Pool().Query(t.Context(),
		"SELECT indexname FROM pg_indexes WHERE tablename = $1 ORDER BY indexname", table)
	require.NoError(t, err)
	indexes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{table + "_pkey", table + "_scope_first_seen_idx"}, indexes)

	// A later start finds the schema current.
	again, err := postgres.New(t.Context(), postgres.Options{DSN: dsn, Table: table})
	require.NoError(t, err)
	require.NoError(t, again.Close())
}

func TestSchemaQualifiedTable(t *testing.T) {
	t.Parallel()
	dsn := testDSN(t)
	schema := "wh_schema_" + store.NewToken()[:12]

	ctx := t.Context()
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		require.NoError(t, err)
	})

	s := newStore(t, postgres.Options{Table: schema + ".events"})
	require.Equal(t, schema+".events", s.Table().String())
	c, err := s.Claim(ctx, store.ClaimParams{Scope: "s", EventID: "e", Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c.Outcome)

	var n int
	require.NoError(t, pool.QueryRow(ctx,
		"SELECT count(*) FROM pg_tables WHERE schemaname = $1", schema).Scan(&n))
	require.Equal(t, 5, n, "events table, learned secrets, enrollment windows and their goose histories in the schema")
}

func TestNewInvalidOptions(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name    string
		opts    postgres.Options
		wantErr string
	}{
		{name: "no DSN", opts: postgres.Options{}, wantErr: "DSN is required"},
		{name: "uppercase table", opts: postgres.Options{DSN: defaultTestDSN, Table: "Events"}, wantErr: "invalid table name"},
		{name: "quote in table", opts: postgres.Options{DSN: defaultTestDSN, Table: `ev"ents`}, wantErr: "invalid table name"},
		{name: "injection", opts: postgres.Options{DSN: defaultTestDSN, Table: "t; DROP TABLE x"}, wantErr: "invalid table name"},
		{name: "three parts", opts: postgres.Options{DSN: defaultTestDSN, Table: "a.b.c"}, wantErr: "invalid table name"},
		{name: "empty part", opts: postgres.Options{DSN: defaultTestDSN, Table: ".events"}, wantErr: "invalid table name"},
		{name: "too long", opts: postgres.Options{DSN: defaultTestDSN, Table: strings.Repeat("t", 41)}, wantErr: "invalid table name"},
		{name: "digit first", opts: postgres.Options{DSN: defaultTestDSN, Table: "1events"}, wantErr: "invalid table name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := postgres.New(t.Context(), tc.opts)
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestNewRedactsPassword(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-Pa55"

	tests := []struct {
		name string
		dsn  string
	}{
		{name: "unreachable URL", dsn: "postgres://user:" + secret + "@127.0.0.1:1/db?sslmode=disable&connect_timeout=1"},
		{name: "unreachable key value", dsn: "host=127.0.0.1 port=1 user=u password=" + secret + " dbname=db sslmode=disable connect_timeout=1"},
		{name: "quoted key value", dsn: "host=127.0.0.1 port=1 user=u password='" + secret + " x' dbname=db connect_timeout=1"},
		{name: "bad port", dsn: "postgres://user:" + secret + "@127.0.0.1:notaport/db"},
		{name: "slash in password", dsn: "postgres://user:" + secret + "/x@127.0.0.1/db"},
		{name: "query password", dsn: "postgres://user@127.0.0.1:1/db?password=" + secret + "&connect_timeout=1&sslmode=disable"},
		{name: "bad key value", dsn: "host=127.0.0.1 password=" + secret + " bogus"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := postgres.New(t.Context(), postgres.Options{DSN: tc.dsn, ConnectTimeout: 2 * time.Second})
			require.Error(t, err)
			require.NotContains(t, err.Error(), secret)
			require.NotContains(t, err.Error(), "s3cr3t")
			t.Log(err)
		})
	}
}

func TestNewUnreachable(t *testing.T) {
	t.Parallel()
	start := time.Now()
	_, err := postgres.New(t.Context(), postgres.Options{
		DSN:            "postgres://postgres@10.255.255.1:5432/test?sslmode=disable",
		ConnectTimeout: 300 * time.Millisecond,
	})
	require.ErrorContains(t, err, "connecting to postgres")
	require.Less(t, time.Since(start), 5*time.Second, "the ping deadline bounds New")
}

func TestDriverErrorsMapped(t *testing.T) {
	t.Parallel()
	s := newStore(t, postgres.Options{})

	// Postgres refuses NUL bytes in text: the driver's error must not
	// escape as a pgconn type.
	_, err := s.Claim(t.Context(), store.ClaimParams{Scope: "s", EventID: "nul\x00byte", Lease: time.Minute})
	require.Error(t, err)
	require.NotErrorIs(t, err, store.ErrNotFound)
	require.NotContains(t, fmt.Sprintf("%T", unwrapAll(err)), "pgconn")

	// A dropped table is a store failure, not "not found".
	_, err = s.Pool().Exec(t.Context(), "DROP TABLE "+pgx.Identifier{s.Table().String()}.Sanitize())
	require.NoError(t, err)
	_, err = s.Get(t.Context(), "s", "e")
	require.Error(t, err)
	require.NotErrorIs(t, err, store.ErrNotFound)
	require.Contains(t, err.Error(), "SQLSTATE 42P01")
	require.NotContains(t, fmt.Sprintf("%T", unwrapAll(err)), "pgconn")
}

func unwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok || u.Unwrap() == nil {
			return err
		}
		err = u.Unwrap()
	}
}

func TestSecretsConformance(t *testing.T) {
	t.Parallel()
	dsn := testDSN(t)
	storetest.RunSecrets(t, func(t *testing.T) store.Store {
		return newStore(t, postgres.Options{})
	}, func(t *testing.T, s store.Store) store.Store {
		// A second instance on the same database and table.
		other, err := postgres.New(t.Context(), postgres.Options{DSN: dsn, Table: s.(*postgres.Store).Table().String()})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, other.Close()) })
		return other
	})
}

// TestUpgradeAddsHoldReason: a table an earlier version migrated (goose at
// version 3, no hold_reason, no ambiguous) is brought up at the next start:
// an event it held reads with no reason and no ambiguous ending, and new
// holds record theirs.
func TestUpgradeAddsHoldReason(t *testing.T) {
	t.Parallel()
	dsn := testDSN(t)
	table := tableName()
	t.Cleanup(func() { dropTable(t, dsn, table) })
	ctx := t.Context()
	s, err := postgres.New(ctx, postgres.Options{DSN: dsn, Table: table})
	require.NoError(t, err)
	c, err := s.Claim(ctx, store.ClaimParams{Scope: "s", EventID: "old", Lease: time.Minute})
	require.NoError(t, err)
	require.NoError(t, s.Hold(ctx, "s", "old", c.Token, "before the upgrade"))
	for _, q := range []string{
		"ALTER TABLE " + pgx.Identifier{table}.Sanitize() + " DROP COLUMN hold_reason",
		"ALTER TABLE " + pgx.Identifier{table}.Sanitize() + " DROP COLUMN ambiguous",
		"DROP FUNCTION " + pgx.Identifier{table + "_commit"}.Sanitize() + "(text)",
		"DELETE FROM " + pgx.Identifier{table + "_goose_version"}.Sanitize() + " WHERE version_id >= 4",
	} {
		_, err := s.Pool().Exec(ctx, q)
		require.NoError(t, err)
	}
	require.NoError(t, s.Close())

	s = newStore(t, postgres.Options{DSN: dsn, Table: table})
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

// TestGaveUpAfterCommit: the one-statement claim path on PostgreSQL
// (storetest.RunGaveUp).
func TestGaveUpAfterCommit(t *testing.T) {
	t.Parallel()
	s := newStore(t, postgres.Options{})
	storetest.RunGaveUp(t, postgres.Driver(s), s.Get)
}

// TestCompletionsAreHOTUpdates: a completion changes no indexed column
// (migration 7 dropped the (state, updated_at) index) and mostly finds room
// on its row's page (fillfactor 80), so PostgreSQL writes it as a heap-only
// tuple, with no new entry in any index. Eight senders each claim then
// complete their events in turn, batched, as a gateway's deliveries do
// (0 of them were HOT before migration 7; 81% in the load benchmark).
func TestCompletionsAreHOTUpdates(t *testing.T) {
	t.Parallel()
	s := newStore(t, postgres.Options{})
	ctx := t.Context()
	const senders, each = 8, 50
	var wg sync.WaitGroup
	errs := make([]error, senders)
	for w := range senders {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("evt_hot_%d_%03d", w, i)
				c, err := s.Claim(ctx, store.ClaimParams{Scope: "stripe", EventID: id, Lease: time.Minute})
				if err == nil && c.Outcome != store.Claimed {
					err = fmt.Errorf("claim %s: %s", id, c.Outcome)
				}
				if err == nil {
					err = s.Complete(ctx, "stripe", id, c.Token, 200)
				}
				if err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}

	// Backends report their counters when idle, within about ten seconds.
	name := s.Table().String()
	var upd, hot int64
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		require.NoError(t, s.Pool().QueryRow(ctx,
			`SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = $1::regclass`, name).Scan(&upd, &hot))
		if upd >= senders*each {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("%d of %d updates HOT", hot, upd)
	require.GreaterOrEqual(t, upd, int64(senders*each), "every completion is counted")
	require.GreaterOrEqual(t, hot*2, upd, "at least half of the completions are HOT: %d of %d", hot, upd)
}
