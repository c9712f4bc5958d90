package store

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
)

// A claim the upstream completes (complete_by upstream): the gateway hands
// the upstream a claim value (the Webhook-Claim header), the upstream calls
// the SQL function <table>_commit(claim) inside the transaction that does
// its work, and that function marks the claim completed in the same
// commit, or raises an error when the claim is no longer this one, so the
// work rolls back. The gateway then settles by what the row says
// (Conclude) instead of by what it saw of the forward.

// claimVersion prefixes every claim value, so that its shape can change
// without an old function misreading a new value.
const claimVersion = "1"

// ClaimValue is the Webhook-Claim value of the claim token holds on
// (scope, eventID): opaque to the upstream, unguessable (the token's 128
// random bits), and naming exactly this claim, so <table>_commit finds the
// row by its primary key. Shape: "1.<token>.<hex scope>.<hex event ID>".
// It is a bearer credential for this one claim: never log it.
func ClaimValue(scope, eventID, token string) string {
	return claimVersion + "." + token + "." + hex.EncodeToString([]byte(scope)) + "." +
		hex.EncodeToString([]byte(eventID))
}

// QueueClaimValue is the Webhook-Claim value of an async delivery: the
// queue row of (scope, eventID) taken with token, which <table>_commit
// marks delivered. Shape: "q.<token>.<hex scope>.<hex event ID>". Never
// log it.
func QueueClaimValue(scope, eventID, token string) string {
	return queueClaimKind + "." + token + "." + hex.EncodeToString([]byte(scope)) + "." +
		hex.EncodeToString([]byte(eventID))
}

// queueClaimKind prefixes the claim values of async deliveries.
const queueClaimKind = "q"

// ParseClaimValue is the inverse of ClaimValue and QueueClaimValue, as
// <table>_commit reads the value (queued reports the latter); ok is false
// for anything they do not write.
func ParseClaimValue(v string) (scope, eventID, token string, ok bool) {
	scope, eventID, token, _, ok = ParseAnyClaimValue(v)
	return scope, eventID, token, ok
}

// ParseAnyClaimValue is ParseClaimValue that also reports whether v
// names an async delivery (QueueClaimValue).
func ParseAnyClaimValue(v string) (scope, eventID, token string, queued, ok bool) {
	parts := strings.Split(v, ".")
	if len(parts) != 4 || (parts[0] != claimVersion && parts[0] != queueClaimKind) || !isToken(parts[1]) || parts[3] == "" {
		return "", "", "", false, false
	}
	s, err1 := hex.DecodeString(parts[2])
	e, err2 := hex.DecodeString(parts[3])
	if err1 != nil || err2 != nil || strings.ToLower(parts[2]) != parts[2] || strings.ToLower(parts[3]) != parts[3] {
		return "", "", "", false, false
	}
	return string(s), string(e), parts[1], parts[0] == queueClaimKind, true
}

