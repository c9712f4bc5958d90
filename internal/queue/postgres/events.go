package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// batch is the most rows one bulk statement (retry all, purge) touches.
const batch = 1000

// Take takes back expired leases, then hands out due events within the
// caps. With a cap, the whole take runs under the scope's transaction
// advisory lock: takers of one scope queue up for a few milliseconds each,
// and each counts the deliveries the previous ones committed, so the cap
// holds across every instance.
func (q *Queue) Take(ctx context.Context, p queue.TakeParams) (b queue.Batch, err error) {
	err = q.run.Run(ctx, func(ctx context.Context) error {
		b, err = q.take(ctx, p)
		return err
	})
	return b, err
}

func (q *Queue) take(ctx context.Context, p queue.TakeParams) (queue.Batch, error) {
	var b queue.Batch
	if p.Limit <= 0 {
		return b, nil
	}
	if p.Lease <= 0 {
		return b, fmt.Errorf("taking events: lease must be positive, got %s", p.Lease)
	}
	tx, err := q.pool.Begin(ctx)
	if err != nil {
		return b, fmt.Errorf("taking events: %w", interpretError(err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	fail := func(err error) (queue.Batch, error) {
		return queue.Batch{}, fmt.Errorf("taking events: %w", interpretError(err))
	}

	capped := p.MaxConcurrency > 0 || p.Rate > 0
	if capped {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey("take", q.lockBase, p.Scope)); err != nil {
			return fail(err)
		}
	}

	rows, err := tx.Query(ctx, q.sql.reap, p.Scope, p.MaxAttempts, micros(p.MaxAge))
	if err != nil {
		return fail(err)
	}
	var lostIDs []int64
	var lostAttempts []int32
	for rows.Next() {
		var (
			id    int64
			n     int32
			state string
		)
		if err := rows.Scan(&id, &n, &state); err != nil {
			rows.Close()
			return fail(err)
		}
		lostIDs, lostAttempts = append(lostIDs, id), append(lostAttempts, n)
		if state == string(queue.StateDead) {
			b.LostDead++
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fail(err)
	}
	b.Lost = len(lostIDs)
	if b.Lost > 0 {
		if _, err := tx.Exec(ctx, q.sql.loseAttempts, lostIDs, lostAttempts); err != nil {
			return fail(err)
		}
	}

	n := p.Limit
	if capped {
		var (
			busy, recent int
			rateWait     int64
		)
		per := time.Duration(0)
		if p.Rate > 0 {
			per = p.Per
		}
		if err := tx.QueryRow(ctx, q.sql.budget, p.Scope, micros(per)).Scan(&busy, &recent, &rateWait); err != nil {
			return fail(err)
		}
		if p.MaxConcurrency > 0 && p.MaxConcurrency-busy < n {
			n = max(0, p.MaxConcurrency-busy)
			b.Busy = n == 0
		}
		if p.Rate > 0 && p.Rate-recent < n {
			n = max(0, p.Rate-recent)
			if n == 0 {
				b.RateLimited = true
				b.NextIn = time.Duration(rateWait) * time.Microsecond
			}
		}
	}
	if n > 0 {
		token := store.NewToken()
		rows, err := tx.Query(ctx, q.sql.take, p.Scope, n, token, micros(p.Lease))
		if err != nil {
			return fail(err)
		}
		for rows.Next() {
			j := queue.Job{Scope: p.Scope, Token: token}
			var hjson []byte
			if err := rows.Scan(&j.ID, &j.EventID, &j.OrderKey, &j.Attempt, &j.RoundAttempts,
				&j.Request.Method, &j.Request.URI, &hjson, &j.Request.Body, &j.ReceivedAt); err != nil {
				rows.Close()
				return fail(err)
			}
			if err := json.Unmarshal(hjson, &j.Request.Header); err != nil {
				rows.Close()
				return queue.Batch{}, fmt.Errorf("taking events: decoding headers of event %d: %w", j.ID, err)
			}
			b.Jobs = append(b.Jobs, j)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fail(err)
		}
	}
	if len(b.Jobs) > 0 {
		ids := make([]int64, len(b.Jobs))
		attempts := make([]int32, len(b.Jobs))
		for i, j := range b.Jobs {
			ids[i], attempts[i] = j.ID, int32(j.Attempt)
		}
		if _, err := tx.Exec(ctx, q.sql.startAttempts, ids, attempts, p.Scope, p.Worker); err != nil {
			return fail(err)
		}
	} else if !b.Busy && !b.RateLimited {
		var next int64
		if err := tx.QueryRow(ctx, q.sql.nextDue, p.Scope).Scan(&next); err != nil {
			return fail(err)
		}
		if next > 0 {
			b.NextIn = time.Duration(next) * time.Microsecond
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fail(err)
	}
	return b, nil
}

// Heartbeat sets the lease of a taken event to now() + lease.
func (q *Queue) Heartbeat(ctx context.Context, id int64, token string, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("renewing queue lease: lease must be positive, got %s", lease)
	}
	var n int64
	err := q.runAgain(ctx, func(ctx context.Context) error {
		tag, err := q.pool.Exec(ctx, q.sql.heartbeat, id, token, micros(lease))
		n = tag.RowsAffected()
		return interpretError(err)
	})
	if err != nil {
		return fmt.Errorf("renewing queue lease: %w", err)
	}
	if n == 0 {
		return queue.ErrLeaseLost
	}
	return nil
}

// Settle moves the event on and completes its attempt row, in one
// transaction. When the token no longer holds the event the attempt is
// still completed (its outcome stays lost if it was taken back) and
// queue.ErrLeaseLost is returned.
func (q *Queue) Settle(ctx context.Context, s queue.Settlement) (state queue.State, err error) {
	err = q.runAgain(ctx, func(ctx context.Context) error {
		state, err = q.settle(ctx, s)
		return err
	})
	return state, err
}

func (q *Queue) settle(ctx context.Context, s queue.Settlement) (queue.State, error) {
	tx, err := q.pool.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("settling event: %w", interpretError(err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var state string
	err = tx.QueryRow(ctx, q.sql.settle, s.ID, s.Token, s.Delivered, s.Status, s.Error,
		s.MaxAttempts, micros(s.MaxAge), micros(max(s.RetryIn, 0))).Scan(&state)
	lost := errors.Is(err, pgx.ErrNoRows)
	if err != nil && !lost {
		return "", fmt.Errorf("settling event: %w", interpretError(err))
	}
	outcome := queue.AttemptLost
	switch queue.State(state) {
	case queue.StateDelivered:
		outcome = queue.AttemptDelivered
	case queue.StateDead:
		outcome = queue.AttemptDead
	case queue.StateQueued:
		outcome = queue.AttemptRetry
	}
	if _, err := tx.Exec(ctx, q.sql.finishAttempt, s.ID, s.Attempt, micros(s.Duration), s.Status, s.Error, outcome); err != nil {
		return "", fmt.Errorf("settling event: recording attempt: %w", interpretError(err))
	}
	if err := tx.Commit(ctx); err != nil {
		return "", fmt.Errorf("settling event: committing: %w", interpretError(err))
	}
	if lost {
		return "", queue.ErrLeaseLost
	}
	return queue.State(state), nil
}

// Release queues a taken event again at once; the attempt does not count
// against max_attempts.
func (q *Queue) Release(ctx context.Context, id int64, token string, attempt int) error {
	return q.runAgain(ctx, func(ctx context.Context) error { return q.release(ctx, id, token, attempt) })
}

func (q *Queue) release(ctx context.Context, id int64, token string, attempt int) error {
	tx, err := q.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("releasing event: %w", interpretError(err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	tag, err := tx.Exec(ctx, q.sql.release, id, token)
	if err != nil {
		return fmt.Errorf("releasing event: %w", interpretError(err))
	}
	if tag.RowsAffected() == 0 {
		return queue.ErrLeaseLost
	}
	if _, err := tx.Exec(ctx, q.sql.releaseAttempt, id, attempt); err != nil {
		return fmt.Errorf("releasing event: %w", interpretError(err))
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("releasing event: committing: %w", interpretError(err))
	}
	return nil
}

// Get returns one event without its body, or queue.ErrNotFound.
func (q *Queue) Get(ctx context.Context, scope, eventID string) (queue.Event, error) {
	rows, err := q.pool.Query(ctx, q.sql.get, scope, eventID)
	if err != nil {
		return queue.Event{}, fmt.Errorf("getting queued event: %w", interpretError(err))
	}
	ev, err := pgx.CollectExactlyOneRow(rows, scanEvent)
	if errors.Is(err, pgx.ErrNoRows) {
		return queue.Event{}, queue.ErrNotFound
	}
	if err != nil {
		return queue.Event{}, fmt.Errorf("getting queued event: %w", interpretError(err))
	}
	return ev, nil
}

// Attempts returns the attempts of the event with queue ID id.
func (q *Queue) Attempts(ctx context.Context, id int64) ([]queue.Attempt, error) {
	rows, err := q.pool.Query(ctx, q.sql.attempts, id)
	if err != nil {
		return nil, fmt.Errorf("listing attempts: %w", interpretError(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (queue.Attempt, error) {
		var (
			a        queue.Attempt
			finished *time.Time
			dur      int64
		)
		err := row.Scan(&a.Attempt, &a.Worker, &a.StartedAt, &finished, &dur, &a.Status, &a.Error, &a.Outcome)
		if finished != nil {
			a.FinishedAt = *finished
		}
		a.Duration = time.Duration(dur) * time.Microsecond
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("listing attempts: %w", interpretError(err))
	}
	return out, nil
}

// List returns events of a scope in ID order, after the cursor.
func (q *Queue) List(ctx context.Context, lq queue.ListQuery) ([]queue.Event, error) {
	if lq.Scope == "" {
		return nil, errors.New("listing queued events: scope is required")
	}
	args := []any{lq.Scope}
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	where := []string{"scope = $1"}
	if lq.State != "" {
		where = append(where, "state = "+arg(string(lq.State)))
	}
	if lq.AfterID > 0 {
		where = append(where, "id > "+arg(lq.AfterID))
	}
	limit := lq.Limit
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, 1000)
	query := q.sql.list + " WHERE " + strings.Join(where, " AND ") + " ORDER BY id LIMIT " + arg(limit)
	rows, err := q.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("listing queued events: %w", interpretError(err))
	}
	evs, err := pgx.CollectRows(rows, scanEvent)
	if err != nil {
		return nil, fmt.Errorf("listing queued events: %w", interpretError(err))
	}
	return evs, nil
}

// Retry makes a dead event due now with a fresh round, or a queued one due
// now.
func (q *Queue) Retry(ctx context.Context, scope, eventID string) error {
	tag, err := q.pool.Exec(ctx, q.sql.retry, scope, eventID)
	if err != nil {
		return fmt.Errorf("retrying event: %w", interpretError(err))
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	return q.refused(ctx, "retrying event", scope, eventID)
}

// refused explains why a statement on one event changed nothing.
func (q *Queue) refused(ctx context.Context, op, scope, eventID string) error {
	var state string
	err := q.pool.QueryRow(ctx, q.sql.exists, scope, eventID).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return queue.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("%s: %w", op, interpretError(err))
	}
	return fmt.Errorf("%s: %w: it is %s", op, queue.ErrConflict, state)
}

// RetryDead makes every dead event of scope due now, in batches.
func (q *Queue) RetryDead(ctx context.Context, scope string) (int, error) {
	return q.bulk(ctx, "retrying dead events", q.sql.retryDead, scope)
}

// Purge deletes one event (and its attempts) unless it is in delivery.
func (q *Queue) Purge(ctx context.Context, scope, eventID string) error {
	tag, err := q.pool.Exec(ctx, q.sql.purge, scope, eventID)
	if err != nil {
		return fmt.Errorf("purging event: %w", interpretError(err))
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	return q.refused(ctx, "purging event", scope, eventID)
}

// PurgeState deletes every event of scope in state, in batches. Events in
// delivery cannot be purged.
func (q *Queue) PurgeState(ctx context.Context, scope string, state queue.State) (int, error) {
	if !state.Valid() || state == queue.StateDelivering {
		return 0, fmt.Errorf("purging events: cannot purge state %q", state)
	}
	return q.bulk(ctx, "purging events", q.sql.purgeState, scope, string(state))
}

// bulk runs a batched statement ($1 scope, then args, then the batch size)
// until a batch touches fewer rows than the batch size.
func (q *Queue) bulk(ctx context.Context, op, query, scope string, args ...any) (int, error) {
	all := append(append([]any{scope}, args...), batch)
	total := 0
	for {
		tag, err := q.pool.Exec(ctx, query, all...)
		if err != nil {
			return total, fmt.Errorf("%s: %w", op, interpretError(err))
		}
		total += int(tag.RowsAffected())
		if tag.RowsAffected() < batch {
			return total, nil
		}
	}
}

// Stats counts the scope's queued, delivering and dead events and the age
// of the oldest undelivered one.
func (q *Queue) Stats(ctx context.Context, scope string) (queue.Stats, error) {
	var (
		s   queue.Stats
		age int64
	)
	if err := q.pool.QueryRow(ctx, q.sql.stats, scope).Scan(&s.Queued, &s.Delivering, &s.Dead, &age); err != nil {
		return queue.Stats{}, fmt.Errorf("counting queued events: %w", interpretError(err))
	}
	s.OldestAge = time.Duration(age) * time.Microsecond
	return s, nil
}

// Sweep deletes delivered and dead events received before the retention
// and strips the bodies of events delivered before keep_body, at most
// p.Limit rows each, skipping rows other sessions lock.
func (q *Queue) Sweep(ctx context.Context, p queue.SweepParams) (deleted, stripped int, err error) {
	if p.Limit <= 0 {
		return 0, 0, nil
	}
	if p.Retention > 0 {
		tag, err := q.pool.Exec(ctx, q.sql.sweepDelete, p.Scope, micros(p.Retention), p.Limit)
		if err != nil {
			return 0, 0, fmt.Errorf("deleting old queued events: %w", interpretError(err))
		}
		deleted = int(tag.RowsAffected())
	}
	if p.KeepBody > 0 {
		tag, err := q.pool.Exec(ctx, q.sql.sweepStrip, p.Scope, micros(p.KeepBody), p.Limit)
		if err != nil {
			return deleted, 0, fmt.Errorf("dropping delivered bodies: %w", interpretError(err))
		}
		stripped = int(tag.RowsAffected())
	}
	return deleted, stripped, nil
}

func scanEvent(row pgx.CollectableRow) (queue.Event, error) {
	var (
		ev               queue.Event
		state            string
		lease, delivered *time.Time
	)
	err := row.Scan(&ev.ID, &ev.Scope, &ev.EventID, &ev.OrderKey, &state, &ev.Attempts, &ev.RoundAttempts,
		&ev.Method, &ev.URI, &ev.BodySize, &ev.BodyKept, &ev.ReceivedAt, &ev.UpdatedAt, &ev.RunAt, &lease,
		&delivered, &ev.LastStatus, &ev.LastError)
	ev.State = queue.State(state)
	if lease != nil {
		ev.LeaseUntil = *lease
	}
	if delivered != nil {
		ev.DeliveredAt = *delivered
	}
	return ev, err
}
