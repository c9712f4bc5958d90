package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// maxClaimRounds bounds how often Claim retries when the row changes between
// its claim statement and the follow-up read (deleted, released or expired
// in between).
const maxClaimRounds = 5

type queries struct {
	claim, inspect, hold         string
	heartbeat, complete, release string
	holdClaim                    string
	get, forget, resolve         string
	list, deleteBatch            string
}

const columns = `scope, event_id, state, attempts, first_seen, updated_at, lease_until, completed_at, status`

func buildQueries(ident pgx.Identifier) queries {
	t := ident.Sanitize()
	return queries{
		// One statement decides the claim: the primary key settles races,
		// and a conflicting row is taken over only when it is claimable.
		// $4 is the lease in microseconds.
		claim: `INSERT INTO ` + t + ` AS e
				(scope, event_id, state, token, attempts, lease_until, first_seen, updated_at)
			VALUES ($1, $2, 'processing', $3, 1, now() + $4::bigint * interval '1 microsecond', now(), now())
			ON CONFLICT (scope, event_id) DO UPDATE SET
				state        = 'processing',
				token        = EXCLUDED.token,
				attempts     = e.attempts + 1,
				lease_until  = EXCLUDED.lease_until,
				updated_at   = EXCLUDED.updated_at,
				completed_at = NULL,
				status       = 0
			WHERE e.state = 'released'
				OR (e.state = 'processing' AND e.lease_until <= now() AND NOT $5::boolean)
			RETURNING e.attempts`,
		// Why the claim was refused; the lease left in microseconds, by the
		// database clock.
		inspect: `SELECT state, token, attempts, status,
				COALESCE(GREATEST(0, CEIL(EXTRACT(EPOCH FROM (lease_until - now())) * 1000000)), 0)::bigint
			FROM ` + t + ` WHERE scope = $1 AND event_id = $2`,
		hold: `UPDATE ` + t + ` SET state = 'held', token = '', lease_until = NULL, updated_at = now()
			WHERE scope = $1 AND event_id = $2 AND state = 'processing' AND token = $3 AND lease_until <= now()
			RETURNING attempts`,
		heartbeat: `UPDATE ` + t + ` SET lease_until = now() + $4::bigint * interval '1 microsecond', updated_at = now()
			WHERE scope = $1 AND event_id = $2 AND token = $3 AND state = 'processing'`,
		complete: `UPDATE ` + t + ` SET state = 'completed', status = $4, token = '', lease_until = NULL,
				completed_at = now(), updated_at = now()
			WHERE scope = $1 AND event_id = $2 AND token = $3 AND state = 'processing'`,
		release: `UPDATE ` + t + ` SET state = 'released', token = '', lease_until = NULL, updated_at = now()
			WHERE scope = $1 AND event_id = $2 AND token = $3 AND state = 'processing'`,
		// The gateway's own decision on its claim (on_ambiguous hold),
		// whatever the lease.
		holdClaim: `UPDATE ` + t + ` SET state = 'held', token = '', lease_until = NULL, updated_at = now()
			WHERE scope = $1 AND event_id = $2 AND token = $3 AND state = 'processing'`,
		get:    `SELECT ` + columns + ` FROM ` + t + ` WHERE scope = $1 AND event_id = $2`,
		forget: `DELETE FROM ` + t + ` WHERE scope = $1 AND event_id = $2`,
		// An operator's decision on a held row or an expired claim; $3 is
		// 'released' or 'completed'.
		resolve: `UPDATE ` + t + ` SET state = $3::text, token = '', lease_until = NULL, status = 0,
				completed_at = CASE WHEN $3::text = 'completed' THEN now() END, updated_at = now()
			WHERE scope = $1 AND event_id = $2
				AND (state = 'held' OR (state = 'processing' AND lease_until <= now()))`,
		list: `SELECT ` + columns + ` FROM ` + t,
		// Bounded: at most $2 rows of the scopes $3, skipping rows other
		// sessions hold (a claim in progress), never a processing row.
		deleteBatch: `DELETE FROM ` + t + ` WHERE (scope, event_id) IN (
				SELECT scope, event_id FROM ` + t + `
				WHERE scope = ANY($3::text[]) AND first_seen < $1 AND state <> 'processing'
				LIMIT $2
				FOR UPDATE SKIP LOCKED)
			AND state <> 'processing'`,
	}
}

