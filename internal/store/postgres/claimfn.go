package postgres

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/pgschema"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// claimFunction is the name of <table>_claim, next to the table (in its
// schema when the configuration names one, else where the search path
// finds the table).
func claimFunction(ident pgx.Identifier) string {
	fn := append(pgx.Identifier{}, ident...)
	fn[len(fn)-1] += "_claim"
	return fn.Sanitize()
}

// claimFunctionArgs are <table>_claim's parameter types, as DROP FUNCTION
// names them.
const claimFunctionArgs = `(text[], text[], text[], bigint[], boolean)`

// createClaimFunction is migration 8's statement: <table>_claim(scopes,
// event_ids, tokens, leases in microseconds, hold) claims each key in
// array order and returns one row per key, in that order: claimed,
// attempts, state, status, lease left in microseconds, ambiguous (the
// columns of the claim statements).
//
// Why a function: the set-based statement it replaces (unnest joined to
// the table through four CTEs) had to be planned on every execution,
// which cost PostgreSQL as much CPU as running it, and a cached generic
// plan of it was not safe (see byPrimaryKey). PL/pgSQL keeps one plan
// per statement for the connection's life, so a batch costs one call
// planned in microseconds and a few primary-key probes per key: measured
// with pgbench at one connection, 20 new keys per call, 3× the calls per
// second of the statement, and 5× for 20 keys already completed.
//
// Each key is decided as the statement decided it. The row is read first
// without a lock: a completed, held or live row is answered from the
// read (no lock, no WAL). A claimable row is locked SKIP LOCKED: one that
// another transaction holds (an upstream between its <table>_commit and
// its commit) reads as in flight with one second left, so the batch does
// not wait behind it. An absent or locked claimable row is written by the
// INSERT, whose ON CONFLICT ... WHERE judges again a row that changed
// since the read; a refused one comes back unclaimed with no state, for the
// store to explain. Keys come sorted, so batches take their row locks in
// one order and wait for each other instead of deadlocking.
func createClaimFunction(ident pgx.Identifier) string {
	t := ident.Sanitize()
	claimable := store.ClaimableSQL("now()", "hold")
	return `CREATE OR REPLACE FUNCTION ` + claimFunction(ident) + `(scopes text[], event_ids text[], tokens text[], leases bigint[], hold boolean)
		RETURNS TABLE (claimed boolean, attempts integer, state text, status integer, lease_left bigint, ambiguous integer)
		LANGUAGE plpgsql VOLATILE
		AS $fn$
		DECLARE
			k integer;
			cur record;
		BEGIN
			FOR k IN 1 .. coalesce(cardinality(event_ids), 0) LOOP
				SELECT e.state, e.attempts, e.status, ` + LeaseLeftSQL("e.") + ` AS lease_left,
						(` + claimable + `) AS claimable
					INTO cur FROM ` + t + ` e
					` + byPrimaryKey("scopes[k]", "event_ids[k]", "true") + `;
				IF FOUND AND NOT cur.claimable THEN
					RETURN QUERY SELECT false, cur.attempts, cur.state, cur.status, cur.lease_left, 0;
					CONTINUE;
				END IF;
				IF FOUND THEN
					PERFORM FROM ` + t + ` e
						` + byPrimaryKey("scopes[k]", "event_ids[k]", claimable) + `
						FOR UPDATE SKIP LOCKED;
					IF NOT FOUND THEN
						RETURN QUERY SELECT false, cur.attempts, 'processing'::text, cur.status, 1000000::bigint, 0;
						CONTINUE;
					END IF;
				END IF;
				RETURN QUERY INSERT INTO ` + t + ` AS e
						(scope, event_id, state, token, attempts, lease_until, first_seen, updated_at)
					VALUES (scopes[k], event_ids[k], 'processing', tokens[k], 1,
						now() + leases[k] * interval '1 microsecond', now(), now())
					` + takeoverSQL("hold") + `
					RETURNING true, e.attempts, coalesce(cur.state, ''), coalesce(cur.status, 0),
						coalesce(cur.lease_left, 0)::bigint, e.ambiguous;
				IF NOT FOUND THEN
					RETURN QUERY SELECT false, coalesce(cur.attempts, 0), coalesce(cur.state, ''),
						coalesce(cur.status, 0), coalesce(cur.lease_left, 0)::bigint, 0;
				END IF;
			END LOOP;
		END
		$fn$`
}

// byPrimaryKey is the WHERE ... LIMIT clause that finds the row of (scope,
// eventID) where cond holds, by the primary key, written so that a cached
// generic plan cannot take another index. With equality on both columns a generic plan made while
// the table is empty or never analyzed sees the primary key and the
// retention index (scope, first_seen) as equally cheap, may pick the
// latter, and keeps it as the table grows: every lookup then reads the
// whole scope (24,000 index entries per delivery after 12,000
// deliveries). The event ID as a closed range, ordered by it, is the
// same row under the "C" collation, but only the primary key serves that
// order without a sort, so it wins in every plan.
func byPrimaryKey(scope, eventID, cond string) string {
	return `WHERE e.scope = ` + scope + ` AND e.event_id >= ` + eventID + ` AND e.event_id <= ` + eventID +
		` AND (` + cond + `) ORDER BY e.event_id LIMIT 1`
}

// migrateClaim and dropClaim are migration 8's steps.
func migrateClaim(ident pgx.Identifier) func(context.Context, *sql.Tx) error {
	return pgschema.ExecAll(createClaimFunction(ident))
}

func dropClaim(ident pgx.Identifier) func(context.Context, *sql.Tx) error {
	return pgschema.ExecAll(`DROP FUNCTION IF EXISTS ` + claimFunction(ident) + claimFunctionArgs)
}
