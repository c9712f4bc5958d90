package store

import (
	"context"
	"time"
)

// rows gives a Driver's statements their typed signatures: each method
// runs its Stmt with its arguments in the order the Stmt documents, and
// scans what it returns. Errors are the driver's (ErrNotFound when a
// statement returned no row).
type rows struct{ Driver }

// ClaimRow runs the claim statement (StmtClaim) and returns the row's
// attempts and ambiguous endings; ErrNotFound when the row exists and
// is not claimable.
func (d rows) ClaimRow(ctx context.Context, a ClaimArgs) (ClaimedRow, error) {
	var c ClaimedRow
	err := d.QueryStmt(ctx, StmtClaim, a.Scope, a.EventID, a.Token, a.Lease, a.Hold, a.Fingerprint).Scan(&c.Attempts, &c.Ambiguous)
	return c, err
}

// InspectRow reads what explains a refused claim (StmtInspect);
// ErrNotFound when there is no row.
func (d rows) InspectRow(ctx context.Context, scope, eventID string) (Inspected, error) {
	var (
		r     Inspected
		state string
		left  int64 // the lease left in microseconds (StmtInspect)
	)
	err := d.QueryStmt(ctx, StmtInspect, scope, eventID).Scan(&state, &r.Token, &r.Attempts, &r.Status, &left, &r.Fingerprint)
	r.State, r.LeaseLeft = State(state), time.Duration(left)*time.Microsecond
	return r, err
}

// HoldExpiredRow holds a processing row whose lease expired under
// token, with reason (StmtHoldExpired), and returns its attempts;
// ErrNotFound when it is no longer so.
func (d rows) HoldExpiredRow(ctx context.Context, scope, eventID, token, reason string) (int, error) {
	var attempts int
	err := d.QueryStmt(ctx, StmtHoldExpired, scope, eventID, token, reason).Scan(&attempts)
	return attempts, err
}

// RenewRow sets the lease of the row processing under token to now +
// lease by the database clock (StmtRenew).
func (d rows) RenewRow(ctx context.Context, scope, eventID, token string, lease time.Duration) (bool, error) {
	return d.ExecStmt(ctx, StmtRenew, scope, eventID, token, lease)
}

// CompleteRow completes the row processing under token with status
// (StmtComplete).
func (d rows) CompleteRow(ctx context.Context, scope, eventID, token string, status int) (bool, error) {
	return d.ExecStmt(ctx, StmtComplete, scope, eventID, token, status)
}

// ReleaseRow releases the row processing under token (StmtRelease).
func (d rows) ReleaseRow(ctx context.Context, scope, eventID, token string) (bool, error) {
	return d.ExecStmt(ctx, StmtRelease, scope, eventID, token)
}

// ReleaseAmbiguousRow releases the row processing under token and
// counts an ambiguous ending (StmtReleaseAmbiguous).
func (d rows) ReleaseAmbiguousRow(ctx context.Context, scope, eventID, token string) (bool, error) {
	return d.ExecStmt(ctx, StmtReleaseAmbiguous, scope, eventID, token)
}

// HoldRow holds the row processing under token, with reason (StmtHold).
func (d rows) HoldRow(ctx context.Context, scope, eventID, token, reason string) (bool, error) {
	return d.ExecStmt(ctx, StmtHold, scope, eventID, token, reason)
}

// ForgetRow deletes the row, whatever its state (StmtForget).
func (d rows) ForgetRow(ctx context.Context, scope, eventID string) (bool, error) {
	return d.ExecStmt(ctx, StmtForget, scope, eventID)
}

// ResolveRow moves a resolvable row to to (StmtResolve).
func (d rows) ResolveRow(ctx context.Context, scope, eventID string, to State) (bool, error) {
	return d.ExecStmt(ctx, StmtResolve, scope, eventID, to)
}

// CompleteResponseRow is CompleteRow storing the response r
// (StmtCompleteResponse; r.Fingerprint is not written).
func (d rows) CompleteResponseRow(ctx context.Context, scope, eventID, token string, r RawResponse) (bool, error) {
	var body any // NULL: not stored
	if r.Body != nil {
		body = r.Body
	}
	return d.ExecStmt(ctx, StmtCompleteResponse, scope, eventID, token, r.Status, r.Header, body, r.Size, r.SHA256)
}

// ResponseRow reads the response stored with a completed row
// (StmtResponse); ErrNotFound when there is none.
func (d rows) ResponseRow(ctx context.Context, scope, eventID string) (RawResponse, error) {
	var r RawResponse
	err := d.QueryStmt(ctx, StmtResponse, scope, eventID).Scan(&r.Status, &r.Header, &r.Body, &r.Size, &r.SHA256, &r.Fingerprint)
	return r, err
}
