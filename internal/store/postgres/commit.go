package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// The SQLSTATEs <table>_commit raises. WI001: the claim is no longer this
// delivery's (released, taken over, expired and claimed again, resolved
// or forgotten by an operator, or already committed by an earlier
// transaction); the work must roll back. 22023 (invalid_parameter_value):
// the value is not a Webhook-Claim value. Neither is a serialization
// failure, so frameworks that run a transaction again on 40001 do not
// retry a claim that cannot succeed.
const (
	SQLStateClaimNotHeld = "WI001"
	sqlStateLockTimeout  = "55P03" // lock_not_available, raised by lock_timeout
)

// CommitFunction is the name of the SQL function an upstream calls to
// complete its claim in its own transaction: <table>_commit, in the
// table's schema.
func CommitFunction(t store.Table) store.Table { return t.Suffixed("_commit") }

// commitGUC is the transaction-local setting where <table>_commit notes the
// tokens it committed, so that a second call for the same claim in the
// same transaction (also from another savepoint) succeeds without writing
// again, while a call from any later transaction raises.
const commitGUC = "webhook_idempotency.committed"

// commitFunctionArgs is <table>_commit's parameter type, as REVOKE and
// DROP FUNCTION name it.
const commitFunctionArgs = `(text)`

// createCommitFunction returns the statements that create <table>_commit
// for the schema-qualified table ident. The function is SECURITY DEFINER
// with a fixed search_path, so the application's role needs only EXECUTE
// on it (REVOKEd from PUBLIC here; see the README for the GRANT), not
// UPDATE on the events table. The claim value never appears in an error
// message: applications log their database errors.
//
// A claim of the async queue (store.QueueClaimValue, kind "q") names a
// delivery of <table>_queue, which the function marks delivered on the
// same terms; that table exists only once async mode has run its
// migrations, and PL/pgSQL resolves it only when such a claim comes.
func createCommitFunction(ident pgx.Identifier) []string {
	t := ident.Sanitize()
	q := pgx.Identifier{ident[0], ident[1] + "_queue"}.Sanitize()
	fn := pgx.Identifier{ident[0], ident[1] + "_commit"}.Sanitize()
	name := ident[1] + "_commit"
	return []string{
		`CREATE OR REPLACE FUNCTION ` + fn + `(claim text) RETURNS void
			LANGUAGE plpgsql VOLATILE SECURITY DEFINER
			SET search_path = pg_catalog, pg_temp
			AS $fn$
			DECLARE
				parts text[];
				v_scope text;
				v_event_id text;
				v_token text;
				done text;
			BEGIN
				parts := string_to_array(claim, '.');
				IF claim IS NULL OR cardinality(parts) <> 4 OR parts[1] NOT IN ('1', 'q')
					OR parts[2] !~ '^[0-9a-f]{32}$' OR parts[3] !~ '^([0-9a-f]{2})*$'
					OR parts[4] !~ '^([0-9a-f]{2})+$' THEN
					RAISE EXCEPTION '` + name + `: not a Webhook-Claim value'
						USING ERRCODE = '22023',
						HINT = 'pass the Webhook-Claim header of the request exactly as it arrived';
				END IF;
				v_token := parts[2];
				done := current_setting('` + commitGUC + `', true);
				IF done IS NOT NULL AND v_token = ANY (string_to_array(done, ' ')) THEN
					RETURN; -- committed earlier in this transaction
				END IF;
				v_scope := convert_from(decode(parts[3], 'hex'), 'UTF8');
				v_event_id := convert_from(decode(parts[4], 'hex'), 'UTF8');
				IF parts[1] = 'q' THEN
					UPDATE ` + q + ` SET state = 'delivered', delivered_at = now(), lease_until = NULL,
							last_status = 0, last_error = '', updated_at = now()
						WHERE scope = v_scope AND event_id = v_event_id AND token = v_token
							AND state = 'delivering';
				ELSE
					UPDATE ` + t + ` SET state = 'completed', status = 0, lease_until = NULL,
							completed_at = now(), updated_at = now(), hold_reason = NULL
						WHERE scope = v_scope AND event_id = v_event_id AND token = v_token
							AND state = 'processing';
				END IF;
				IF NOT FOUND THEN
					RAISE EXCEPTION '` + name + `: this delivery no longer holds its claim (released after its forward ended, taken over after its lease expired, resolved by an operator, or committed by an earlier transaction)'
						USING ERRCODE = '` + SQLStateClaimNotHeld + `',
						HINT = 'roll back: the gateway forwards the provider''s retry, or has already settled the event';
				END IF;
				PERFORM set_config('` + commitGUC + `', concat_ws(' ', NULLIF(done, ''), v_token), true);
			END
			$fn$`,
		`REVOKE ALL ON FUNCTION ` + fn + commitFunctionArgs + ` FROM PUBLIC`,
	}
}

// commitQueries are the driver's statements for upstream-completed claims.
type commitQueries struct {
	lock, conclude, renew string
}

