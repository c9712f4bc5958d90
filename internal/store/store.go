// Package store defines where the gateway records its claims on webhook
// events: one row per (scope, event ID), claimed atomically before a delivery
// is forwarded and settled after the upstream answers.
//
// The rules (what is claimable, what an outcome means) are written once, in
// Rules; the postgres and sqlite sub-packages are Drivers that supply their
// SQL, and both pass the shared conformance suite in storetest.
package store

import (
	"context"
	"errors"
	"time"
)

// State is the lifecycle state of an event row.
type State string

const (
	// StateProcessing: a gateway holds the claim and is forwarding the
	// delivery; the claim is live until LeaseUntil.
	StateProcessing State = "processing"
	// StateCompleted: the upstream answered 2xx; later deliveries are
	// duplicates answered at the edge.
	StateCompleted State = "completed"
	// StateReleased: the forward failed (non-2xx, proxy error); the next
	// delivery may claim the event again.
	StateReleased State = "released"
	// StateHeld: the outcome of a forward is unknown (the gateway died or the
	// forward timed out) and the route says on_ambiguous hold; deliveries are
	// refused until an operator releases or completes the event.
	StateHeld State = "held"
)

// Outcome is what a Claim call decided.
type Outcome int

const (
	// Claimed: the caller owns the claim and must forward, then settle with
	// Complete or Release using Claim.Token.
	Claimed Outcome = iota + 1
	// Duplicate: the event is completed; answer at the edge.
	Duplicate
	// InFlight: another claim on the event is live; answer 409 and let the
	// provider retry after Claim.RetryAfter.
	InFlight
	// Held: the event is parked in StateHeld.
	Held
)

func (o Outcome) String() string {
	switch o {
	case Claimed:
		return "claimed"
	case Duplicate:
		return "duplicate"
	case InFlight:
		return "in_flight"
	case Held:
		return "held"
	}
	return "unknown"
}

// ClaimParams are the inputs of one claim.
type ClaimParams struct {
	Scope   string // namespace of event IDs, e.g. "stripe"
	EventID string // the provider's event ID, at most 255 bytes
	// Lease is how long the claim stays live without a heartbeat. The expiry
	// is computed with the database's clock, never the caller's.
	Lease time.Duration
	// HoldOnExpiry: a processing row whose lease has expired is moved to
	// StateHeld (on_ambiguous hold) instead of being claimed again.
	HoldOnExpiry bool
	// Fingerprint is recorded with a won claim (Idempotency-Key mode: a
	// hash of the request), so a later request with the same key can be
	// told apart when it differs. "" records none.
	Fingerprint string
	// Token is the claim's token when the caller chooses it (NewToken), so
	// that it can give back a claim whose answer it never got (one that
	// committed after the caller gave up); "" draws a new one.
	Token string
}

// Claim is the result of Store.Claim.
type Claim struct {
	Outcome Outcome
	// Token identifies this claim; Heartbeat, Complete and Release need it,
	// so a gateway that lost its claim cannot settle another's. Set only
	// when Outcome is Claimed.
	Token string
	// Attempts counts how many times the event has been claimed, this claim
	// included (Claimed) or so far (otherwise).
	Attempts int
	// Ambiguous counts the event's earlier forwards that ended with no
	// known outcome (Event.Ambiguous), when Claimed: more than 0 means the
	// upstream may already have run the event this claim forwards again.
	Ambiguous int
	// HeldNow: this claim found the event's lease expired and held it
	// (Held, under HoldOnExpiry), rather than finding it held.
	HeldNow bool
	// RetryAfter is the time left on the live lease (InFlight); at least 1s.
	RetryAfter time.Duration
	// Status is the upstream status recorded when the event completed
	// (Duplicate).
	Status int
	// Fingerprint is the one recorded by the claim that holds or completed
	// the row (InFlight, Duplicate), "" when none was given.
	Fingerprint string
}

// Event is a stored row, as seen by operators.
type Event struct {
	Scope       string
	EventID     string
	State       State
	Attempts    int
	FirstSeen   time.Time
	UpdatedAt   time.Time
	LeaseUntil  time.Time // zero unless processing
	CompletedAt time.Time // zero unless completed
	Status      int       // upstream status when completed, else 0
	// Fingerprint is the request fingerprint of the row's claim
	// (Idempotency-Key mode), else "".
	Fingerprint string
	// Response describes the stored upstream answer, without its content.
	Response ResponseInfo
	// HoldReason says why a held event is held, as the gateway knew it
	// when it parked the event (Store.Hold's reason, or HoldLeaseExpired);
	// "" unless held, and for events held before reasons were recorded.
	HoldReason string
	// Ambiguous counts the forwards of the event that ended with no known
	// outcome, each of which the upstream may have run: released by
	// on_ambiguous reforward, held, or a lease that expired unsettled (its
	// gateway stopped) and was taken over or held. A completed event with
	// Ambiguous > 0 may have run more than once.
	Ambiguous int
}

// HoldLeaseExpired is the hold reason of a claim whose lease expired
// before its forward settled, held by the next claim (on_ambiguous hold).
const HoldLeaseExpired = "the claim's lease expired before its forward settled " +
	"(the gateway holding it died, or could not reach the store)"