// isToken reports whether t has NewToken's shape: 32 lowercase hex digits.
func isToken(t string) bool {
	if len(t) != 32 {
		return false
	}
	for _, c := range t {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Truth is what the row of an upstream-completed claim says at the end of
// its forward (Conclude).
type Truth int

const (
	// TruthCommitted: the upstream's transaction called <table>_commit and
	// committed; the event is completed (its work is done, once).
	TruthCommitted Truth = iota + 1
	// TruthReleased: the upstream did not commit (it never called the
	// function, or its transaction rolled back); the claim is released, so
	// the provider's retry is forwarded, and a transaction of this claim
	// still running fails at its <table>_commit and rolls back.
	TruthReleased
	// TruthCompletedUncommitted: the upstream answered 2xx without having
	// committed the claim (it does not call the function, or uses another
	// database): completed by the gateway as under complete_by gateway, so
	// a 2xx is never forwarded again, but its ambiguous endings are not
	// protected. Operators must hear of it.
	TruthCompletedUncommitted
	// TruthLost: the row is no longer this claim's (an operator resolved or
	// forgot it, or its lease expired and another delivery claimed it).
	TruthLost
	// TruthPending: a transaction still held the row when the wait ran
	// out (the upstream is committing, or holds its transaction open). The
	// claim is left as it is: its lease expires unless renewed, and the
	// next claim waits for that transaction before judging the row.
	TruthPending
)

func (t Truth) String() string {
	switch t {
	case TruthCommitted:
		return "committed"
	case TruthReleased:
		return "released"
	case TruthCompletedUncommitted:
		return "completed_uncommitted"
	case TruthLost:
		return "lost"
	case TruthPending:
		return "pending"
	}
	return "unknown"
}

// ConcludeParams are the inputs of Conclude.
type ConcludeParams struct {
	Scope, EventID, Token string
	// Status is the upstream's answer when one arrived, else 0 (the
	// connection dropped, the forward timed out, the gateway shut down).
	// A 2xx Status completes a claim the upstream did not commit
	// (TruthCompletedUncommitted); any other releases it.
	Status int
	// Response, when not nil, is stored with a completed row (replay
	// response), as CompleteResponse stores it; Response.Status is ignored
	// in favour of Status.
	Response *Response
	// Wait bounds the wait for a transaction that holds the row (the
	// upstream's, between its <table>_commit and its commit). At least
	// one millisecond; the caller's ctx bounds the whole call as well.
	Wait time.Duration
}

// ErrUnsupported: the store's backend cannot do what was asked (an
// upstream-completed claim needs PostgreSQL).
var ErrUnsupported = errors.New("not supported by this store")

// CommitDriver is a Driver whose claims an upstream can complete in its
// own transaction: PostgreSQL, where <table>_commit exists.
type CommitDriver interface {
	Driver
	// ConcludeRow waits at most p.Wait for the row (scope, event ID) to be
	// free of other transactions' locks, then, in one transaction: a
	// row completed under p.Token by <table>_commit records p.Status (when
	// not 0) and p.Response (when set) and reads committed; a row still
	// processing under p.Token is completed (2xx p.Status, with
	// p.Response) or released and reads as before; any other row, or none,
	// is left alone. state is the row's state under p.Token as found ("" when the
	// token no longer holds it); locked reports that the wait ran out.
	ConcludeRow(ctx context.Context, p ConcludeParams, resp *ResponseColumns) (state State, committed, locked bool, err error)
	// RenewUnlocked extends the lease of the row processing under token
	// to now + lease without waiting for a lock: a row another transaction
	// holds (the upstream between its <table>_commit and its commit) is
	// left as it is. state is the row's state under token as read ("" when
	// the token no longer holds it).
	RenewUnlocked(ctx context.Context, scope, eventID, token string, lease time.Duration) (renewed bool, state State, err error)
}

// Conclude settles an upstream-completed claim by the truth its row holds
// at the end of the forward, waiting (p.Wait at most) for an upstream
// transaction that holds the row. It runs in its own transaction, never in
// a batch, so a row lock held by a slow upstream never stalls the claims
// and settles of other deliveries. Errors are store failures; the claim is
// then left as it is (its lease expires as after a crash, and the next
// claim judges the row).
func (r Rules) Conclude(ctx context.Context, p ConcludeParams) (Truth, error) {
	cd, ok := r.d.(CommitDriver)
	if !ok {
		return 0, fmt.Errorf("concluding claim: %w", ErrUnsupported)
	}
	if p.Wait < time.Millisecond {
		p.Wait = time.Millisecond
	}
	var cols *ResponseColumns
	if p.Response != nil {
		c, err := NewResponseColumns(*p.Response)
		if err != nil {
			return 0, fmt.Errorf("concluding claim: %w", err)
		}
		cols = &c
	}
	state, committed, locked, err := cd.ConcludeRow(ctx, p, cols)
	switch {
	case err != nil:
		return 0, fmt.Errorf("concluding claim: %w", err)
	case locked:
		return TruthPending, nil
	case committed:
		return TruthCommitted, nil
	case state == StateProcessing && p.Status >= 200 && p.Status <= 299:
		return TruthCompletedUncommitted, nil
	case state == StateProcessing:
		return TruthReleased, nil
	}
	return TruthLost, nil
}

// KeepUpstream renews an upstream-completed claim's lease like Heartbeat,
// without ever waiting for a row lock: a row the upstream's transaction
// holds needs no renewal (a takeover waits for that transaction, and
// finds the row completed if it commits). It returns ErrLeaseLost when
// token no longer holds the row, and nil when the row is locked, renewed,
// or committed by the upstream (done reports the latter: stop renewing).
func (r Rules) KeepUpstream(ctx context.Context, scope, eventID, token string, lease time.Duration) (done bool, err error) {
	cd, ok := r.d.(CommitDriver)
	if !ok {
		return false, fmt.Errorf("renewing lease: %w", ErrUnsupported)
	}
	if lease <= 0 {
		return false, fmt.Errorf("renewing lease: lease must be positive, got %s", lease)
	}
	renewed, state, err := cd.RenewUnlocked(ctx, scope, eventID, token, lease)
	switch {
	case err != nil:
		return false, fmt.Errorf("renewing lease: %w", err)
	case renewed:
		return false, nil
	case state == StateCompleted:
		return true, nil
	case state == StateProcessing:
		return false, nil // locked by the upstream's transaction
	}
	return false, ErrLeaseLost
}

// SupportsUpstreamCommit reports whether s's claims can be completed by
// the upstream (complete_by upstream): PostgreSQL stores.
func SupportsUpstreamCommit(s Store) bool {
	type ruled interface{ CommitCapable() bool }
	if c, ok := s.(ruled); ok {
		return c.CommitCapable()
	}
	return false
}

// CommitCapable reports whether r's driver is a CommitDriver.
func (r Rules) CommitCapable() bool {
	_, ok := r.d.(CommitDriver)
	return ok
}

// ResponseColumns are a stored response as the events table holds it.
type ResponseColumns struct {
	Headers string // as EncodeHeader writes them
	Body    []byte // nil: not stored
	Size    int64  // cutSize when the body was cut
	SHA256  string // "" when cut
}

// NewResponseColumns turns resp into the columns CompleteResponse writes.
func NewResponseColumns(resp Response) (ResponseColumns, error) {
	hdr, err := EncodeHeader(resp.Header)
	if err != nil {
		return ResponseColumns{}, err
	}
	c := ResponseColumns{Headers: hdr, Size: resp.Size, SHA256: resp.SHA256}
	switch {
	case resp.Cut:
		c.Size, c.SHA256 = cutSize, ""
	case resp.BodyStored:
		c.Body = resp.Body
		if c.Body == nil {
			c.Body = []byte{}
		}
	}
	return c, nil
}
