package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// maxClaimRounds bounds how often Claim tries again when the row changes
// between its claim statement and the read that explains it (deleted,
// released or expired in between).
const maxClaimRounds = 5

// Rules is the Store every backend shares: the claim algorithm and the
// meaning of each statement's result, over a backend's Driver.
type Rules struct {
	d Driver
	// b is the coalescer of claims and settles; nil writes each operation
	// on its own.
	b *batcher
	// retried is told of a claim or settle tried again after
	// ErrConnectionLost.
	retried RetryObserver
}

var _ Store = Rules{}

// NewRules returns the Store over d, one statement per operation.
func NewRules(d Driver) Rules { return Rules{d: d} }

// rows is r's driver with its statements typed.
func (r Rules) rows() rows { return rows{r.d} }

// NewBatchedRules returns the Store over d whose claims, completes and
// releases are written in batches (see BatchOptions) when d is a
// BatchDriver and batching is not disabled; otherwise it is NewRules(d).
// Close stops the batch writer.
func NewBatchedRules(d Driver, opts BatchOptions) Rules {
	bd, ok := d.(BatchDriver)
	if !ok || opts.Disabled {
		return NewRules(d)
	}
	return Rules{d: d, b: newBatcher(bd, opts)}
}

// WithRetryObserver returns r telling f of each claim or settle it tries
// again after ErrConnectionLost (RetryConnection).
func (r Rules) WithRetryObserver(f RetryObserver) Rules {
	r.retried = f
	return r
}

// Claim claims (p.Scope, p.EventID) with the driver's one claim statement;
// when the row is not claimable it reads the row to report Duplicate (with
// Status), InFlight (with RetryAfter, the lease left by the database clock,
// rounded up to whole seconds, at least 1s) or Held. With p.HoldOnExpiry, a
// processing row whose lease has expired is moved to held (only if it still
// carries the token that was read) and Held is returned. p.Lease must be
// positive. Errors are store failures.
//
// Batched (NewBatchedRules), the claim joins the next batch; the driver
// reads the row and writes it only when absent or claimable, so a
// duplicate of a completed event is answered from the read. Two claims of
// one (scope, event ID) in a batch resolve as one after the other: the
// first decides, the second is InFlight behind it (or reads what the first
// read). A claim the batch could not decide (the row changed between the
// read and the write, or an expired claim to hold) takes the one-statement
// path below.
//
// A claim that failed with ErrConnectionLost (its statement or batch may
// or may not have committed) is tried once more, unbatched, with the same
// token, on another connection (the driver has dropped the dead ones): a
// row found processing under that token is this claim's own, committed by
// the first try, and is answered Claimed, never InFlight; any other row is
// judged as usual. So a retried claim never claims an event twice.
//
// A caller that gives up while its claim is being written (ctx canceled:
// the provider hung up) does not cut the statements: they run to their
// end, bounded by ctx's deadline (at most giveUpFor without one), so that
// whether the claim committed is known. A claim that committed for a
// caller gone by then is released at once with its own token, on every
// path (batched, one-statement, retried), and Claim returns ctx's error
// instead of Claimed (other answers stand: nothing was taken). Otherwise
// the event would stay in flight, its redelivery answered 409, until the
// lease expires, then be held under on_ambiguous hold although it was
// never forwarded. If that release fails, the lease expires as after a
// crash.
func (r Rules) Claim(ctx context.Context, p ClaimParams) (Claim, error) {
	if p.Lease <= 0 {
		return Claim{}, fmt.Errorf("claiming event: lease must be positive, got %s", p.Lease)
	}
	token := p.Token
	if token == "" {
		token = NewToken()
	}
	c, err := r.claim(ctx, p, token)
	if err != nil && errors.Is(err, ErrConnectionLost) && ctx.Err() == nil {
		if r.retried != nil {
			r.retried(RetryConnection)
		}
		c, err = r.claimFinishing(ctx, p, token)
	}
	if ctx.Err() != nil {
		return r.forgo(ctx, p, token, c, err)
	}
	return c, err
}

// giveUpFor bounds the statements of a claim whose caller gave up and set
// no deadline, and the release of a claim committed for it.
const giveUpFor = 5 * time.Second