// Errors returned by stores. Driver errors never escape a store: anything
// else a method returns means the store is unreachable or failing, and the
// gateway answers 503 (fail closed).
var (
	// ErrNotFound: no row for (scope, event ID).
	ErrNotFound = errors.New("event not found")
	// ErrLeaseLost: the row is no longer held with this token (the lease
	// expired and another gateway claimed it, or an operator changed it).
	ErrLeaseLost = errors.New("claim lease lost")
	// ErrConflict: the row exists but is in a state the operation does not
	// apply to (Resolve on a completed or released row, or on a live claim).
	ErrConflict = errors.New("event is in another state")
)

// Store records claims. All methods are safe for concurrent use, also from
// several processes sharing one database.
type Store interface {
	// Claim claims (scope, event ID) in one atomic statement: it succeeds
	// when there is no row, the row is released, or the row is processing
	// with an expired lease (unless HoldOnExpiry). Otherwise it reports
	// Duplicate, InFlight or Held.
	Claim(ctx context.Context, p ClaimParams) (Claim, error)
	// Heartbeat extends a live claim's lease to now + lease (database clock).
	// It returns ErrLeaseLost if the token no longer holds the row.
	Heartbeat(ctx context.Context, scope, eventID, token string, lease time.Duration) error
	// Complete marks the claimed event completed with the upstream status.
	// It returns ErrLeaseLost if the token no longer holds the row.
	Complete(ctx context.Context, scope, eventID, token string, status int) error
	// CompleteResponse is Complete storing the upstream's answer with the
	// row, for replay: resp.Status is the status recorded. It returns
	// ErrLeaseLost if the token no longer holds the row.
	CompleteResponse(ctx context.Context, scope, eventID, token string, resp Response) error
	// Response returns the answer stored with a completed event, or
	// ErrNotFound when there is no such row, it is not completed, or it
	// completed without a stored answer.
	Response(ctx context.Context, scope, eventID string) (Response, error)
	// Release gives the claim up so the next delivery is forwarded again.
	// It returns ErrLeaseLost if the token no longer holds the row.
	Release(ctx context.Context, scope, eventID, token string) error
	// ReleaseAmbiguous is Release after a forward that ended with no known
	// outcome (on_ambiguous reforward): it also counts the ending in
	// Event.Ambiguous, which the next claim reports (Claim.Ambiguous).
	ReleaseAmbiguous(ctx context.Context, scope, eventID, token string) error
	// Hold parks the claimed event in StateHeld at once, live lease or not:
	// the gateway knows its forward's outcome is ambiguous (on_ambiguous
	// hold), so deliveries are refused and an operator can release or
	// complete it right away. reason (Event.HoldReason) says why, for the
	// operator: never a body, header or secret. It returns ErrLeaseLost if
	// the token no longer holds the row.
	Hold(ctx context.Context, scope, eventID, token, reason string) error
	// Get returns one event, or ErrNotFound.
	Get(ctx context.Context, scope, eventID string) (Event, error)
	// Forget deletes one event so the provider's next delivery is forwarded
	// again. It returns ErrNotFound when there is no such row.
	Forget(ctx context.Context, scope, eventID string) error
	// Resolve is an operator's decision on an event whose outcome is
	// unknown: a held row, or a processing row whose lease has expired (its
	// gateway died), moves to StateReleased (the next delivery is forwarded
	// again) or StateCompleted (later deliveries are duplicates; Status 0
	// records that no upstream answer was seen). It returns ErrNotFound when
	// there is no row and ErrConflict when the row is in another state (a
	// live claim included); a row already in state to is left as it is and
	// nil is returned. to must be StateReleased or StateCompleted.
	Resolve(ctx context.Context, scope, eventID string, to State) error
	// List returns events in a state whose UpdatedAt is before olderThan
	// (zero: any), ordered by UpdatedAt then scope, event ID, at most limit,
	// starting after the (AfterUpdatedAt, AfterScope, AfterID) cursor when
	// AfterUpdatedAt is set: the values of the last event of the previous
	// page, so paging needs no lookup of that event (it may have changed or
	// gone meanwhile).
	List(ctx context.Context, q ListQuery) ([]Event, error)
	// DeleteBefore deletes at most limit rows of the given scopes whose
	// FirstSeen is before cutoff and that are not processing, and reports
	// how many it deleted. Rows of other scopes are never touched, so routes
	// with different retentions can share a table; no scopes, no deletion.
	DeleteBefore(ctx context.Context, scopes []string, cutoff time.Time, limit int) (int, error)
	// Close releases the store's resources.
	Close() error
}

// ListQuery selects events for List.
type ListQuery struct {
	State     State // "" = any
	Scope     string
	OlderThan time.Time // zero = any
	// AfterUpdatedAt, AfterScope and AfterID are the paging cursor
	// (exclusive): the UpdatedAt, Scope and EventID of the last event of the
	// previous page. The cursor is used when AfterUpdatedAt is not zero;
	// AfterScope or AfterID without it is an error.
	AfterUpdatedAt time.Time
	AfterScope     string
	AfterID        string
	Limit          int // default 100, at most 1000
}

// Resolvable reports whether to is a state Resolve moves events to.
func Resolvable(to State) bool {
	return to == StateReleased || to == StateCompleted
}

// CheckCursor rejects a paging cursor that has a scope or event ID but no
// AfterUpdatedAt.
func CheckCursor(q ListQuery) error {
	if q.AfterUpdatedAt.IsZero() && (q.AfterScope != "" || q.AfterID != "") {
		return errors.New("paging cursor needs AfterUpdatedAt with AfterScope and AfterID")
	}
	return nil
}
