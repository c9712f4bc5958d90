package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// maxClaimRounds bounds how often Claim retries when the row changes between
// its claim statement and the follow-up read.
const maxClaimRounds = 5

// now is SQLite's clock in Unix milliseconds; 'now' is stable within one
// statement.
const now = `CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)`

type queries struct {
	claim, inspect, hold         string
	heartbeat, complete, release string
	holdClaim                    string
	get, forget, resolve         string
	list, deleteBatch            string
}

const columns = `scope, event_id, state, attempts, first_seen, updated_at, lease_until, completed_at, status`

func buildQueries(t string) queries {
	return queries{
		// One statement decides the claim, as in the postgres store. ?4 is
		// the lease in milliseconds.
		claim: `INSERT INTO ` + t + ` AS e
				(scope, event_id, state, token, attempts, lease_until, first_seen, updated_at)
			VALUES (?1, ?2, 'processing', ?3, 1, ` + now + ` + ?4, ` + now + `, ` + now + `)
			ON CONFLICT (scope, event_id) DO UPDATE SET
				state        = 'processing',
				token        = excluded.token,
				attempts     = e.attempts + 1,
				lease_until  = excluded.lease_until,
				updated_at   = excluded.updated_at,
				completed_at = NULL,
				status       = 0
			WHERE e.state = 'released'
				OR (e.state = 'processing' AND e.lease_until <= ` + now + ` AND NOT ?5)
			RETURNING attempts`,
		inspect: `SELECT state, token, attempts, status, COALESCE(MAX(lease_until - ` + now + `, 0), 0)
			FROM ` + t + ` WHERE scope = ?1 AND event_id = ?2`,
		hold: `UPDATE ` + t + ` SET state = 'held', token = '', lease_until = NULL, updated_at = ` + now + `
			WHERE scope = ?1 AND event_id = ?2 AND state = 'processing' AND token = ?3 AND lease_until <= ` + now + `
			RETURNING attempts`,
		heartbeat: `UPDATE ` + t + ` SET lease_until = ` + now + ` + ?4, updated_at = ` + now + `
			WHERE scope = ?1 AND event_id = ?2 AND token = ?3 AND state = 'processing'`,
		complete: `UPDATE ` + t + ` SET state = 'completed', status = ?4, token = '', lease_until = NULL,
				completed_at = ` + now + `, updated_at = ` + now + `
			WHERE scope = ?1 AND event_id = ?2 AND token = ?3 AND state = 'processing'`,
		release: `UPDATE ` + t + ` SET state = 'released', token = '', lease_until = NULL, updated_at = ` + now + `
			WHERE scope = ?1 AND event_id = ?2 AND token = ?3 AND state = 'processing'`,
		// The gateway's own decision on its claim (on_ambiguous hold),
		// whatever the lease.
		holdClaim: `UPDATE ` + t + ` SET state = 'held', token = '', lease_until = NULL, updated_at = ` + now + `
			WHERE scope = ?1 AND event_id = ?2 AND token = ?3 AND state = 'processing'`,
		get:    `SELECT ` + columns + ` FROM ` + t + ` WHERE scope = ?1 AND event_id = ?2`,
		forget: `DELETE FROM ` + t + ` WHERE scope = ?1 AND event_id = ?2`,
		// ?3 is 'released' or 'completed'.
		resolve: `UPDATE ` + t + ` SET state = ?3, token = '', lease_until = NULL, status = 0,
				completed_at = CASE WHEN ?3 = 'completed' THEN ` + now + ` END, updated_at = ` + now + `
			WHERE scope = ?1 AND event_id = ?2
				AND (state = 'held' OR (state = 'processing' AND lease_until <= ` + now + `))`,
		list: `SELECT ` + columns + ` FROM ` + t,
		// ?3 is a JSON array of the scopes.
		deleteBatch: `DELETE FROM ` + t + ` WHERE (scope, event_id) IN (
				SELECT scope, event_id FROM ` + t + `
				WHERE scope IN (SELECT value FROM json_each(?3)) AND first_seen < ?1 AND state <> 'processing'
				LIMIT ?2)`,
	}
}

