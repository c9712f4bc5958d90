package postgres_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// TestClaimFunctionDecidesEveryState calls <table>_claim itself with one
// batch holding a key in every state, so that each of the function's
// paths answers in the batch (the store would otherwise explain a key the
// batch left undecided with the one-row statements, hiding a wrong answer
// behind a slower right one): a new key and a released or expired row are
// claimed in the batch, the rest answered from the first read.
func TestClaimFunctionDecidesEveryState(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newStore(t, postgres.Options{})
	name := s.Table().Name
	table := pgx.Identifier{name}.Sanitize()
	_, err := s.Pool().Exec(ctx, `INSERT INTO `+table+` (scope, event_id, state, token, attempts, lease_until, status, ambiguous) VALUES
		('s', 'b_completed', 'completed', '',    1, NULL,                         200, 0),
		('s', 'c_held',      'held',      '',    2, NULL,                         0,   1),
		('s', 'd_live',      'processing','t-d', 1, now() + interval '20 s',      0,   0),
		('s', 'e_expired',   'processing','t-e', 1, now() - interval '1 s',       0,   0),
		('s', 'f_released',  'released',  '',    3, NULL,                         0,   0)`)
	require.NoError(t, err)

	type row struct {
		claimed   bool
		attempts  int
		state     string
		status    int
		leaseLeft int64
		ambiguous int
	}
	call := func(hold bool, ids ...string) []row {
		scopes, tokens, leases := make([]string, len(ids)), make([]string, len(ids)), make([]int64, len(ids))
		for i, id := range ids {
			scopes[i], tokens[i], leases[i] = "s", "tok-"+id, 30_000_000
		}
		rows, err := s.Pool().Query(ctx, `SELECT * FROM `+pgx.Identifier{name + "_claim"}.Sanitize()+`($1, $2, $3, $4, $5)`,
			scopes, ids, tokens, leases, hold)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
			var x row
			err := r.Scan(&x.claimed, &x.attempts, &x.state, &x.status, &x.leaseLeft, &x.ambiguous)
			return x, err
		})
		require.NoError(t, err)
		require.Len(t, out, len(ids))
		return out
	}

	got := call(false, "a_new", "b_completed", "c_held", "d_live", "e_expired", "f_released")
	require.Equal(t, row{claimed: true, attempts: 1}, got[0], "new key")
	require.Equal(t, row{attempts: 1, state: "completed", status: 200}, got[1], "completed")
	require.Equal(t, row{attempts: 2, state: "held"}, got[2], "held")
	require.False(t, got[3].claimed, "live claim")
	require.Equal(t, "processing", got[3].state)
	require.InDelta(t, 20_000_000, got[3].leaseLeft, 2_000_000)
	require.True(t, got[4].claimed, "expired lease taken over")
	require.Equal(t, 2, got[4].attempts)
	require.Equal(t, 1, got[4].ambiguous, "a taken-over lease counts an ambiguous ending")
	require.Equal(t, "processing", got[4].state)
	require.Equal(t, row{claimed: true, attempts: 4, state: "released"}, got[5], "released row taken over")

	// A new key given twice in one call, by two claims (two tokens), is
	// claimed once, by the token stored; the other reads it in flight
	// (version 9 claimed both).
	var claimed []bool
	var states []string
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT array_agg(claimed), array_agg(state) FROM `+
		pgx.Identifier{name + "_claim"}.Sanitize()+`($1, $2, $3, $4, false)`,
		[]string{"s", "s"}, []string{"g_twice", "g_twice"}, []string{"tok-A", "tok-B"}, []int64{30_000_000, 30_000_000}).
		Scan(&claimed, &states))
	require.Equal(t, []bool{true, false}, claimed, "one claim of a repeated key")
	require.Equal(t, "processing", states[1])
	_, err = s.Pool().Exec(ctx, `DELETE FROM `+table+` WHERE event_id = 'g_twice'`)
	require.NoError(t, err)

	// Each claimed row now carries its claimer's token and a live lease.
	var owned int
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT count(*) FROM `+table+`
		WHERE state = 'processing' AND token = 'tok-' || event_id AND lease_until > now()`).Scan(&owned))
	require.Equal(t, 3, owned)

	// Under hold, an expired lease is not taken over; a repeat of the
	// batch finds every key decided.
	_, err = s.Pool().Exec(ctx, `INSERT INTO `+table+` (scope, event_id, state, token, lease_until)
		VALUES ('s', 'g_expired', 'processing', 't-g', now() - interval '1 s')`)
	require.NoError(t, err)
	got = call(true, "a_new", "g_expired")
	require.False(t, got[0].claimed, "claimed by the first batch")
	require.Equal(t, "processing", got[0].state)
	require.False(t, got[1].claimed, "expired under hold")
	require.Equal(t, "processing", got[1].state)
	require.Zero(t, got[1].leaseLeft)
}
