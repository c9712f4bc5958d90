package postgres

import (
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	pgstore "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// queries are the queue's statements, built once from the validated,
// quoted table names. Durations travel as microseconds ($n::bigint *
// interval '1 microsecond'); every time is the database's.
type queries struct {
	lockOrder, enqueue                     string
	insert                                 string
	reap, loseAttempts, budget, take       string
	startAttempts, nextDue                 string
	heartbeat, settle, finishAttempt       string
	release, releaseAttempt                string
	get, attempts, list                    string
	retry, retryDead, purge, purgeState    string
	stats, sweepDelete, sweepStrip, exists string
	// complete_by upstream (Conclude).
	concludeLock, concludeCommitted string
}

const us = ` * interval '1 microsecond'`

const eventColumns = `id, scope, event_id, COALESCE(order_key, ''), state, attempts, round_attempts, method, uri,
	COALESCE(octet_length(body), 0), body IS NOT NULL, received_at, updated_at, run_at, lease_until,
	delivered_at, last_status, last_error`

func buildQueries(n names) queries {
	q, a, ev := n.queue.Sanitize(), n.attempts.Sanitize(), n.events.Sanitize()
	return queries{
		// The order keys' transaction advisory locks ($1, ascending: taken
		// one after the other in array order).
		lockOrder: `SELECT pg_advisory_xact_lock(k) FROM unnest($1::bigint[]) AS k`,
		// One round of a batch of enqueues (writeBatch). c: the claims ($1
		// entry, $2 scope, $3 event ID, $4 hold on expiry, $5 status),
		// sorted by (scope, event ID) so that every batch takes its row
		// locks in one order. q: the entries ($6 index in the batch, $7
		// scope, $8 event ID, $9 order key, $10 method, $11 URI, $12
		// header JSON, $13 body, $14 its number of claims, -1 when it must
		// not be written). cur reads each claim's row; the claims of an
		// entry whose every claim reads claimable (store.ClaimableSQL) are
		// written at once as Claim and then Complete leave the row
		// (completed with the entry's status, attempts counted, token,
		// lease, fingerprint and stored response cleared); a refused
		// claim's entry writes nothing. ON CONFLICT ... WHERE judges a row
		// that changed since the read again: a claim refused there comes
		// back unwritten though read claimable (the batch is then rolled
		// back). An entry whose claims were all written gets its queue
		// row, in batch order, so queue IDs follow arrival order.
		// One row per claim (false, its position in c, claimable, written,
		// the state and lease left in microseconds it read, 0) and per
		// queue row inserted (true, the entry's index, true, true, '', 0,
		// its ID).
		enqueue: `WITH c AS (
				SELECT * FROM unnest($1::int[], $2::text[], $3::text[], $4::boolean[], $5::int[])
					WITH ORDINALITY AS c(entry, scope, event_id, hold, status, ord)
			), cur AS (
				SELECT c.ord, c.entry, e.state,
					` + pgstore.LeaseLeftSQL("e.") + ` AS lease_left,
					(e.state IS NULL OR (` + store.ClaimableSQL("now()", "c.hold") + `)) AS claimable
				FROM c LEFT JOIN ` + ev + ` e ON e.scope = c.scope AND e.event_id = c.event_id
			), q AS (
				SELECT * FROM unnest($6::int[], $7::text[], $8::text[], $9::text[], $10::text[], $11::text[],
					$12::text[], $13::bytea[], $14::int[])
					AS q(entry, scope, event_id, order_key, method, uri, header, body, claims)
			), ok AS (
				SELECT q.entry, q.claims FROM q
				WHERE q.claims >= 0 AND NOT EXISTS (SELECT 1 FROM cur WHERE cur.entry = q.entry AND NOT cur.claimable)
			), ins AS (
				INSERT INTO ` + ev + ` AS e
					(scope, event_id, state, token, attempts, lease_until, first_seen, updated_at, completed_at, status, fingerprint)
				SELECT c.scope, c.event_id, 'completed', '', 1, NULL, now(), now(), now(), c.status, ''
				FROM c JOIN ok ON ok.entry = c.entry
				ORDER BY c.ord
				ON CONFLICT (scope, event_id) DO UPDATE SET
					state        = 'completed',
					token        = '',
					attempts     = e.attempts + 1,
					lease_until  = NULL,
					updated_at   = EXCLUDED.updated_at,
					completed_at = EXCLUDED.completed_at,
					status       = EXCLUDED.status,
					fingerprint  = '',
					response_headers = NULL, response_body = NULL, response_size = 0, response_sha256 = ''
				WHERE ` + store.ClaimableSQL("now()",
			"(SELECT c.hold FROM c WHERE c.scope = EXCLUDED.scope AND c.event_id = EXCLUDED.event_id)") + `
				RETURNING e.scope, e.event_id
			), done AS (
				SELECT c.entry, count(*)::int AS n FROM c JOIN ins ON ins.scope = c.scope AND ins.event_id = c.event_id
				GROUP BY c.entry
			), qins AS (
				INSERT INTO ` + q + ` (scope, event_id, state, order_key, method, uri, header, body)
				SELECT q.scope, q.event_id, 'queued', NULLIF(q.order_key, ''), q.method, q.uri, q.header::jsonb, q.body
				FROM q JOIN ok ON ok.entry = q.entry LEFT JOIN done ON done.entry = q.entry
				WHERE COALESCE(done.n, 0) = ok.claims
				ORDER BY q.entry
				ON CONFLICT (scope, event_id) DO NOTHING
				RETURNING id, scope, event_id
			)
			SELECT false, cur.ord::int, cur.claimable, ins.scope IS NOT NULL, COALESCE(cur.state, ''), cur.lease_left, 0::bigint
			FROM cur JOIN c ON c.ord = cur.ord LEFT JOIN ins ON ins.scope = c.scope AND ins.event_id = c.event_id
			UNION ALL
			SELECT true, q.entry, true, true, '', 0, qins.id
			FROM qins JOIN q ON q.scope = qins.scope AND q.event_id = qins.event_id`,
		insert: `INSERT INTO ` + q + `
				(scope, event_id, state, order_key, method, uri, header, body)
			VALUES ($1, $2, 'queued', NULLIF($3::text, ''), $4, $5, $6, $7)
			ON CONFLICT (scope, event_id) DO NOTHING
			RETURNING id`,

		// Take, in one transaction: take back expired leases, read the
		// budget (under the scope's advisory lock when capped), take.
		reap: `UPDATE ` + q + ` SET
				state = CASE WHEN ($2::int > 0 AND round_attempts >= $2::int)
						OR ($3::bigint > 0 AND round_started_at + $3::bigint` + us + ` <= statement_timestamp())
					THEN 'dead' ELSE 'queued' END,
				run_at = statement_timestamp(), token = '', lease_until = NULL,
				updated_at = statement_timestamp(), last_status = 0,
				last_error = 'lease expired: the dispatcher delivering it stopped or lost the database'
			WHERE scope = $1 AND state = 'delivering' AND lease_until <= statement_timestamp()
				AND id IN (SELECT id FROM ` + q + ` WHERE scope = $1 AND state = 'delivering'
					AND lease_until <= statement_timestamp() FOR UPDATE SKIP LOCKED)
			RETURNING id, attempts, state`,
		loseAttempts: `UPDATE ` + a + ` SET outcome = 'lost',
				error = 'lease expired before the attempt was settled'
			WHERE (queue_id, attempt) IN (SELECT * FROM unnest($1::bigint[], $2::int[]))
				AND outcome = 'delivering'`,
		// In delivery (every lease is live after reap), attempts started in
		// the rate window, and when the oldest of those leaves the window.
		budget: `SELECT
				(SELECT count(*) FROM ` + q + ` WHERE scope = $1 AND state = 'delivering')::int,
				(CASE WHEN $2::bigint > 0 THEN (SELECT count(*) FROM ` + a + `
					WHERE scope = $1 AND started_at > statement_timestamp() - $2::bigint` + us + `) ELSE 0 END)::int,
				(CASE WHEN $2::bigint > 0 THEN COALESCE((SELECT CEIL(EXTRACT(EPOCH FROM
					(min(started_at) + $2::bigint` + us + ` - statement_timestamp())) * 1000000) FROM ` + a + `
					WHERE scope = $1 AND started_at > statement_timestamp() - $2::bigint` + us + `), 0) ELSE 0 END)::bigint`,
		// Due events, earliest first; an event with an order key only when
		// no other event of its key is in delivery and none queued before
		// it (the head of its key). Rows other sessions lock are skipped.
		take: `WITH next AS (
				SELECT c.id FROM ` + q + ` c
				WHERE c.scope = $1 AND c.state = 'queued' AND c.run_at <= statement_timestamp()
					AND (c.order_key IS NULL OR NOT EXISTS (
						SELECT 1 FROM ` + q + ` p
						WHERE p.scope = c.scope AND p.order_key = c.order_key AND p.id <> c.id
							AND (p.state = 'delivering' OR (p.state = 'queued' AND p.id < c.id))))
				ORDER BY c.run_at, c.id
				LIMIT $2
				FOR UPDATE OF c SKIP LOCKED)
			UPDATE ` + q + ` AS t SET state = 'delivering', token = $3,
				lease_until = statement_timestamp() + $4::bigint` + us + `,
				attempts = t.attempts + 1, round_attempts = t.round_attempts + 1,
				updated_at = statement_timestamp()
			FROM next WHERE t.id = next.id
			RETURNING t.id, t.event_id, COALESCE(t.order_key, ''), t.attempts, t.round_attempts,
				t.method, t.uri, t.header, t.body, t.received_at`,
		startAttempts: `INSERT INTO ` + a + ` (queue_id, attempt, scope, worker, started_at)
			SELECT id, attempt, $3, $4, statement_timestamp() FROM unnest($1::bigint[], $2::int[]) AS t(id, attempt)
			ON CONFLICT (queue_id, attempt) DO NOTHING`,
		nextDue: `SELECT COALESCE(CEIL(EXTRACT(EPOCH FROM (min(run_at) - statement_timestamp())) * 1000000), 0)::bigint
			FROM ` + q + ` WHERE scope = $1 AND state = 'queued'`,

		// Never waits for a lock: a row another transaction holds (an
		// upstream between its <table>_commit and its commit) is not
		// renewed, and reads as held (true) while it is in delivery or
		// delivered under the token in the statement's snapshot.
		heartbeat: `WITH lk AS (
				SELECT id FROM ` + q + ` WHERE id = $1 AND token = $2 AND state = 'delivering'
				FOR UPDATE SKIP LOCKED
			), upd AS (
				UPDATE ` + q + ` AS t SET lease_until = now() + $3::bigint` + us + `
				FROM lk WHERE t.id = lk.id
				RETURNING 1
			)
			SELECT EXISTS (SELECT 1 FROM upd) OR EXISTS (SELECT 1 FROM ` + q + `
				WHERE id = $1 AND token = $2 AND state IN ('delivering', 'delivered'))`,
		// $3 delivered; otherwise dead when the round is out of attempts
		// ($6) or the next attempt would fall after max_age ($7), else
		// queued again after $8.
		settle: `UPDATE ` + q + ` SET
				state = CASE WHEN $3::boolean THEN 'delivered'
					WHEN ($6::int > 0 AND round_attempts >= $6::int)
						OR ($7::bigint > 0 AND now() + $8::bigint` + us + ` > round_started_at + $7::bigint` + us + `)
					THEN 'dead' ELSE 'queued' END,
				run_at = CASE WHEN $3::boolean THEN run_at ELSE now() + $8::bigint` + us + ` END,
				delivered_at = CASE WHEN $3::boolean THEN now() END,
				token = '', lease_until = NULL, last_status = $4, last_error = $5, updated_at = now()
			WHERE id = $1 AND token = $2 AND state = 'delivering'
			RETURNING state`,
		finishAttempt: `UPDATE ` + a + ` SET finished_at = now(), duration_us = $3, status = $4, error = $5,
				outcome = CASE WHEN outcome = 'delivering' THEN $6 ELSE outcome END
			WHERE queue_id = $1 AND attempt = $2`,
		// Conclude: wait (lock_timeout) for a transaction holding the
		// event, then read it under the token.
		concludeLock: `SELECT state FROM ` + q + `
			WHERE id = $1 AND token = $2 AND state IN ('delivering', 'delivered')
			FOR UPDATE`,
		// A delivery <table>_commit marked delivered: the gateway's record
		// of the attempt ($3 the status seen, 0 none).
		concludeCommitted: `UPDATE ` + q + ` SET token = '', last_status = $3, last_error = '', updated_at = now()
			WHERE id = $1 AND token = $2 AND state = 'delivered'`,
		release: `UPDATE ` + q + ` SET state = 'queued', run_at = now(), token = '', lease_until = NULL,
				round_attempts = GREATEST(round_attempts - 1, 0), updated_at = now()
			WHERE id = $1 AND token = $2 AND state = 'delivering'`,
		releaseAttempt: `UPDATE ` + a + ` SET outcome = 'released', finished_at = now(),
				error = 'handed back at shutdown'
			WHERE queue_id = $1 AND attempt = $2 AND outcome = 'delivering'`,

		get:      `SELECT ` + eventColumns + ` FROM ` + q + ` WHERE scope = $1 AND event_id = $2`,
		attempts: `SELECT attempt, worker, started_at, finished_at, duration_us, status, error, outcome FROM ` + a + ` WHERE queue_id = $1 ORDER BY attempt`,
		list:     `SELECT ` + eventColumns + ` FROM ` + q,
		retry: `UPDATE ` + q + ` SET
				round_attempts   = CASE WHEN state = 'dead' THEN 0 ELSE round_attempts END,
				round_started_at = CASE WHEN state = 'dead' THEN now() ELSE round_started_at END,
				state = 'queued', run_at = now(), updated_at = now()
			WHERE scope = $1 AND event_id = $2 AND state IN ('dead', 'queued')`,
		retryDead: `UPDATE ` + q + ` SET state = 'queued', run_at = now(), round_attempts = 0,
				round_started_at = now(), updated_at = now()
			WHERE id IN (SELECT id FROM ` + q + ` WHERE scope = $1 AND state = 'dead' ORDER BY id LIMIT $2
				FOR UPDATE SKIP LOCKED)
				AND state = 'dead'`,
		purge: `DELETE FROM ` + q + ` WHERE scope = $1 AND event_id = $2 AND state <> 'delivering'`,
		purgeState: `DELETE FROM ` + q + `
			WHERE id IN (SELECT id FROM ` + q + ` WHERE scope = $1 AND state = $2 LIMIT $3 FOR UPDATE SKIP LOCKED)
				AND state = $2`,
		stats: `SELECT
				count(*) FILTER (WHERE state = 'queued')::int,
				count(*) FILTER (WHERE state = 'delivering')::int,
				count(*) FILTER (WHERE state = 'dead')::int,
				COALESCE(CEIL(EXTRACT(EPOCH FROM (now() - min(received_at)
					FILTER (WHERE state IN ('queued', 'delivering')))) * 1000000), 0)::bigint
			FROM ` + q + ` WHERE scope = $1 AND state IN ('queued', 'delivering', 'dead')`,
		sweepDelete: `DELETE FROM ` + q + `
			WHERE id IN (SELECT id FROM ` + q + `
				WHERE scope = $1 AND state IN ('delivered', 'dead') AND received_at < now() - $2::bigint` + us + `
				LIMIT $3 FOR UPDATE SKIP LOCKED)
				AND state IN ('delivered', 'dead')`,
		sweepStrip: `UPDATE ` + q + ` SET body = NULL, header = '{}'::jsonb
			WHERE id IN (SELECT id FROM ` + q + `
				WHERE scope = $1 AND state = 'delivered' AND body IS NOT NULL
					AND delivered_at < now() - $2::bigint` + us + `
				LIMIT $3 FOR UPDATE SKIP LOCKED)`,
		exists: `SELECT state FROM ` + q + ` WHERE scope = $1 AND event_id = $2`,
	}
}
