package postgres_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// commitBundle is an upstream application's side of complete_by upstream:
// its own pool on the gateway's database and an effects table, written in
// the same transaction as the <table>_commit call, as the examples do.
type commitBundle struct {
	s       *postgres.Store
	app     *pgxpool.Pool
	fn      string // the quoted <table>_commit
	effects string // the quoted effects table
}

func setupCommit(t *testing.T, opts postgres.Options) *commitBundle {
	t.Helper()
	s := newStore(t, opts)
	app, err := pgxpool.New(t.Context(), testDSN(t))
	require.NoError(t, err)
	t.Cleanup(app.Close)
	tbl := s.Table()
	fn := pgx.Identifier{postgres.CommitFunction(tbl).Name}
	effects := pgx.Identifier{tbl.Name + "_effects"}
	if tbl.Schema != "" {
		fn = pgx.Identifier{tbl.Schema, fn[0]}
		effects = pgx.Identifier{tbl.Schema, effects[0]}
	}
	b := &commitBundle{s: s, app: app, fn: fn.Sanitize(), effects: effects.Sanitize()}
	_, err = app.Exec(t.Context(), `CREATE TABLE `+b.effects+` (event_id text NOT NULL)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = app.Exec(context.Background(), `DROP TABLE IF EXISTS `+b.effects) })
	return b
}

// claim claims eventID with lease and returns its token and claim value.
func (b *commitBundle) claim(t *testing.T, eventID string, lease time.Duration) (token, value string) {
	t.Helper()
	c, err := b.s.Claim(t.Context(), store.ClaimParams{Scope: "s", EventID: eventID, Lease: lease})
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c.Outcome)
	return c.Token, store.ClaimValue("s", eventID, c.Token)
}

// work begins the application's transaction: its effect, then the call.
func (b *commitBundle) work(t *testing.T, eventID, value string) (pgx.Tx, error) {
	t.Helper()
	tx, err := b.app.Begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(t.Context(), `INSERT INTO `+b.effects+` VALUES ($1)`, eventID)
	require.NoError(t, err)
	_, err = tx.Exec(t.Context(), `SELECT `+b.fn+`($1)`, value)
	return tx, err
}

func (b *commitBundle) effectsOf(t *testing.T, eventID string) int {
	t.Helper()
	var n int
	require.NoError(t, b.app.QueryRow(t.Context(), `SELECT count(*) FROM `+b.effects+` WHERE event_id = $1`, eventID).Scan(&n))
	return n
}

func (b *commitBundle) conclude(t *testing.T, eventID, token string, status int, wait time.Duration) store.Truth {
	t.Helper()
	truth, err := b.s.Conclude(t.Context(), store.ConcludeParams{Scope: "s", EventID: eventID, Token: token,
		Status: status, Wait: wait})
	require.NoError(t, err)
	return truth
}

// requireSQLState requires err to be a PostgreSQL error with code and
// returns its message, hint and detail together.
func requireSQLState(t *testing.T, err error, code string) string {
	t.Helper()
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "want SQLSTATE %s", code)
	require.Equal(t, code, pgErr.Code, pgErr.Message)
	return pgErr.Message + pgErr.Hint + pgErr.Detail
}

func TestClaimValueRoundTrip(t *testing.T) {
	t.Parallel()
	token := store.NewToken()
	for _, id := range []string{"evt_1", "a.b.c", "ünï 🙂", strings.Repeat("x", 255)} {
		v := store.ClaimValue("stripe", id, token)
		// The value is hex-encoded so that the commit function's argument
		// never has to be escaped; the ID must not appear verbatim. (Testing
		// for a fragment of it failed whenever the random token held it.)
		require.NotContains(t, v, id, "the event ID is not readable in the value")
		scope, eventID, tok, ok := store.ParseClaimValue(v)
		require.True(t, ok, v)
		require.Equal(t, []string{"stripe", id, token}, []string{scope, eventID, tok})
	}
	for _, bad := range []string{"", "1", "1." + token, "2." + token + ".73.65", "1." + token[1:] + ".73.65",
		"1." + token + ".73.", "1." + token + ".7.65", "1." + strings.ToUpper(token) + ".73.65", "1." + token + ".73.6G"} {
		_, _, _, ok := store.ParseClaimValue(bad)
		require.False(t, ok, bad)
	}
}

// TestCommitFunction: the upstream's transaction commits its work and the
// claim together; the gateway's conclusion reads committed, records the
// status it saw, and later deliveries are duplicates.
func TestCommitFunction(t *testing.T) {
	t.Parallel()
	b := setupCommit(t, postgres.Options{})
	token, value := b.claim(t, "e1", time.Minute)

	tx, err := b.work(t, "e1", value)
	require.NoError(t, err)
	_, err = tx.Exec(t.Context(), `SELECT `+b.fn+`($1)`, value)
	require.NoError(t, err, "a second call in the same transaction succeeds")
	_, err = tx.Exec(t.Context(), `SAVEPOINT sp`)
	require.NoError(t, err)
	_, err = tx.Exec(t.Context(), `SELECT `+b.fn+`($1)`, value)
	require.NoError(t, err, "and from a savepoint")
	require.NoError(t, tx.Commit(t.Context()))

	ev, err := b.s.Get(t.Context(), "s", "e1")
	require.NoError(t, err)
	require.Equal(t, store.StateCompleted, ev.State, "completed by the upstream's commit alone")

	require.Equal(t, store.TruthCommitted, b.conclude(t, "e1", token, 502, time.Second))
	ev, err = b.s.Get(t.Context(), "s", "e1")
	require.NoError(t, err)
	require.Equal(t, store.StateCompleted, ev.State)
	require.Equal(t, 502, ev.Status, "the answer the gateway saw is recorded")

	c, err := b.s.Claim(t.Context(), store.ClaimParams{Scope: "s", EventID: "e1", Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, store.Duplicate, c.Outcome)

	// A later transaction with the same claim is a second execution: refused.
	_, err = b.work(t, "e1", value)
	_ = requireSQLState(t, err, postgres.SQLStateClaimNotHeld)
	require.Equal(t, 1, b.effectsOf(t, "e1"))
}

// TestCommitFunctionRefuses: every way a claim stops being this delivery's
// makes the call raise, so the upstream's work rolls back; the message
// never carries the claim value.
func TestCommitFunctionRefuses(t *testing.T) {
	t.Parallel()
	b := setupCommit(t, postgres.Options{})

	t.Run("released", func(t *testing.T) {
		token, value := b.claim(t, "released", time.Minute)
		require.Equal(t, store.TruthReleased, b.conclude(t, "released", token, 0, time.Second))
		_, err := b.work(t, "released", value)
		text := requireSQLState(t, err, postgres.SQLStateClaimNotHeld)
		require.NotContains(t, text, value)
		require.NotContains(t, text, token)
	})
	t.Run("taken over", func(t *testing.T) {
		_, first := b.claim(t, "taken", 50*time.Millisecond)
		require.Eventually(t, func() bool {
			c, err := b.s.Claim(t.Context(), store.ClaimParams{Scope: "s", EventID: "taken", Lease: time.Minute})
			require.NoError(t, err)
			return c.Outcome == store.Claimed
		}, 10*time.Second, 20*time.Millisecond)
		_, err := b.work(t, "taken", first)
		_ = requireSQLState(t, err, postgres.SQLStateClaimNotHeld)
	})
	t.Run("expired, not claimed again", func(t *testing.T) {
		token, value := b.claim(t, "expired", time.Millisecond)
		time.Sleep(20 * time.Millisecond) //nolint:forbidigo // the lease must expire by the database clock
		tx, err := b.work(t, "expired", value)
		require.NoError(t, err, "an expired lease no one took over is still this claim")
		require.NoError(t, tx.Commit(t.Context()))
		require.Equal(t, store.TruthCommitted, b.conclude(t, "expired", token, 0, time.Second))
	})
	t.Run("resolved by an operator", func(t *testing.T) {
		_, value := b.claim(t, "resolved", time.Millisecond)
		require.Eventually(t, func() bool {
			return b.s.Resolve(t.Context(), "s", "resolved", store.StateReleased) == nil
		}, 10*time.Second, 10*time.Millisecond)
		_, err := b.work(t, "resolved", value)
		_ = requireSQLState(t, err, postgres.SQLStateClaimNotHeld)
	})
	t.Run("another event's token", func(t *testing.T) {
		token, _ := b.claim(t, "mine", time.Minute)
		b.claim(t, "other", time.Minute)
		_, err := b.work(t, "other", store.ClaimValue("s", "other", token))
		_ = requireSQLState(t, err, postgres.SQLStateClaimNotHeld)
	})
	t.Run("not a claim value", func(t *testing.T) {
		for _, v := range []string{"", "x", "1.abc.73.65", store.NewToken()} {
			_, err := b.work(t, "bad", v)
			text := requireSQLState(t, err, "22023")
			if len(v) > 8 {
				require.NotContains(t, text, v)
			}
		}
	})
	for _, id := range []string{"released", "taken", "resolved", "other", "bad"} {
		require.Zero(t, b.effectsOf(t, id), id)
	}
	require.Equal(t, 1, b.effectsOf(t, "expired"))
}

// TestConcludeWaitsForTheUpstream: the conclusion waits for an upstream
// transaction that holds the row, and settles by how it ended.
func TestConcludeWaitsForTheUpstream(t *testing.T) {
	t.Parallel()
	b := setupCommit(t, postgres.Options{})

	for _, commit := range []bool{true, false} {
		id := map[bool]string{true: "commits", false: "rolls back"}[commit]
		t.Run(id, func(t *testing.T) {
			token, value := b.claim(t, id, time.Minute)
			tx, err := b.work(t, id, value)
			require.NoError(t, err)
			truth := make(chan store.Truth, 1)
			go func() {
				tr, err := b.s.Conclude(context.Background(), store.ConcludeParams{Scope: "s", EventID: id,
					Token: token, Wait: 30 * time.Second})
				if err != nil {
					tr = 0
				}
				truth <- tr
			}()
			// The conclusion cannot finish while the transaction holds the row.
			waitForLockWaiter(t, b.app)
			select {
			case tr := <-truth:
				t.Fatalf("concluded %s while the upstream's transaction was open", tr)
			default:
			}
			if commit {
				require.NoError(t, tx.Commit(t.Context()))
				require.Equal(t, store.TruthCommitted, <-truth)
				require.Equal(t, 1, b.effectsOf(t, id))
			} else {
				require.NoError(t, tx.Rollback(t.Context()))
				require.Equal(t, store.TruthReleased, <-truth)
				require.Zero(t, b.effectsOf(t, id))
				c, err := b.s.Claim(t.Context(), store.ClaimParams{Scope: "s", EventID: id, Lease: time.Minute})
				require.NoError(t, err)
				require.Equal(t, store.Claimed, c.Outcome, "the retry is forwarded")
			}
		})
	}

	t.Run("wait runs out", func(t *testing.T) {
		token, value := b.claim(t, "pending", time.Minute)
		tx, err := b.work(t, "pending", value)
		require.NoError(t, err)
		require.Equal(t, store.TruthPending, b.conclude(t, "pending", token, 0, 50*time.Millisecond))
		require.NoError(t, tx.Rollback(t.Context()))
		ev, err := b.s.Get(t.Context(), "s", "pending")
		require.NoError(t, err)
		require.Equal(t, store.StateProcessing, ev.State, "left for the next claim to judge")
		require.Equal(t, store.TruthReleased, b.conclude(t, "pending", token, 0, time.Second))
	})

	t.Run("2xx without a commit", func(t *testing.T) {
		token, _ := b.claim(t, "forgot", time.Minute)
		require.Equal(t, store.TruthCompletedUncommitted, b.conclude(t, "forgot", token, 200, time.Second))
		ev, err := b.s.Get(t.Context(), "s", "forgot")
		require.NoError(t, err)
		require.Equal(t, store.StateCompleted, ev.State, "a 2xx is never forwarded again")
		require.Equal(t, 200, ev.Status)
	})

	t.Run("lost", func(t *testing.T) {
		require.Equal(t, store.TruthLost, b.conclude(t, "forgot", store.NewToken(), 200, time.Second))
	})

	t.Run("stored response", func(t *testing.T) {
		token, value := b.claim(t, "replay", time.Minute)
		tx, err := b.work(t, "replay", value)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(t.Context()))
		truth, err := b.s.Conclude(t.Context(), store.ConcludeParams{Scope: "s", EventID: "replay", Token: token,
			Status: 201, Wait: time.Second, Response: &store.Response{Status: 201, BodyStored: true, Body: []byte("ok"),
				Size: 2}})
		require.NoError(t, err)
		require.Equal(t, store.TruthCommitted, truth)
		resp, err := b.s.Response(t.Context(), "s", "replay")
		require.NoError(t, err)
		require.Equal(t, 201, resp.Status)
		require.Equal(t, "ok", string(resp.Body))
	})
}

// waitForLockWaiter waits until a session of the database waits for a
// row lock (the store's conclusion or claim, behind the upstream).
func waitForLockWaiter(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		require.NoError(t, err)
		return n > 0
	}, 10*time.Second, 5*time.Millisecond)
}

// TestTakeoverWaitsForTheUpstream: a claim whose lease expired while its
// upstream's transaction holds the row (the gateway died after forwarding)
// is not taken over, and its batch does not wait for that transaction:
// other deliveries' claims and settles in the same moment go through.
// Once the transaction commits, the event is a duplicate; had it rolled
// back, the retry would claim it.
func TestTakeoverWaitsForTheUpstream(t *testing.T) {
	t.Parallel()
	for _, batched := range []bool{true, false} {
		name := map[bool]string{true: "batched", false: "unbatched"}[batched]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupCommit(t, postgres.Options{Batch: store.BatchOptions{Disabled: !batched}})
			_, value := b.claim(t, "held", 100*time.Millisecond)
			tx, err := b.work(t, "held", value)
			require.NoError(t, err)
			time.Sleep(150 * time.Millisecond) //nolint:forbidigo // the lease must expire by the database clock

			// Bounded: a claim stuck behind the transaction fails the test
			// by its deadline instead of hanging; the transaction stays
			// open until every claim has answered.
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			outcomes := make([]store.Outcome, 20)
			errs := make([]error, 20)
			for i := range outcomes {
				wg.Go(func() {
					id := "held"
					if i > 0 {
						id = "other-" + string(rune('a'+i))
					}
					c, err := b.s.Claim(ctx, store.ClaimParams{Scope: "s", EventID: id, Lease: time.Minute})
					outcomes[i], errs[i] = c.Outcome, err
					if err == nil && c.Outcome == store.Claimed {
						errs[i] = b.s.Complete(ctx, "s", id, c.Token, 200)
					}
				})
			}
			wg.Wait()
			for i, err := range errs {
				require.NoError(t, err, "claim %d", i)
			}
			require.Equal(t, store.InFlight, outcomes[0], "the upstream's row is in flight, not taken over")
			for i := 1; i < len(outcomes); i++ {
				require.Equal(t, store.Claimed, outcomes[i])
			}

			require.NoError(t, tx.Commit(t.Context()))
			c, err := b.s.Claim(t.Context(), store.ClaimParams{Scope: "s", EventID: "held", Lease: time.Minute})
			require.NoError(t, err)
			require.Equal(t, store.Duplicate, c.Outcome, "committed by the upstream: never forwarded again")
			require.Equal(t, 1, b.effectsOf(t, "held"))
		})
	}
}

// TestKeepUpstream: the heartbeat of an upstream-completed claim never
// waits for the upstream's transaction.
func TestKeepUpstream(t *testing.T) {
	t.Parallel()
	b := setupCommit(t, postgres.Options{})
	token, value := b.claim(t, "k", time.Minute)
	done, err := b.s.KeepUpstream(t.Context(), "s", "k", token, time.Minute)
	require.NoError(t, err)
	require.False(t, done)

	tx, err := b.work(t, "k", value)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	done, err = b.s.KeepUpstream(ctx, "s", "k", token, time.Minute)
	require.NoError(t, err, "locked by the upstream: not lost, and no wait")
	require.False(t, done)
	require.NoError(t, tx.Commit(t.Context()))

	done, err = b.s.KeepUpstream(t.Context(), "s", "k", token, time.Minute)
	require.NoError(t, err)
	require.True(t, done, "committed by the upstream")

	_, err = b.s.KeepUpstream(t.Context(), "s", "k", store.NewToken(), time.Minute)
	require.ErrorIs(t, err, store.ErrLeaseLost)
}

// TestCommitFunctionGrant: the function is not callable by every role
// (EXECUTE revoked from PUBLIC); the application's role needs the GRANT
// the README gives, and nothing on the events table itself.
func TestCommitFunctionGrant(t *testing.T) {
	t.Parallel()
	b := setupCommit(t, postgres.Options{})
	role := "wh_app_" + store.NewToken()[:12]
	ctx := t.Context()
	_, err := b.app.Exec(ctx, `CREATE ROLE `+role+` NOLOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = b.app.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = b.app.Exec(context.Background(), `DROP ROLE IF EXISTS `+role)
	})
	_, err = b.app.Exec(ctx, `GRANT INSERT ON `+b.effects+` TO `+role)
	require.NoError(t, err)

	call := func(id, value string) error {
		return pgx.BeginFunc(ctx, b.app, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+role); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+b.effects+` VALUES ($1)`, id); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT `+b.fn+`($1)`, value)
			return err
		})
	}
	_, value := b.claim(t, "g", time.Minute)
	_ = requireSQLState(t, call("g", value), "42501") // insufficient_privilege

	_, err = b.app.Exec(ctx, `GRANT EXECUTE ON FUNCTION `+b.fn+`(text) TO `+role)
	require.NoError(t, err)
	require.NoError(t, call("g", value))
	ev, err := b.s.Get(ctx, "s", "g")
	require.NoError(t, err)
	require.Equal(t, store.StateCompleted, ev.State)
}

// TestCommitFunctionSchemaQualified: the function lives next to a
// schema-qualified table.
func TestCommitFunctionSchemaQualified(t *testing.T) {
	t.Parallel()
	dsn := testDSN(t)
	schema := "wh_schema_" + store.NewToken()[:12]
	pool, err := pgxpool.New(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(t.Context(), "CREATE SCHEMA "+schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })

	b := setupCommit(t, postgres.Options{Table: schema + ".events"})
	require.Equal(t, `"`+schema+`"."events_commit"`, b.fn)
	token, value := b.claim(t, "q", time.Minute)
	tx, err := b.work(t, "q", value)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(t.Context()))
	require.Equal(t, store.TruthCommitted, b.conclude(t, "q", token, 200, time.Second))
}