// finishing returns the context a claim's statements run with: ctx's
// values and deadline, not its cancellation (see Claim).
func finishing(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok {
		return context.WithDeadline(context.WithoutCancel(ctx), d)
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(giveUpFor, cancel) })
	return sctx, func() { stop(); cancel() }
}

// forgo ends a claim whose caller gave up (ctx ended) while it was being
// written. A claim taken under token is released and ctx's error returned;
// so is one a lost connection left unknown (a row not processing under
// token is left alone). Any other answer (Duplicate, InFlight, Held, an
// error) stands: nothing was taken.
func (r Rules) forgo(ctx context.Context, p ClaimParams, token string, c Claim, err error) (Claim, error) {
	claimed := err == nil && c.Outcome == Claimed
	if !claimed && !errors.Is(err, ErrConnectionLost) {
		return c, err
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveUpFor)
	_ = r.Release(rctx, p.Scope, p.EventID, token) // ErrLeaseLost: nothing of ours to give back
	cancel()
	if err != nil {
		return Claim{}, err
	}
	return Claim{}, fmt.Errorf("claiming event: the caller gave up after the claim committed (released): %w", ctx.Err())
}

// claim is one try of Claim with token: a batched claim waits for its
// batch while ctx lasts (the batch writer gives back a claim it took for
// a caller gone meanwhile), one-statement claims run to their end
// (claimFinishing).
func (r Rules) claim(ctx context.Context, p ClaimParams, token string) (Claim, error) {
	// A claim with a request fingerprint (Idempotency-Key mode) records it
	// and reads the holder's back to compare: the one-row statements do
	// both; the batch statements carry neither, so such claims are not
	// batched.
	if r.b != nil && p.Fingerprint == "" {
		c, ok, err := r.claimBatched(ctx, p, token)
		if err != nil {
			return Claim{}, fmt.Errorf("claiming event: %w", err)
		}
		if ok {
			return c, nil
		}
	}
	if err := ctx.Err(); err != nil {
		return Claim{}, fmt.Errorf("claiming event: %w", err) // nothing written yet
	}
	return r.claimFinishing(ctx, p, token)
}

// claimFinishing is claimOne with the statements run to their end
// (finishing), made only for the claims that take that path: a batched
// claim costs no context or timer for it.
func (r Rules) claimFinishing(ctx context.Context, p ClaimParams, token string) (Claim, error) {
	sctx, cancel := finishing(ctx)
	defer cancel()
	return r.claimOne(sctx, p, token)
}

// claimBatched claims through the coalescer; ok is false when the batch
// did not decide the claim.
func (r Rules) claimBatched(ctx context.Context, p ClaimParams, token string) (c Claim, ok bool, err error) {
	bc := &BatchClaim{Scope: p.Scope, EventID: p.EventID, Token: token, Lease: p.Lease, Hold: p.HoldOnExpiry}
	o := &op{claim: bc}
	if err := r.b.do(ctx, o); err != nil {
		return Claim{}, false, err
	}
	if l := o.follows; l != nil {
		if l.Claimed {
			return Claim{Outcome: InFlight, Attempts: l.Attempts, RetryAfter: RetryAfter(l.Lease)}, true, nil
		}
		bc = l
	}
	if bc.Claimed {
		return Claim{Outcome: Claimed, Token: bc.Token, Attempts: bc.Attempts, Ambiguous: bc.Ambiguous}, true, nil
	}
	switch bc.State {
	case StateCompleted:
		return Claim{Outcome: Duplicate, Attempts: bc.Attempts, Status: bc.Status}, true, nil
	case StateHeld:
		return Claim{Outcome: Held, Attempts: bc.Attempts}, true, nil
	case StateProcessing:
		if bc.LeaseLeft > 0 {
			return Claim{Outcome: InFlight, Attempts: bc.Attempts, RetryAfter: RetryAfter(bc.LeaseLeft)}, true, nil
		}
	}
	return Claim{}, false, nil
}

