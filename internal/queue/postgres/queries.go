package postgres

// queries are the queue's statements, built once from the validated,
// quoted table names. Durations travel as microseconds ($n::bigint *
// interval '1 microsecond'); every time is the database's.
type queries struct {
	insert                                 string
	reap, loseAttempts, budget, take       string
	startAttempts, nextDue                 string
	heartbeat, settle, finishAttempt       string
	release, releaseAttempt                string
	get, attempts, list                    string
	retry, retryDead, purge, purgeState    string
	stats, sweepDelete, sweepStrip, exists string
}

const us = ` * interval '1 microsecond'`

const eventColumns = `id, scope, event_id, COALESCE(order_key, ''), state, attempts, round_attempts, method, uri,
	COALESCE(octet_length(body), 0), body IS NOT NULL, received_at, updated_at, run_at, lease_until,
	delivered_at, last_status, last_error`

func buildQueries(n names) queries {
	q, a := n.queue.Sanitize(), n.attempts.Sanitize()
	return queries{
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

		heartbeat: `UPDATE ` + q + ` SET lease_until = now() + $3::bigint` + us + `
			WHERE id = $1 AND token = $2 AND state = 'delivering'`,
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
