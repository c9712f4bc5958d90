package postgres

import (
	"context"
	"time"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// The typed statements of store.Driver: each runs its store.Stmt from the
// driver's table with its arguments in the order the SQL numbers them.

func (d driver) ClaimRow(ctx context.Context, a store.ClaimArgs) (int, error) {
	var attempts int
	err := d.queryRow(ctx, store.StmtClaim, a.Scope, a.EventID, a.Token, a.Lease, a.Hold, a.Fingerprint).Scan(&attempts)
	return attempts, err
}

func (d driver) InspectRow(ctx context.Context, scope, eventID string) (store.Inspected, error) {
	var (
		r     store.Inspected
		state string
		left  int64 // the lease left in microseconds (StmtInspect)
	)
	err := d.queryRow(ctx, store.StmtInspect, scope, eventID).Scan(&state, &r.Token, &r.Attempts, &r.Status, &left, &r.Fingerprint)
	r.State, r.LeaseLeft = store.State(state), time.Duration(left)*time.Microsecond
	return r, err
}

func (d driver) HoldExpiredRow(ctx context.Context, scope, eventID, token, reason string) (int, error) {
	var attempts int
	err := d.queryRow(ctx, store.StmtHoldExpired, scope, eventID, token, reason).Scan(&attempts)
	return attempts, err
}

func (d driver) RenewRow(ctx context.Context, scope, eventID, token string, lease time.Duration) (bool, error) {
	return d.exec(ctx, store.StmtRenew, scope, eventID, token, lease)
}

func (d driver) CompleteRow(ctx context.Context, scope, eventID, token string, status int) (bool, error) {
	return d.exec(ctx, store.StmtComplete, scope, eventID, token, status)
}

func (d driver) ReleaseRow(ctx context.Context, scope, eventID, token string) (bool, error) {
	return d.exec(ctx, store.StmtRelease, scope, eventID, token)
}

func (d driver) HoldRow(ctx context.Context, scope, eventID, token, reason string) (bool, error) {
	return d.exec(ctx, store.StmtHold, scope, eventID, token, reason)
}

func (d driver) ForgetRow(ctx context.Context, scope, eventID string) (bool, error) {
	return d.exec(ctx, store.StmtForget, scope, eventID)
}

func (d driver) ResolveRow(ctx context.Context, scope, eventID string, to store.State) (bool, error) {
	return d.exec(ctx, store.StmtResolve, scope, eventID, to)
}

func (d driver) CompleteResponseRow(ctx context.Context, scope, eventID, token string, r store.RawResponse) (bool, error) {
	var body any // NULL: not stored
	if r.Body != nil {
		body = r.Body
	}
	return d.exec(ctx, store.StmtCompleteResponse, scope, eventID, token, r.Status, r.Header, body, r.Size, r.SHA256)
}

func (d driver) ResponseRow(ctx context.Context, scope, eventID string) (store.RawResponse, error) {
	var r store.RawResponse
	err := d.queryRow(ctx, store.StmtResponse, scope, eventID).Scan(&r.Status, &r.Header, &r.Body, &r.Size, &r.SHA256, &r.Fingerprint)
	return r, err
}