// claimOne claims with the one-statement algorithm: the claim statement,
// then the read that explains a refusal. Every round uses token, unique to
// this Claim call: a row processing under it is this call's own.
func (r Rules) claimOne(ctx context.Context, p ClaimParams, token string) (Claim, error) {
	for range maxClaimRounds {
		won, err := r.rows().ClaimRow(ctx, ClaimArgs{Scope: p.Scope, EventID: p.EventID, Token: token, Lease: p.Lease,
			Hold: p.HoldOnExpiry, Fingerprint: p.Fingerprint})
		if err == nil {
			return Claim{Outcome: Claimed, Token: token, Attempts: won.Attempts, Ambiguous: won.Ambiguous}, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return Claim{}, fmt.Errorf("claiming event: %w", err)
		}
		c, ok, err := r.explain(ctx, p, token)
		if err != nil {
			return Claim{}, fmt.Errorf("claiming event: %w", err)
		}
		if ok {
			return c, nil
		}
	}
	return Claim{}, fmt.Errorf("claiming event: the row changed under %d consecutive claims", maxClaimRounds)
}

// explain reads the row a claim was refused on, the mirror of
// ClaimableSQL. ok is false when the row became claimable in between
// (deleted, released, lease just expired) and the claim should be tried
// again. A row processing under own (the claim's token) was claimed by
// an earlier try of the same claim, whose answer was lost: it is Claimed.
func (r Rules) explain(ctx context.Context, p ClaimParams, own string) (c Claim, ok bool, err error) {
	row, err := r.rows().InspectRow(ctx, p.Scope, p.EventID)
	if err != nil {
		return Claim{}, false, gone(err) // deleted in between: try again
	}
	attempts, status, fingerprint := row.Attempts, row.Status, row.Fingerprint
	switch row.State {
	case StateCompleted:
		return Claim{Outcome: Duplicate, Attempts: attempts, Status: status, Fingerprint: fingerprint}, true, nil
	case StateHeld:
		return Claim{Outcome: Held, Attempts: attempts}, true, nil
	case StateReleased:
		return Claim{}, false, nil
	case StateProcessing:
		if row.Token == own {
			return Claim{Outcome: Claimed, Token: own, Attempts: attempts}, true, nil
		}
		if row.LeaseLeft > 0 {
			return Claim{Outcome: InFlight, Attempts: attempts, RetryAfter: RetryAfter(row.LeaseLeft), Fingerprint: fingerprint}, true, nil
		}
		if !p.HoldOnExpiry {
			return Claim{}, false, nil
		}
		attempts, err := r.rows().HoldExpiredRow(ctx, p.Scope, p.EventID, row.Token, HoldLeaseExpired)
		if err != nil {
			return Claim{}, false, gone(err) // renewed or settled meanwhile: try again
		}
		return Claim{Outcome: Held, Attempts: attempts, HeldNow: true}, true, nil
	}
	return Claim{}, false, fmt.Errorf("unknown event state %q", row.State)
}

// gone is nil for a statement that found no row, else err.
func gone(err error) error {
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}

// Heartbeat sets the claim's lease to now + lease by the database clock.
// It returns ErrLeaseLost if the row is not processing under token.
func (r Rules) Heartbeat(ctx context.Context, scope, eventID, token string, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("renewing lease: lease must be positive, got %s", lease)
	}
	return leaseHeld("renewing lease")(r.rows().RenewRow(ctx, scope, eventID, token, lease))
}

// Complete marks the claimed event completed with the upstream's HTTP
// status. It returns ErrLeaseLost if the row is not processing under token.
func (r Rules) Complete(ctx context.Context, scope, eventID, token string, status int) error {
	return r.settle(ctx, "completing event",
		BatchSettle{Stmt: StmtComplete, Scope: scope, EventID: eventID, Token: token, Status: status})
}

// Release marks the claimed event released, so the next delivery claims it
// again. It returns ErrLeaseLost if the row is not processing under token.
func (r Rules) Release(ctx context.Context, scope, eventID, token string) error {
	return r.settle(ctx, "releasing event",
		BatchSettle{Stmt: StmtRelease, Scope: scope, EventID: eventID, Token: token})
}

// ReleaseAmbiguous releases the claimed event and counts an ambiguous
// ending (see Store.ReleaseAmbiguous). Never batched: it is rare. It
// returns ErrLeaseLost if the row is not processing under token.
func (r Rules) ReleaseAmbiguous(ctx context.Context, scope, eventID, token string) error {
	return leaseHeld("releasing event")(r.rows().ReleaseAmbiguousRow(ctx, scope, eventID, token))
}

