package store

import (
	"context"
	"time"
)

// Driver is one backend's SQL for the events table: one call per
// statement, answering what the statement did (the row read, whether a row
// changed). It holds no rule: what is claimable, what a refused claim
// means, when a settle has lost its lease, all live in Rules, once for
// every backend (River's drivers carry SQL only). Errors are already mapped
// at the driver's edge: callers never see driver types.
//
// Rules reaches each statement through one typed method (rows, River's
// riverdriver shape): a swapped argument fails to compile, and the order
// of a statement's arguments is written once for every backend. Adding an
// operation that changes one row (say, holding a claim) means a Stmt, its
// SQL in each driver's table of statements, its method on rows, and a
// Rules method giving the result its meaning (leaseHeld for token-keyed
// ones).
type Driver interface {
	// QueryStmt runs stmt from the driver's table of statements with args
	// in the order its Stmt documents and returns its one row; Scan
	// returns ErrNotFound when the statement returned none.
	QueryStmt(ctx context.Context, stmt Stmt, args ...any) Row
	// ExecStmt runs stmt with args and reports whether it changed a row.
	ExecStmt(ctx context.Context, stmt Stmt, args ...any) (changed bool, err error)

	// GetRow reads one row; ok is false when there is none.
	GetRow(ctx context.Context, scope, eventID string) (ev Event, ok bool, err error)
	// ListRows runs q, whose cursor Rules has checked and whose Limit is
	// between 1 and 1000: rows ordered by updated_at, scope, event_id.
	ListRows(ctx context.Context, q ListQuery) ([]Event, error)
	// DeleteRows deletes at most limit (positive) rows of scopes (not
	// empty) first seen before cutoff that are not processing, and reports
	// how many.
	DeleteRows(ctx context.Context, scopes []string, cutoff time.Time, limit int) (int, error)
	// Close releases the driver's resources.
	Close() error
}

// Stmt names a statement of a Driver that changes one row: the key of each
// driver's table of statements, and the op of a BatchSettle. Its arguments,
// in order, are those of the Driver method that runs it.
type Stmt int

const (
	// StmtClaim (scope, event ID, token, lease time.Duration, hold bool,
	// fingerprint string) returns attempts and ambiguous: INSERT the row as
	// processing (token, attempts 1, lease_until = database now + lease,
	// fingerprint) ON CONFLICT DO UPDATE, taking an existing row over
	// (attempts + 1, status 0, no completed_at, the new fingerprint, no
	// stored response; ambiguous + 1 when the row taken over was processing:
	// its lease expired with its forward unsettled) only WHERE ClaimableSQL
	// holds; no row when it is not claimable.
	StmtClaim Stmt = iota
	// StmtInspect (scope, event ID) returns state, token, attempts, status,
	// the lease left in microseconds by the database clock (0 when expired
	// or not processing) and the fingerprint: what explains a refused claim.
	StmtInspect
	// StmtHoldExpired (scope, event ID, token, reason string) returns
	// attempts: the row moved to held, with hold_reason and ambiguous + 1,
	// when it is still
	// processing under token with a lease expired by the database clock;
	// no row when it is no longer so.
	StmtHoldExpired
	// StmtRenew (scope, event ID, token, lease time.Duration): lease_until
	// = database now + lease, while the row is processing under token.
	StmtRenew
	// StmtComplete (scope, event ID, token, status int): completed with
	// status, completed_at now, no token or lease, while the row is
	// processing under token.
	StmtComplete
	// StmtRelease (scope, event ID, token): released, no token or lease,
	// while the row is processing under token.
	StmtRelease
	// StmtReleaseAmbiguous (scope, event ID, token): StmtRelease that also
	// counts an ambiguous ending (ambiguous + 1): the forward ended with no
	// known outcome and the event is offered to the next delivery.
	StmtReleaseAmbiguous
	// StmtHold (scope, event ID, token, reason string): held at once, live
	// lease or not, no token or lease, hold_reason set, ambiguous + 1 (a
	// hold is an ending with no known outcome), while the row is
	// processing under token.
	StmtHold
	// StmtForget (scope, event ID): the row deleted, whatever its state.
	StmtForget
	// StmtResolve (scope, event ID, to State): to (StateReleased or
	// StateCompleted) with status 0, no token, lease or hold_reason,
	// completed_at now when completed, only WHERE ResolvableSQL holds.
	StmtResolve
	// StmtCompleteResponse (scope, event ID, token, status int, headers
	// string, body []byte or nil, size int64, sha256 string) is
	// StmtComplete that also stores the response: headers as EncodeHeader
	// writes them, body NULL when not stored, size -1 and sha256 "" when
	// the body was cut (see Response.Cut).
	StmtCompleteResponse
	// StmtResponse (scope, event ID) returns, for a completed row with a
	// stored response, status, headers (text), body (bytes, nil when not
	// stored), size, sha256 and fingerprint; no row otherwise.
	StmtResponse
	// NumStmts sizes a driver's table of statements.
	NumStmts
)