func buildCommitQueries(ident pgx.Identifier) commitQueries {
	t := ident.Sanitize()
	return commitQueries{
		// Waits (up to lock_timeout) for a transaction holding the row: the
		// upstream's, between its <table>_commit and its commit.
		lock: `SELECT state FROM ` + t + `
			WHERE scope = $1 AND event_id = $2 AND token = $3 AND state IN ('processing', 'completed')
			FOR UPDATE`,
		// $4 the state to write, $5 the status seen (0: none; a row
		// completed by the upstream keeps its 0 then), $6..$9 the response
		// columns (NULL headers: none stored).
		conclude: `UPDATE ` + t + ` SET state = $4::text,
				status = CASE WHEN $4::text = 'completed' AND $5::int > 0 THEN $5::int ELSE status END,
				token = '', lease_until = NULL, updated_at = now(),
				completed_at = CASE WHEN $4::text = 'completed' THEN COALESCE(completed_at, now()) END,
				response_headers = $6, response_body = $7, response_size = $8, response_sha256 = $9
			WHERE scope = $1 AND event_id = $2 AND token = $3`,
		// A heartbeat that never waits: the row is renewed only when no
		// other transaction holds it; the state under the token is read
		// from the statement's snapshot.
		renew: `WITH lk AS (
				SELECT scope, event_id FROM ` + t + `
				WHERE scope = $1 AND event_id = $2 AND token = $3 AND state = 'processing'
				FOR UPDATE SKIP LOCKED
			), upd AS (
				UPDATE ` + t + ` AS e SET lease_until = now() + $4::bigint * interval '1 microsecond', updated_at = now()
				FROM lk WHERE e.scope = lk.scope AND e.event_id = lk.event_id
				RETURNING 1
			)
			SELECT EXISTS (SELECT 1 FROM upd),
				COALESCE((SELECT state FROM ` + t + ` WHERE scope = $1 AND event_id = $2 AND token = $3), '')`,
	}
}

var _ store.CommitDriver = driver{}

// ConcludeRow implements store.CommitDriver in one READ COMMITTED
// transaction of its own, on its own connection: lock_timeout bounds the
// wait for the row to p.Wait.
func (d driver) ConcludeRow(ctx context.Context, p store.ConcludeParams, resp *store.ResponseColumns) (
	state store.State, committed, locked bool, err error,
) {
	// d.slow, not d.run: the wait for the upstream's transaction may take
	// up to p.Wait (30 s), which the statement deadline would take for a
	// lost connection. A conflict runs it again, reading the truth afresh.
	err = d.slow.Run(ctx, func(ctx context.Context) error {
		state, committed, locked = "", false, false
		return interpretError(d.concludeTx(ctx, p, resp, &state, &committed, &locked))
	})
	if locked {
		return "", false, true, nil
	}
	if err != nil {
		return "", false, false, err
	}
	return state, committed, false, nil
}

func (d driver) concludeTx(ctx context.Context, p store.ConcludeParams, resp *store.ResponseColumns,
	state *store.State, committed, locked *bool,
) error {
	return pgx.BeginTxFunc(ctx, d.beginner(), pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		wait := strconv.FormatInt(max(p.Wait.Milliseconds(), 1), 10) + "ms"
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, wait); err != nil {
			return err
		}
		var s string
		switch err := tx.QueryRow(ctx, d.q.commit.lock, p.Scope, p.EventID, p.Token).Scan(&s); {
		case errors.Is(err, pgx.ErrNoRows):
			return nil // no longer this claim's
		case isLockTimeout(err):
			*locked = true
			return errLocked
		case err != nil:
			return err
		}
		*state = store.State(s)
		*committed = *state == store.StateCompleted
		to := store.StateReleased
		if *committed || (p.Status >= 200 && p.Status <= 299) {
			to = store.StateCompleted
		}
		var (
			hdr, body any // NULL: no response stored
			size      int64
			sum       string
		)
		if resp != nil && to == store.StateCompleted {
			hdr, size, sum = resp.Headers, resp.Size, resp.SHA256
			if resp.Body != nil {
				body = resp.Body
			}
		}
		_, err := tx.Exec(ctx, d.q.commit.conclude, p.Scope, p.EventID, p.Token, string(to), p.Status,
			hdr, body, size, sum)
		return err
	})
}

// errLocked rolls back ConcludeRow's transaction when its wait ran out.
var errLocked = errors.New("row locked")

// RenewUnlocked implements store.CommitDriver.
func (d driver) RenewUnlocked(ctx context.Context, scope, eventID, token string, lease time.Duration) (
	renewed bool, state store.State, err error,
) {
	var s string
	// Not within the statement deadline either (see ConcludeRow): its
	// SKIP LOCKED never waits for the upstream's row, but the read of the
	// row's state may queue behind it.
	err = d.slow.Run(ctx, func(ctx context.Context) error {
		return interpretError(d.db.QueryRow(ctx, d.q.commit.renew, scope, eventID, token, leaseMicros(lease)).Scan(&renewed, &s))
	})
	if err != nil {
		return false, "", err
	}
	return renewed, store.State(s), nil
}

// beginner is what ConcludeRow starts its transaction on: the pool, or
// the caller's transaction (a savepoint) under InTx.
func (d driver) beginner() interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
} {
	if d.pool != nil {
		return d.pool
	}
	if b, ok := d.db.(interface {
		Begin(ctx context.Context) (pgx.Tx, error)
		BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
	}); ok {
		return b
	}
	return nil
}

func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == sqlStateLockTimeout
}

// migrateCommit is the goose step of migration 6: it creates
// <table>_commit next to the table, naming the table with its schema (the
// migration connection's current schema when the configuration names
// none), as a SECURITY DEFINER function must.
func migrateCommit(ident pgx.Identifier) func(context.Context, *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		q := ident
		if len(q) == 1 {
			var schema string
			if err := tx.QueryRowContext(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
				return err
			}
			if schema == "" {
				return fmt.Errorf("creating %s_commit: no current schema to create it in", ident[0])
			}
			q = pgx.Identifier{schema, ident[0]}
		}
		for _, stmt := range createCommitFunction(q) {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return err
			}
		}
		return nil
	}
}

// dropCommit is migration 6's down step.
func dropCommit(ident pgx.Identifier) func(context.Context, *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		fn := append(pgx.Identifier{}, ident...)
		fn[len(fn)-1] += "_commit"
		_, err := tx.ExecContext(ctx, `DROP FUNCTION IF EXISTS `+fn.Sanitize()+commitFunctionArgs)
		return err
	}
}