// Claim claims (p.Scope, p.EventID) in one INSERT ... ON CONFLICT DO UPDATE
// ... WHERE <claimable> RETURNING statement; when the row is not claimable
// it reads the row to report Duplicate (with Status), InFlight (with
// RetryAfter, the lease left by SQLite's clock, rounded up to whole seconds,
// at least 1s) or Held. With p.HoldOnExpiry, a processing row whose lease
// has expired is moved to held (only if it still carries the token that was
// read) and Held is returned. p.Lease must be positive. Errors are store
// failures.
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (store.Claim, error) {
	if p.Lease <= 0 {
		return store.Claim{}, fmt.Errorf("claiming event: lease must be positive, got %s", p.Lease)
	}
	for range maxClaimRounds {
		token := store.NewToken()
		var attempts int
		err := s.db.QueryRowContext(ctx, s.q.claim, p.Scope, p.EventID, token, leaseMillis(p.Lease), p.HoldOnExpiry).
			Scan(&attempts)
		if err == nil {
			return store.Claim{Outcome: store.Claimed, Token: token, Attempts: attempts}, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
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
// became claimable in between and the claim should be tried again.
func (s *Store) explain(ctx context.Context, p store.ClaimParams) (c store.Claim, ok bool, err error) {
	var (
		state           string
		token           string
		attempts        int
		status          int
		remainingMillis int64
	)
	err = s.db.QueryRowContext(ctx, s.q.inspect, p.Scope, p.EventID).
		Scan(&state, &token, &attempts, &status, &remainingMillis)
	if errors.Is(err, sql.ErrNoRows) {
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
		if remainingMillis > 0 {
			return store.Claim{
				Outcome:    store.InFlight,
				Attempts:   attempts,
				RetryAfter: store.RetryAfter(time.Duration(remainingMillis) * time.Millisecond),
			}, true, nil
		}
		if !p.HoldOnExpiry {
			return store.Claim{}, false, nil
		}
		err := s.db.QueryRowContext(ctx, s.q.hold, p.Scope, p.EventID, token).Scan(&attempts)
		if errors.Is(err, sql.ErrNoRows) {
			return store.Claim{}, false, nil
		}
		if err != nil {
			return store.Claim{}, false, interpretError(err)
		}
		return store.Claim{Outcome: store.Held, Attempts: attempts}, true, nil
	}
	return store.Claim{}, false, fmt.Errorf("sqlite: unknown event state %q", state)
}

// Heartbeat sets the claim's lease to now + lease (SQLite's clock). It
// returns store.ErrLeaseLost if the row is not processing under token.
func (s *Store) Heartbeat(ctx context.Context, scope, eventID, token string, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("renewing lease: lease must be positive, got %s", lease)
	}
	return s.settle(ctx, "renewing lease", s.q.heartbeat, scope, eventID, token, leaseMillis(lease))
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
	res, err := s.db.ExecContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("%s: %w", op, interpretError(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s: %w", op, interpretError(err))
	}
	if n == 0 {
		return store.ErrLeaseLost
	}
	return nil
}

// Get returns one event, or store.ErrNotFound.
func (s *Store) Get(ctx context.Context, scope, eventID string) (store.Event, error) {
	ev, err := scanEvent(s.db.QueryRowContext(ctx, s.q.get, scope, eventID))
	if err != nil {
		return store.Event{}, fmt.Errorf("getting event: %w", interpretError(err))
	}
	return ev, nil
}

// Forget deletes one event, whatever its state. It returns
// store.ErrNotFound when there is no such row.
func (s *Store) Forget(ctx context.Context, scope, eventID string) error {
	res, err := s.db.ExecContext(ctx, s.q.forget, scope, eventID)
	if err != nil {
		return fmt.Errorf("forgetting event: %w", interpretError(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("forgetting event: %w", interpretError(err))
	}
	if n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// Resolve moves a held event, or a processing one whose lease has expired
// by SQLite's clock, to to (store.StateReleased or store.StateCompleted) in
// one statement. See store.Store.
func (s *Store) Resolve(ctx context.Context, scope, eventID string, to store.State) error {
	if !store.Resolvable(to) {
		return fmt.Errorf("resolving event: cannot resolve to state %q", to)
	}
	res, err := s.db.ExecContext(ctx, s.q.resolve, scope, eventID, string(to))
	if err != nil {
		return fmt.Errorf("resolving event: %w", interpretError(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("resolving event: %w", interpretError(err))
	}
	if n == 1 {
		return nil
	}
	ev, err := s.Get(ctx, scope, eventID)
	if err != nil {
		return err
	}
	return store.ResolveRefused(ev, to)
}

// List returns events matching q, ordered by UpdatedAt, then scope, then
// event ID (byte order). q.Limit defaults to 100 and is capped at 1000. The
// cursor (q.AfterUpdatedAt, q.AfterScope, q.AfterID) is the last event of
// the previous page; it is compared, never looked up.
func (s *Store) List(ctx context.Context, q store.ListQuery) ([]store.Event, error) {
	var (
		where []string
		args  []any
	)
	if q.State != "" {
		where = append(where, "state = ?")
		args = append(args, string(q.State))
	}
	if q.Scope != "" {
		where = append(where, "scope = ?")
		args = append(args, q.Scope)
	}
	if !q.OlderThan.IsZero() {
		where = append(where, "updated_at < ?")
		args = append(args, q.OlderThan.UnixMilli())
	}
	if err := store.CheckCursor(q); err != nil {
		return nil, fmt.Errorf("listing events: %w", err)
	}
	if !q.AfterUpdatedAt.IsZero() {
		where = append(where, "(updated_at, scope, event_id) > (?, ?, ?)")
		args = append(args, q.AfterUpdatedAt.UnixMilli(), q.AfterScope, q.AfterID)
	}
	query := s.q.list
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	query += " ORDER BY updated_at, scope, event_id LIMIT ?"
	args = append(args, listLimit(q.Limit))

	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("listing events: %w", interpretError(err))
	}
	defer rows.Close()
	var events []store.Event
	for rows.Next() {
		ev, err := scanEvent(rows)
		if err != nil {
			return nil, fmt.Errorf("listing events: %w", interpretError(err))
		}
		events = append(events, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing events: %w", interpretError(err))
	}
	return events, nil
}

// DeleteBefore deletes, in one statement, at most limit events of scopes
// whose FirstSeen is before cutoff and that are not processing, and returns
// how many it deleted. A limit of zero or less, or no scopes, deletes
// nothing.
func (s *Store) DeleteBefore(ctx context.Context, scopes []string, cutoff time.Time, limit int) (int, error) {
	if limit <= 0 || len(scopes) == 0 {
		return 0, nil
	}
	scopesJSON, err := json.Marshal(scopes)
	if err != nil {
		return 0, fmt.Errorf("deleting old events: %w", err)
	}
	res, err := s.db.ExecContext(ctx, s.q.deleteBatch, cutoff.UnixMilli(), limit, string(scopesJSON))
	if err != nil {
		return 0, fmt.Errorf("deleting old events: %w", interpretError(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("deleting old events: %w", interpretError(err))
	}
	return int(n), nil
}

type scanner interface{ Scan(dest ...any) error }

func scanEvent(row scanner) (store.Event, error) {
	var (
		ev                    store.Event
		state                 string
		firstSeen, updatedAt  int64
		leaseUntil, completed sql.NullInt64
	)
	err := row.Scan(&ev.Scope, &ev.EventID, &state, &ev.Attempts, &firstSeen, &updatedAt,
		&leaseUntil, &completed, &ev.Status)
	if err != nil {
		return store.Event{}, err
	}
	ev.State = store.State(state)
	ev.FirstSeen = fromMillis(firstSeen)
	ev.UpdatedAt = fromMillis(updatedAt)
	if leaseUntil.Valid {
		ev.LeaseUntil = fromMillis(leaseUntil.Int64)
	}
	if completed.Valid {
		ev.CompletedAt = fromMillis(completed.Int64)
	}
	return ev, nil
}

func fromMillis(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// leaseMillis is a lease in milliseconds, rounded up.
func leaseMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
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