// Row is one row a driver's statement returned (drivers' own use).
type Row interface {
	Scan(dest ...any) error
}

// ClaimArgs are the inputs of the claim statement (ClaimParams with the
// new claim's token).
type ClaimArgs struct {
	Scope, EventID, Token string
	Lease                 time.Duration
	Hold                  bool // ClaimParams.HoldOnExpiry
	Fingerprint           string
}

// ClaimedRow is what a won claim statement returns.
type ClaimedRow struct {
	Attempts int
	// Ambiguous counts the row's earlier forwards that ended with no known
	// outcome (Event.Ambiguous), the expired lease this claim took over
	// included.
	Ambiguous int
}

// Inspected is a row as the statement explaining a refused claim reads it.
type Inspected struct {
	State    State
	Token    string
	Attempts int
	Status   int
	// LeaseLeft is the lease left by the database clock, 0 when expired or
	// not processing.
	LeaseLeft   time.Duration
	Fingerprint string
}

// RawResponse is a stored response as its columns hold it: headers as
// EncodeHeader writes them, Body nil when not stored (NULL), Size
// cutSize and SHA256 "" when the body was cut.
type RawResponse struct {
	Status      int
	Header      string
	Body        []byte
	Size        int64
	SHA256      string
	Fingerprint string
}

// ClaimableSQL is the claimable predicate over the conflicting row "e" of a
// claim statement's ON CONFLICT ... DO UPDATE ... WHERE: a released row, or
// a processing one whose lease has expired, unless the claim holds expired
// claims (on_ambiguous hold). now is the dialect's expression for the
// database clock, hold its parameter for ClaimParams.HoldOnExpiry. Rules'
// explanation of a refused claim is its mirror.
func ClaimableSQL(now, hold string) string {
	return `e.state = '` + string(StateReleased) + `'
				OR (e.state = '` + string(StateProcessing) + `' AND e.lease_until <= ` + now + ` AND NOT ` + hold + `)`
}

// ResolvableSQL is the predicate of the rows an operator may resolve: held,
// or processing with a lease expired by now (its gateway died). A live
// claim is never resolved.
func ResolvableSQL(now string) string {
	return `(state = '` + string(StateHeld) + `' OR (state = '` + string(StateProcessing) + `' AND lease_until <= ` + now + `))`
}

// BatchDriver is a Driver that writes many claims and settles in one
// transaction, so that they share one commit (one WAL flush): Rules'
// coalescer (see BatchOptions) gathers the operations of concurrent
// deliveries and hands them to WriteBatch. A Driver without it is used one
// statement per operation.
type BatchDriver interface {
	Driver
	// WriteBatch runs b in one transaction and fills in the results of its
	// claims and settles. b.Claims name distinct (scope, event ID) pairs
	// (Rules removes the repeats first: ON CONFLICT cannot change one row
	// twice in one statement). A claim reads its row and writes only when
	// the row is absent or claimable, so a completed event costs no write.
	// An error means the batch failed as a whole (or its commit is unknown):
	// every operation in it fails with that error.
	WriteBatch(ctx context.Context, b *Batch) error
}

// Batch is one transaction's worth of operations for BatchDriver. Its
// settles are StmtComplete and StmtRelease; another token-keyed statement
// (holding a claim, say) joins them by a case in each driver's WriteBatch
// and a Rules method calling settleBatched, and until then runs unbatched
// through Exec.
type Batch struct {
	Claims  []BatchClaim
	Settles []BatchSettle
}

// BatchClaim is one claim of a Batch: the inputs of StmtClaim, and what
// the driver found.
type BatchClaim struct {
	Scope, EventID, Token string
	Lease                 time.Duration
	Hold                  bool // ClaimParams.HoldOnExpiry

	// Claimed: the row was inserted or taken over with Token; Attempts is
	// its attempts, Ambiguous its ambiguous endings (ClaimedRow.Ambiguous).
	Claimed   bool
	Ambiguous int
	// When not Claimed, the row as the statement read it: State ("" when
	// there was none), Attempts, Status, and the lease left by the database
	// clock (0 when expired or not processing).
	State     State
	Attempts  int
	Status    int
	LeaseLeft time.Duration
}

// BatchSettle is one settle of a Batch: Stmt is StmtComplete (with
// Status), StmtRelease or StmtHold (with Reason); Changed reports whether
// the row was still processing under Token and changed.
type BatchSettle struct {
	Stmt                  Stmt
	Scope, EventID, Token string
	Status                int
	Reason                string

	Changed bool
}

// SettleArgs are the Exec arguments of s's statement: scope, event ID and
// token, then the status (StmtComplete) or the reason (StmtHold).
func SettleArgs(s *BatchSettle) []any {
	args := []any{s.Scope, s.EventID, s.Token}
	switch s.Stmt {
	case StmtComplete:
		args = append(args, s.Status)
	case StmtHold:
		args = append(args, s.Reason)
	}
	return args
}
