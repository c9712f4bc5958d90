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

// createClaimFunction is the statement of migrations 8, 9 and 10:
// <table>_claim(scopes, event_ids, tokens, leases in microseconds, hold)
// claims each key in array order and returns one row per key, in that
// order: claimed, attempts, state, status, lease left in microseconds,
// ambiguous (the columns of the claim statements).
//
// Why a function: the set-based statement it replaces (unnest joined to
// the table through four CTEs) had to be planned on every execution,
// which cost PostgreSQL as much CPU as running it, and a cached generic
// plan of it was not safe (see byPrimaryKey). PL/pgSQL keeps one plan
// per statement for the connection's life, so a batch costs one call
// planned in microseconds.
//
// A batch is decided in three steps. One read of every key by primary
// key, no lock: a completed, held or live row is answered from it (no
// write, no WAL). One INSERT of the keys the read did not find, ON
// CONFLICT DO NOTHING: each key it inserts is claimed. What is left, a
// claimable row (released, or its lease expired) or a key another
// transaction inserted since the read, is decided one key at a time: read
// again, locked SKIP LOCKED (a row another transaction holds, an
// upstream between its <table>_commit and its commit, reads as in flight
// with one second left, so the batch does not wait behind it), then
// written by the INSERT whose ON CONFLICT ... WHERE judges a row that
// changed since the read; a refused one comes back unclaimed with no
// state, for the store to explain. Keys come sorted, so batches take their
// row locks in one order and wait for each other instead of deadlocking.
//
// A key given twice in one call by two claims (the store never sends one:
// Rules removes repeats) is claimed once, at the position whose token the
// INSERT kept; the other reads as in flight (a token is a claim: one
// given twice is one claim, answered twice). Migration 10 made it so: version 9's
// body claimed both positions of a new key under one stored token.
//
// Migration 9 moved the new and the decided keys from one read and one
// INSERT per key to one of each per batch: measured with pgbench at 32
// clients, 13 keys per call, PostgreSQL's CPU per new event (claim and
// completion) fell from 96–101 µs to 74–76 µs, and per duplicate from
// 20 µs to 12–18 µs.
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
			-- The first read, by position: the row's state (NULL: no row),
			-- attempts, status, lease left, claimable; and whether the
			-- batch's INSERT claimed the key.
			r_state text[];
			r_attempts integer[];
			r_status integer[];
			r_lease bigint[];
			r_claimable boolean[];
			inserted boolean[];
		BEGIN
			SELECT array_agg(r.state ORDER BY u.ord), array_agg(r.attempts ORDER BY u.ord),
					array_agg(r.status ORDER BY u.ord), array_agg(r.lease_left ORDER BY u.ord),
					array_agg(r.claimable ORDER BY u.ord)
				INTO r_state, r_attempts, r_status, r_lease, r_claimable
				FROM unnest(scopes, event_ids) WITH ORDINALITY AS u(scope, event_id, ord)
				LEFT JOIN LATERAL (
					SELECT e.state, e.attempts, e.status, ` + LeaseLeftSQL("e.") + ` AS lease_left,
							(` + claimable + `) AS claimable
						FROM ` + t + ` e
						` + byPrimaryKey("u.scope", "u.event_id", "true") + `) r ON true;
			IF array_position(r_state, NULL) IS NOT NULL THEN
				WITH ins AS (
					INSERT INTO ` + t + ` AS e
							(scope, event_id, state, token, attempts, lease_until, first_seen, updated_at)
						SELECT u.scope, u.event_id, 'processing', u.token, 1,
								now() + u.lease * interval '1 microsecond', now(), now()
							FROM unnest(scopes, event_ids, tokens, leases) WITH ORDINALITY AS u(scope, event_id, token, lease, ord)
							WHERE r_state[u.ord] IS NULL
							ORDER BY u.ord
						ON CONFLICT (scope, event_id) DO NOTHING
						RETURNING e.scope, e.event_id, e.token)
				SELECT array_agg(ins.event_id IS NOT NULL ORDER BY u.ord) INTO inserted
					FROM unnest(scopes, event_ids, tokens) WITH ORDINALITY AS u(scope, event_id, token, ord)
					LEFT JOIN ins ON ins.scope = u.scope AND ins.event_id = u.event_id AND ins.token = u.token;
			END IF;
			FOR k IN 1 .. coalesce(cardinality(event_ids), 0) LOOP
				IF inserted[k] THEN
					claimed := true; attempts := 1; state := ''; status := 0; lease_left := 0; ambiguous := 0;
					RETURN NEXT;
					CONTINUE;
				END IF;
				IF r_state[k] IS NOT NULL AND NOT r_claimable[k] THEN
					claimed := false; attempts := r_attempts[k]; state := r_state[k]; status := r_status[k];
					lease_left := r_lease[k]; ambiguous := 0;
					RETURN NEXT;
					CONTINUE;
				END IF;
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

// migrateClaim and dropClaim are migration 8's steps; migrations 9 and 10
// run migrateClaim again, for tables at an earlier version (same
// arguments, same results for the keys the store sends: gateways of any of
// these versions can share the table during a rolling upgrade).
func migrateClaim(ident pgx.Identifier) func(context.Context, *sql.Tx) error {
	return pgschema.ExecAll(createClaimFunction(ident))
}

func dropClaim(ident pgx.Identifier) func(context.Context, *sql.Tx) error {
	return pgschema.ExecAll(`DROP FUNCTION IF EXISTS ` + claimFunction(ident) + claimFunctionArgs)
}