// Claim claims (p.Scope, p.EventID) in one INSERT ... ON CONFLICT DO UPDATE
// ... WHERE <claimable> statement; when the row is not claimable it reads
// the row to report Duplicate (with Status), InFlight (with RetryAfter, the
// lease left by the database clock, rounded up to whole seconds, at least
// 1s) or Held. With p.HoldOnExpiry, a processing row whose lease has expired
// is moved to held (only if it still carries the token that was read) and
// Held is returned. p.Lease must be positive. Errors are store failures.
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (store.Claim, error) {
	if p.Lease <= 0 {
		return store.Claim{}, fmt.Errorf("claiming event: lease must be positive, got %s", p.Lease)
	}
	for range maxClaimRounds {
		token := store.NewToken()
		var attempts int
		err := s.pool.QueryRow(ctx, s.q.claim, p.Scope, p.EventID, token, leaseMicros(p.Lease), p.HoldOnExpiry).
			Scan(&attempts)
		if err == nil {
			return store.Claim{Outcome: store.Claimed, Token: token, Attempts: attempts}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return store.Claim{}, fmt.Errorf("claiming event: %w", interpretError(err))
		}
		c, ok, err := s.explain(ctx, p)
		if err != nil {
			return store.Claim{}, fmt.Errorf("claiming event: %w", err)
		}
		if ok {
			return c, nil
		}
	}
	return store.Claim{}, fmt.Errorf("claiming event: the row changed under %d consecutive claims", maxClaimRounds)
}

// explain reads the row a claim was refused on. ok is false when the row
// became claimable in between (deleted, released, lease just expired) and
// the claim should be tried again.
func (s *Store) explain(ctx context.Context, p store.ClaimParams) (c store.Claim, ok bool, err error) {
	var (
		state           string
		token           string
		attempts        int
		status          int
		remainingMicros int64
	)
	err = s.pool.QueryRow(ctx, s.q.inspect, p.Scope, p.EventID).
		Scan(&state, &token, &attempts, &status, &remainingMicros)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Claim{}, false, nil
	}
	if err != nil {
		return store.Claim{}, false, interpretError(err)
	}
	switch store.State(state) {
	case store.StateCompleted:
		return store.Claim{Outcome: store.Duplicate, Attempts: attempts, Status: status}, true, nil
	case store.StateHeld:
		return store.Claim{Outcome: store.Held, Attempts: attempts}, true, nil
	case store.StateReleased:
		return store.Claim{}, false, nil
	case store.StateProcessing:
		if remainingMicros > 0 {
			return store.Claim{
				Outcome:    store.InFlight,
				Attempts:   attempts,
				RetryAfter: store.RetryAfter(time.Duration(remainingMicros) * time.Microsecond),
			}, true, nil
		}
		if !p.HoldOnExpiry {
			return store.Claim{}, false, nil
		}
		err := s.pool.QueryRow(ctx, s.q.hold, p.Scope, p.EventID, token).Scan(&attempts)
		if errors.Is(err, pgx.ErrNoRows) {
			return store.Claim{}, false, nil // heartbeat or settled meanwhile
		}
		if err != nil {
			return store.Claim{}, false, interpretError(err)
		}
		return store.Claim{Outcome: store.Held, Attempts: attempts}, true, nil
	}
	return store.Claim{}, false, fmt.Errorf("postgres: unknown event state %q", state)
}

// Heartbeat sets the claim's lease to now() + lease (database clock). It
// returns store.ErrLeaseLost if the row is not processing under token.
func (s *Store) Heartbeat(ctx context.Context, scope, eventID, token string, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("renewing lease: lease must be positive, got %s", lease)
	}
	return s.settle(ctx, "renewing lease", s.q.heartbeat, scope, eventID, token, leaseMicros(lease))
}

// Complete marks the claimed event completed with the upstream's HTTP
// status. It returns store.ErrLeaseLost if the row is not processing under
// token.
func (s *Store) Complete(ctx context.Context, scope, eventID, token string, status int) error {
	return s.settle(ctx, "completing event", s.q.complete, scope, eventID, token, status)
}

// Release marks the claimed event released, so the next delivery claims it
// again. It returns store.ErrLeaseLost if the row is not processing under
// token.
func (s *Store) Release(ctx context.Context, scope, eventID, token string) error {
	return s.settle(ctx, "releasing event", s.q.release, scope, eventID, token)
}

// Hold parks the claimed event in store.StateHeld, live lease or not (the
// forward's outcome is ambiguous and the route says on_ambiguous hold). It
// returns store.ErrLeaseLost if the row is not processing under token.
func (s *Store) Hold(ctx context.Context, scope, eventID, token string) error {
	return s.settle(ctx, "holding event", s.q.holdClaim, scope, eventID, token)
}

func (s *Store) settle(ctx context.Context, op, query string, args ...any) error {
	tag, err := s.pool.Exec(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("%s: %w", op, interpretError(err))
	}
	if tag.RowsAffected() == 0 {
		return store.ErrLeaseLost
	}
	return nil
}