// Hold parks the claimed event in StateHeld at once, with reason (see
// Store.Hold).
func (r Rules) Hold(ctx context.Context, scope, eventID, token, reason string) error {
	return r.settle(ctx, "holding event",
		BatchSettle{Stmt: StmtHold, Scope: scope, EventID: eventID, Token: token, Reason: reason})
}

// settle writes s (batched when r batches) under the rule of leaseHeld. A
// settle that failed with ErrConnectionLost (it may have committed) is
// written once more, unbatched. When that changes no row, either the first
// try committed or another claim has taken the row over and perhaps
// settled it alike: the row cannot tell which without the claim's
// attempts, so the lost connection's error is returned, outcome unknown
// (claim.Keeper, which holds the attempts, reads the row and decides).
func (r Rules) settle(ctx context.Context, op string, s BatchSettle) error {
	var (
		changed bool
		err     error
	)
	if r.b != nil {
		changed, err = r.settleBatched(ctx, s)
	} else {
		changed, err = r.settleRow(ctx, s)
	}
	if err != nil && errors.Is(err, ErrConnectionLost) && ctx.Err() == nil {
		if r.retried != nil {
			r.retried(RetryConnection)
		}
		lost := err
		if changed, err = r.settleRow(ctx, s); err == nil && !changed {
			err = lost
		}
	}
	return leaseHeld(op)(changed, err)
}

// settleRow writes s with its own one-row statement, unbatched.
func (r Rules) settleRow(ctx context.Context, s BatchSettle) (bool, error) {
	switch s.Stmt {
	case StmtComplete:
		return r.rows().CompleteRow(ctx, s.Scope, s.EventID, s.Token, s.Status)
	case StmtRelease:
		return r.rows().ReleaseRow(ctx, s.Scope, s.EventID, s.Token)
	case StmtHold:
		return r.rows().HoldRow(ctx, s.Scope, s.EventID, s.Token, s.Reason)
	}
	return false, fmt.Errorf("settling event: statement %d is not a settle", s.Stmt)
}

// settleBatched writes s in the next batch and reports whether it changed
// its row.
func (r Rules) settleBatched(ctx context.Context, s BatchSettle) (changed bool, err error) {
	o := &op{settle: &s}
	if err := r.b.do(ctx, o); err != nil {
		return false, err
	}
	return s.Changed, nil
}

// leaseHeld is the rule of every statement keyed by a claim's token: no row
// changed means the token no longer holds the row.
func leaseHeld(op string) func(changed bool, err error) error {
	return func(changed bool, err error) error {
		switch {
		case err != nil:
			return fmt.Errorf("%s: %w", op, err)
		case !changed:
			return ErrLeaseLost
		}
		return nil
	}
}

// Get returns one event, or ErrNotFound.
func (r Rules) Get(ctx context.Context, scope, eventID string) (Event, error) {
	ev, ok, err := r.d.GetRow(ctx, scope, eventID)
	switch {
	case err != nil:
		return Event{}, fmt.Errorf("getting event: %w", err)
	case !ok:
		return Event{}, ErrNotFound
	}
	return ev, nil
}

// Forget deletes one event, whatever its state. It returns ErrNotFound when
// there is no such row.
func (r Rules) Forget(ctx context.Context, scope, eventID string) error {
	ok, err := r.rows().ForgetRow(ctx, scope, eventID)
	switch {
	case err != nil:
		return fmt.Errorf("forgetting event: %w", err)
	case !ok:
		return ErrNotFound
	}
	return nil
}

// Resolve moves a held event, or a processing one whose lease has expired
// by the database clock, to to (StateReleased or StateCompleted) in one
// statement. See Store.
func (r Rules) Resolve(ctx context.Context, scope, eventID string, to State) error {
	if !Resolvable(to) {
		return fmt.Errorf("resolving event: cannot resolve to state %q", to)
	}
	ok, err := r.rows().ResolveRow(ctx, scope, eventID, to)
	if err != nil {
		return fmt.Errorf("resolving event: %w", err)
	}
	if ok {
		return nil
	}
	ev, err := r.Get(ctx, scope, eventID)
	if err != nil {
		return err
	}
	return resolveRefused(ev, to)
}