// Get returns one event, or store.ErrNotFound.
func (s *Store) Get(ctx context.Context, scope, eventID string) (store.Event, error) {
	rows, err := s.pool.Query(ctx, s.q.get, scope, eventID)
	if err != nil {
		return store.Event{}, fmt.Errorf("getting event: %w", interpretError(err))
	}
	ev, err := pgx.CollectExactlyOneRow(rows, scanEvent)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Event{}, store.ErrNotFound
	}
	if err != nil {
		return store.Event{}, fmt.Errorf("getting event: %w", interpretError(err))
	}
	return ev, nil
}

// Forget deletes one event, whatever its state. It returns
// store.ErrNotFound when there is no such row.
func (s *Store) Forget(ctx context.Context, scope, eventID string) error {
	tag, err := s.pool.Exec(ctx, s.q.forget, scope, eventID)
	if err != nil {
		return fmt.Errorf("forgetting event: %w", interpretError(err))
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}

// Resolve moves a held event, or a processing one whose lease has expired
// by the database clock, to to (store.StateReleased or
// store.StateCompleted) in one statement. See store.Store.
func (s *Store) Resolve(ctx context.Context, scope, eventID string, to store.State) error {
	if !store.Resolvable(to) {
		return fmt.Errorf("resolving event: cannot resolve to state %q", to)
	}
	tag, err := s.pool.Exec(ctx, s.q.resolve, scope, eventID, string(to))
	if err != nil {
		return fmt.Errorf("resolving event: %w", interpretError(err))
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	ev, err := s.Get(ctx, scope, eventID)
	if err != nil {
		return err
	}
	return store.ResolveRefused(ev, to)
}

// List returns events matching q, ordered by UpdatedAt, then scope, then
// event ID. q.Limit defaults to 100 and is capped at 1000. The cursor
// (q.AfterUpdatedAt, q.AfterScope, q.AfterID) is the last event of the
// previous page; it is compared, never looked up.
func (s *Store) List(ctx context.Context, q store.ListQuery) ([]store.Event, error) {
	var (
		where []string
		args  []any
	)
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if q.State != "" {
		where = append(where, "state = "+arg(string(q.State)))
	}
	if q.Scope != "" {
		where = append(where, "scope = "+arg(q.Scope))
	}
	if !q.OlderThan.IsZero() {
		where = append(where, "updated_at < "+arg(q.OlderThan))
	}
	if err := store.CheckCursor(q); err != nil {
		return nil, fmt.Errorf("listing events: %w", err)
	}
	if !q.AfterUpdatedAt.IsZero() {
		where = append(where, "(updated_at, scope, event_id) > ("+
			arg(q.AfterUpdatedAt)+", "+arg(q.AfterScope)+", "+arg(q.AfterID)+")")
	}
	query := s.q.list
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	query += " ORDER BY updated_at, scope, event_id LIMIT " + arg(listLimit(q.Limit))

	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("listing events: %w", interpretError(err))
	}
	events, err := pgx.CollectRows(rows, scanEvent)
	if err != nil {
		return nil, fmt.Errorf("listing events: %w", interpretError(err))
	}
	return events, nil
}

// DeleteBefore deletes, in one statement, at most limit events of scopes
// whose FirstSeen is before cutoff and that are not processing, skipping
// rows another session has locked, and returns how many it deleted. A limit
// of zero or less, or no scopes, deletes nothing.
func (s *Store) DeleteBefore(ctx context.Context, scopes []string, cutoff time.Time, limit int) (int, error) {
	if limit <= 0 || len(scopes) == 0 {
		return 0, nil
	}
	tag, err := s.pool.Exec(ctx, s.q.deleteBatch, cutoff, limit, scopes)
	if err != nil {
		return 0, fmt.Errorf("deleting old events: %w", interpretError(err))
	}
	return int(tag.RowsAffected()), nil
}

func scanEvent(row pgx.CollectableRow) (store.Event, error) {
	var (
		ev                    store.Event
		state                 string
		leaseUntil, completed *time.Time
	)
	err := row.Scan(&ev.Scope, &ev.EventID, &state, &ev.Attempts, &ev.FirstSeen, &ev.UpdatedAt,
		&leaseUntil, &completed, &ev.Status)
	if err != nil {
		return store.Event{}, err
	}
	ev.State = store.State(state)
	ev.FirstSeen = ev.FirstSeen.UTC()
	ev.UpdatedAt = ev.UpdatedAt.UTC()
	if leaseUntil != nil {
		ev.LeaseUntil = leaseUntil.UTC()
	}
	if completed != nil {
		ev.CompletedAt = completed.UTC()
	}
	return ev, nil
}

// leaseMicros is a lease in whole microseconds (PostgreSQL's resolution),
// at least one.
func leaseMicros(d time.Duration) int64 {
	return max(d.Microseconds(), 1)
}

func listLimit(n int) int {
	switch {
	case n <= 0:
		return 100
	case n > 1000:
		return 1000
	}
	return n
}