// resolveRefused is what Resolve reports when its statement changed no row
// and ev is the row as read afterwards: nil when ev is already in state to,
// else ErrConflict, wrapped with the state found.
func resolveRefused(ev Event, to State) error {
	switch {
	case ev.State == to:
		return nil
	case ev.State == StateProcessing:
		return fmt.Errorf("resolving event: %w: a delivery holds a live claim on it (lease until %s)",
			ErrConflict, ev.LeaseUntil.UTC().Format(time.RFC3339))
	}
	return fmt.Errorf("resolving event: %w: it is %s, not held", ErrConflict, ev.State)
}

// List returns events matching q, ordered by UpdatedAt, then scope, then
// event ID. q.Limit defaults to 100 and is capped at 1000. The cursor
// (q.AfterUpdatedAt, q.AfterScope, q.AfterID) is the last event of the
// previous page; it is compared, never looked up.
func (r Rules) List(ctx context.Context, q ListQuery) ([]Event, error) {
	if err := CheckCursor(q); err != nil {
		return nil, fmt.Errorf("listing events: %w", err)
	}
	switch {
	case q.Limit <= 0:
		q.Limit = 100
	case q.Limit > 1000:
		q.Limit = 1000
	}
	evs, err := r.d.ListRows(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("listing events: %w", err)
	}
	return evs, nil
}

// DeleteBefore deletes, in one statement, at most limit events of scopes
// whose FirstSeen is before cutoff and that are not processing, and returns
// how many it deleted. A limit of zero or less, or no scopes, deletes
// nothing.
func (r Rules) DeleteBefore(ctx context.Context, scopes []string, cutoff time.Time, limit int) (int, error) {
	if limit <= 0 || len(scopes) == 0 {
		return 0, nil
	}
	n, err := r.d.DeleteRows(ctx, scopes, cutoff, limit)
	if err != nil {
		return 0, fmt.Errorf("deleting old events: %w", err)
	}
	return n, nil
}

// CompleteResponse marks the claimed event completed with resp.Status and
// stores resp with it (headers as EncodeHeader writes them; the body only
// when resp.BodyStored; a cut body as cutSize, with no hash). It returns
// ErrLeaseLost if the row is not processing under token.
func (r Rules) CompleteResponse(ctx context.Context, scope, eventID, token string, resp Response) error {
	hdr, err := EncodeHeader(resp.Header)
	if err != nil {
		return fmt.Errorf("completing event: %w", err)
	}
	raw := RawResponse{Status: resp.Status, Header: hdr, Size: resp.Size, SHA256: resp.SHA256} // Body nil: not stored
	switch {
	case resp.Cut:
		raw.Size, raw.SHA256 = cutSize, ""
	case resp.BodyStored:
		raw.Body = resp.Body
		if raw.Body == nil {
			raw.Body = []byte{}
		}
	}
	return leaseHeld("completing event")(r.rows().CompleteResponseRow(ctx, scope, eventID, token, raw))
}

// Response returns the answer stored with a completed event, or
// ErrNotFound (no row, not completed, or completed without one).
func (r Rules) Response(ctx context.Context, scope, eventID string) (Response, error) {
	raw, err := r.rows().ResponseRow(ctx, scope, eventID)
	switch {
	case errors.Is(err, ErrNotFound):
		return Response{}, ErrNotFound
	case err != nil:
		return Response{}, fmt.Errorf("reading stored response: %w", err)
	}
	resp := Response{Status: raw.Status, Body: raw.Body, Size: raw.Size, SHA256: raw.SHA256, Fingerprint: raw.Fingerprint}
	if resp.Header, err = DecodeHeader(raw.Header); err != nil {
		return Response{}, fmt.Errorf("reading stored response: %w", err)
	}
	// An empty body is stored whole; a longer one is stored only when
	// complete (see Response.BodyStored); a cut one never.
	info := NewResponseInfo(true, int64(len(resp.Body)), resp.Size, resp.SHA256)
	resp.BodyStored, resp.Cut, resp.Size, resp.SHA256 = info.BodyStored, info.Cut, info.Size, info.SHA256
	if !resp.BodyStored {
		resp.Body = nil
	}
	return resp, nil
}

// Close stops the batch writer, if any (operations still queued fail with
// ErrClosed), and closes the driver.
func (r Rules) Close() error {
	if r.b != nil {
		r.b.close()
	}
	return r.d.Close()
}
