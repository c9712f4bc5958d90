package postgres

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/coalesce"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// claimLease is the lease of a claim the queue records one at a time
// (enqueueOne): never seen by anyone, since the claim is completed in the
// transaction that takes it.
const claimLease = time.Minute

var (
	// ErrClosed is returned by Enqueue once the queue is closed.
	ErrClosed = errors.New("queue closed")
	// ErrNotText: a field of the entry is not text PostgreSQL can store
	// (invalid UTF-8, or a NUL byte); nothing is stored.
	ErrNotText = errors.New("not text (a NUL byte or invalid UTF-8)")
)

// BatchOptions configure group commit of enqueues: deliveries that arrive
// while a batch is being written wait for the next one, written in one
// transaction (one commit, one WAL flush) by one of the waiting callers
// (see package coalesce). Zero values mean the defaults.
type BatchOptions struct {
	// Disabled writes each enqueue in its own transaction.
	Disabled bool
	// MaxBatch bounds the enqueues of one transaction. Defaults to
	// coalesce.DefaultMaxBatch (128).
	MaxBatch int
	// MaxWait is how long a writer waits for more enqueues before writing
	// a batch that is not full. Defaults to 0: natural batching only, so a
	// lone delivery never waits.
	MaxWait time.Duration
	// Timeout bounds the writing of one batch (its statements and commit).
	// Defaults to coalesce.DefaultTimeout (5s).
	Timeout time.Duration
	// Observe, when set, is told the size of each batch written, with op
	// "enqueue". Called by the goroutine writing the batch, before it is
	// written: it must be quick.
	Observe func(op string, n int)
}

// enqueueOp is one caller's enqueue, answered by the batch writer.
type enqueueOp struct {
	// ctx is the caller's: an enqueue written on its own after a batch
	// gave up (see writeBatch) runs under it.
	ctx   context.Context
	e     queue.Entry
	hjson []byte

	out queue.Enqueued
	err error // this entry's own failure; a batch's failure is Do's
}

// Enqueue records e.Claims in the events table and e in the queue table in
// one transaction. A refused claim (completed, live, held) stores nothing
// of e; a queue row that already exists makes the outcome Duplicate (the
// claims are kept: they only confirm the event was accepted). With an
// order key, enqueues of that key are serialised by a transaction advisory
// lock, so queue IDs follow commit order within a key.
//
// Batched (the default), concurrent enqueues share one transaction: each
// entry's outcome is its own, as if the batch's entries had been enqueued
// one after the other in arrival order (a refused claim affects only its
// entry; the second of two deliveries of one event in a batch is a
// Duplicate), and the entry is committed when Enqueue returns. An error
// writing the batch fails every entry of it, and none is stored.
func (q *Queue) Enqueue(ctx context.Context, e queue.Entry) (queue.Enqueued, error) {
	header := e.Request.Header
	if header == nil {
		header = http.Header{}
	}
	hjson, err := json.Marshal(header)
	if err != nil {
		return queue.Enqueued{}, fmt.Errorf("enqueueing event: encoding headers: %w", err)
	}
	if err := checkText(e); err != nil {
		return queue.Enqueued{}, fmt.Errorf("enqueueing event: %w", err)
	}
	if q.batch == nil {
		var out queue.Enqueued
		err := q.enqueueRun(ctx, func(ctx context.Context) (err error) {
			out, err = q.enqueueOne(ctx, e, hjson)
			return err
		})
		return out, err
	}
	o := &enqueueOp{ctx: ctx, e: e, hjson: hjson}
	if err := q.batch.Do(ctx, o); err != nil {
		return queue.Enqueued{}, fmt.Errorf("enqueueing event: %w", err)
	}
	return o.out, o.err
}

// checkText refuses an entry that PostgreSQL's text and jsonb would refuse
// (invalid UTF-8, a NUL), before it joins a batch: its statement would fail
// the whole batch. Go's HTTP server passes a request URI whose query holds
// bytes that are not UTF-8. The value is never quoted: it may be a secret.
func checkText(e queue.Entry) error {
	fields := []struct{ name, v string }{{"scope", e.Scope}, {"event id", e.EventID}, {"order key", e.OrderKey},
		{"method", e.Request.Method}, {"request URI", e.Request.URI}}
	for _, f := range fields {
		if !utf8.ValidString(f.v) || strings.IndexByte(f.v, 0) >= 0 {
			return fmt.Errorf("%w: the %s", ErrNotText, f.name)
		}
	}
	for _, k := range e.Claims {
		if !utf8.ValidString(k.Scope+k.EventID) || strings.IndexByte(k.Scope+k.EventID, 0) >= 0 {
			return fmt.Errorf("%w: a claim's key", ErrNotText)
		}
	}
	for name, vs := range e.Request.Header {
		for _, v := range vs {
			if strings.IndexByte(name+v, 0) >= 0 { // jsonb refuses \u0000
				return fmt.Errorf("%w: a header", ErrNotText)
			}
		}
	}
	return nil
}

// Close stops the batch writer: enqueues still queued fail with ErrClosed,
// and Close waits for the batch being written. Call it before closing the
// store.
func (q *Queue) Close() {
	if q.batch != nil {
		q.batch.Close(ErrClosed)
	}
}

// enqueueRun runs f, one enqueue transaction, with runAgain: a first try
// that committed is harmless, the second finds the event's claims
// completed and its queue row there and answers Duplicate, which the
// provider is told as a 2xx too; the event is queued once.
func (q *Queue) enqueueRun(ctx context.Context, f func(ctx context.Context) error) error {
	return q.runAgain(ctx, f)
}

// runAgain runs f, one transaction, with q.run, and once more when its
// connection was lost (store.ErrConnectionLost: it may have committed; the
// pool has dropped the dead connections). For transactions whose second
// run after a committed first is harmless: enqueues, and the token-guarded
// settles, releases and heartbeats (a second run finds the token gone and
// reports the lease lost, the first run's state standing).
func (q *Queue) runAgain(ctx context.Context, f func(ctx context.Context) error) error {
	err := q.run.Run(ctx, f)
	if err == nil || !errors.Is(err, store.ErrConnectionLost) || ctx.Err() != nil {
		return err
	}
	if q.run.Retried != nil {
		q.run.Retried(store.RetryConnection)
	}
	return q.run.Run(ctx, f)
}

func newBatcher(q *Queue, opts BatchOptions) *coalesce.Coalescer[*enqueueOp] {
	if opts.Disabled {
		return nil
	}
	q.observe = opts.Observe
	return coalesce.New(coalesce.Options{MaxBatch: opts.MaxBatch, MaxWait: opts.MaxWait, Timeout: opts.Timeout},
		q.writeBatch)
}

// batchEntry is an entry of the batch being written, as the enqueue
// statement sees it.
type batchEntry struct {
	o      *enqueueOp
	claims []queue.Key // e.Claims, cut before the first key repeated
	// repeat is the index in e.Claims of the first key repeated, -1 if
	// none: such an entry is never written (its repeated claim would read
	// the first one completed: Duplicate).
	repeat int
	round  int
	// results by claim, as the statement read and wrote them
	claimable, written []bool
	state              []string
	leaseLeft          []time.Duration
	id                 int64 // its queue row's, when inserted
}

// errRaced says a claim the statement read as claimable was refused when
// written: another transaction changed the row in between, so the batch
// may have written part of an entry's claims and must be rolled back.
var errRaced = errors.New("a claimed row changed under the batch")

// writeBatch writes a batch of enqueues in one transaction and fills in
// each entry's outcome. Entries are split into rounds so that no two
// entries of a round share a key (a claim's or the queue row's): a round
// is one statement, and an entry that shares a key with an earlier one is
// in a later round, which reads what the earlier wrote, exactly as if it
// had come after it. Order keys are locked first, in ascending key order
// (two instances' batches never wait for each other in a cycle); claims
// are written in (scope, event ID) order within a round for the same
// reason (a batch of several rounds, which repeats a key, may lock out of
// that order: a deadlock with another instance's batch is then broken by
// PostgreSQL, which fails one of the two batches). When a claimed row changed between the statement's read and its
// write (another instance's transaction), the batch is rolled back and
// each entry enqueued on its own (enqueueOne), as before batching.
func (q *Queue) writeBatch(ctx context.Context, ops []*enqueueOp) error {
	if q.observe != nil {
		q.observe("enqueue", len(ops))
	}
	entries := planRounds(ops)
	err := q.enqueueRun(ctx, func(ctx context.Context) error { return q.writeRounds(ctx, entries) })
	if errors.Is(err, errRaced) {
		for _, o := range ops {
			if err := o.ctx.Err(); err != nil {
				o.err = fmt.Errorf("enqueueing event: %w", err)
				continue
			}
			o.err = q.enqueueRun(o.ctx, func(ctx context.Context) (err error) {
				o.out, err = q.enqueueOne(ctx, o.e, o.hjson)
				return err
			})
		}
		return nil
	}
	if err != nil {
		return err
	}
	for _, be := range entries {
		be.o.out, be.o.err = be.outcome()
	}
	return nil
}

// planRounds assigns each op its round: one after the last round of an
// earlier entry sharing a key, and not before the last round of an earlier
// entry of its order key (queue IDs follow arrival order within a key).
func planRounds(ops []*enqueueOp) []*batchEntry {
	type key struct{ scope, id string }
	var (
		entries   = make([]*batchEntry, len(ops))
		lastKey   = make(map[key]int, len(ops))
		lastOrder map[key]int
	)
	for i, o := range ops {
		be := &batchEntry{o: o, repeat: -1, round: 1}
		for n, k := range o.e.Claims {
			if slices.Contains(be.claims, k) {
				be.repeat = n
				break
			}
			be.claims = append(be.claims, k)
		}
		keys := append(slices.Clone(be.claims), queue.Key{Scope: o.e.Scope, EventID: o.e.EventID})
		for _, k := range keys {
			if r, ok := lastKey[key{k.Scope, k.EventID}]; ok {
				be.round = max(be.round, r+1)
			}
		}
		ok := key{o.e.Scope, o.e.OrderKey}
		if o.e.OrderKey != "" {
			be.round = max(be.round, lastOrder[ok])
		}
		for _, k := range keys {
			lastKey[key{k.Scope, k.EventID}] = be.round
		}
		if o.e.OrderKey != "" {
			if lastOrder == nil {
				lastOrder = map[key]int{}
			}
			lastOrder[ok] = be.round
		}
		n := len(be.claims)
		be.claimable, be.written = make([]bool, n), make([]bool, n)
		be.state, be.leaseLeft = make([]string, n), make([]time.Duration, n)
		entries[i] = be
	}
	return entries
}

// writeRounds runs the batch's transaction: the order-key locks and one
// enqueue statement per round, pipelined in one round trip, then the
// commit, unless a round raced (errRaced: rolled back).
func (q *Queue) writeRounds(ctx context.Context, entries []*batchEntry) error {
	var (
		pb     pgx.Batch
		locks  []int64
		rounds int
	)
	for _, be := range entries {
		be.id = 0 // a run again after a conflict reads every result anew
	}
	for _, be := range entries {
		if e := be.o.e; e.OrderKey != "" {
			locks = append(locks, lockKey("order", q.lockBase, e.Scope, e.OrderKey))
		}
		rounds = max(rounds, be.round)
	}
	if len(locks) > 0 {
		slices.Sort(locks)
		pb.Queue(q.sql.lockOrder, slices.Compact(locks))
	}
	// byOrd maps each round's claim positions (ordinality, from 1) to the
	// entry and claim.
	type claimRef struct {
		be    *batchEntry
		entry int32 // the entry's index in the batch
		n     int   // the claim's index in the entry
	}
	byOrd := make([][]claimRef, rounds)
	for r := 1; r <= rounds; r++ {
		var (
			refs                []claimRef
			cEntry, cStatus     []int32
			cScope, cID         []string
			cHold               []bool
			qEntry, qClaims     []int32
			qScope, qID, qOrder []string
			qMethod, qURI, qHdr []string
			qBody               [][]byte
		)
		for i, be := range entries {
			if be.round != r {
				continue
			}
			for n := range be.claims {
				refs = append(refs, claimRef{be, int32(i), n})
			}
			e := be.o.e
			claims := int32(len(be.claims))
			if be.repeat >= 0 {
				claims = -1 // never written
			}
			qEntry, qClaims = append(qEntry, int32(i)), append(qClaims, claims)
			qScope, qID, qOrder = append(qScope, e.Scope), append(qID, e.EventID), append(qOrder, e.OrderKey)
			qMethod, qURI = append(qMethod, e.Request.Method), append(qURI, e.Request.URI)
			qHdr, qBody = append(qHdr, string(be.o.hjson)), append(qBody, e.Request.Body)
		}
		slices.SortFunc(refs, func(a, b claimRef) int {
			ka, kb := a.be.claims[a.n], b.be.claims[b.n]
			return cmp.Or(strings.Compare(ka.Scope, kb.Scope), strings.Compare(ka.EventID, kb.EventID))
		})
		for _, ref := range refs {
			k := ref.be.claims[ref.n]
			cEntry, cScope, cID = append(cEntry, ref.entry), append(cScope, k.Scope), append(cID, k.EventID)
			cHold, cStatus = append(cHold, ref.be.o.e.HoldOnExpiry), append(cStatus, int32(ref.be.o.e.ClaimStatus))
		}
		byOrd[r-1] = refs
		pb.Queue(q.sql.enqueue, cEntry, cScope, cID, cHold, cStatus,
			qEntry, qScope, qID, qOrder, qMethod, qURI, qHdr, qBody, qClaims)
	}

	tx, err := q.pool.Begin(ctx)
	if err != nil {
		return interpretError(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	br := tx.SendBatch(ctx, &pb)
	read := func() error {
		if len(locks) > 0 {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		for r := range rounds {
			rows, err := br.Query()
			if err != nil {
				return err
			}
			for rows.Next() {
				var (
					queued, claimable, written bool
					pos                        int32
					state                      string
					micros, id                 int64
				)
				if err := rows.Scan(&queued, &pos, &claimable, &written, &state, &micros, &id); err != nil {
					rows.Close()
					return err
				}
				if queued {
					if pos >= 0 && int(pos) < len(entries) {
						entries[pos].id = id
					}
					continue
				}
				if pos < 1 || int(pos) > len(byOrd[r]) {
					continue
				}
				ref := byOrd[r][pos-1]
				ref.be.claimable[ref.n], ref.be.written[ref.n] = claimable, written
				ref.be.state[ref.n], ref.be.leaseLeft[ref.n] = state, time.Duration(micros)*time.Microsecond
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
		}
		return nil
	}
	err = read()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return interpretError(err)
	}
	for _, be := range entries {
		if be.raced() {
			return errRaced
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("committing: %w", interpretError(err))
	}
	return nil
}

// raced reports whether every claim of the entry read claimable (so the
// statement wrote them) but not every one was written.
func (be *batchEntry) raced() bool {
	if be.repeat >= 0 {
		return false
	}
	for n := range be.claims {
		if !be.claimable[n] {
			return false
		}
	}
	return slices.Contains(be.written, false)
}

// outcome is the entry's result once its batch is committed: the first
// claim refused decides (as the store would explain it), else Duplicate at
// a repeated claim, else Queued, or Duplicate when the queue row existed.
func (be *batchEntry) outcome() (queue.Enqueued, error) {
	for n := range be.claims {
		if be.claimable[n] {
			continue
		}
		out, retry, err := refusal(store.State(be.state[n]), be.leaseLeft[n])
		if err != nil {
			return queue.Enqueued{}, fmt.Errorf("enqueueing event: claiming event: %w", err)
		}
		return queue.Enqueued{Outcome: out, Refused: n, RetryAfter: retry}, nil
	}
	if be.repeat >= 0 {
		return queue.Enqueued{Outcome: queue.Duplicate, Refused: be.repeat}, nil
	}
	if be.id == 0 {
		return queue.Enqueued{Outcome: queue.Duplicate, Refused: -1}, nil
	}
	return queue.Enqueued{Outcome: queue.Queued, ID: be.id, Refused: -1}, nil
}

// refusal is why a claim that read as not claimable (store.ClaimableSQL)
// was refused, as the store's Claim explains it: a completed event is a
// Duplicate, a held one Held, a live claim InFlight (with the lease left);
// an expired claim is refused only under on_ambiguous hold, where the
// store parks it as held and answers Held (the parking is rolled back with
// the refused enqueue, so the statement never writes it).
func refusal(state store.State, leaseLeft time.Duration) (queue.Outcome, time.Duration, error) {
	switch state {
	case store.StateCompleted:
		return queue.Duplicate, 0, nil
	case store.StateHeld:
		return queue.Held, 0, nil
	case store.StateProcessing:
		if leaseLeft > 0 {
			return queue.InFlight, store.RetryAfter(leaseLeft), nil
		}
		return queue.Held, 0, nil
	}
	return 0, 0, fmt.Errorf("unknown event state %q", state)
}

// enqueueOne enqueues e in a transaction of its own: the order key's lock,
// then each claim through the store's rules (q.store.InTx), then the queue
// row. A refused claim rolls everything back.
func (q *Queue) enqueueOne(ctx context.Context, e queue.Entry, hjson []byte) (queue.Enqueued, error) {
	tx, err := q.pool.Begin(ctx)
	if err != nil {
		return queue.Enqueued{}, fmt.Errorf("enqueueing event: %w", interpretError(err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	if e.OrderKey != "" {
		if _, err := tx.Exec(ctx, q.sql.lockOrder, []int64{lockKey("order", q.lockBase, e.Scope, e.OrderKey)}); err != nil {
			return queue.Enqueued{}, fmt.Errorf("enqueueing event: %w", interpretError(err))
		}
	}
	claims := q.store.InTx(tx)
	for i, k := range e.Claims {
		out, retry, err := claim(ctx, claims, k, e.ClaimStatus, e.HoldOnExpiry)
		if err != nil {
			return queue.Enqueued{}, fmt.Errorf("enqueueing event: %w", err)
		}
		if out != queue.Queued {
			return queue.Enqueued{Outcome: out, Refused: i, RetryAfter: retry}, nil
		}
	}
	var id int64
	err = tx.QueryRow(ctx, q.sql.insert, e.Scope, e.EventID, e.OrderKey, e.Request.Method, e.Request.URI,
		hjson, e.Request.Body).Scan(&id)
	out := queue.Enqueued{Outcome: queue.Queued, ID: id, Refused: -1}
	if errors.Is(err, pgx.ErrNoRows) {
		out = queue.Enqueued{Outcome: queue.Duplicate, Refused: -1}
	} else if err != nil {
		return queue.Enqueued{}, fmt.Errorf("enqueueing event: %w", interpretError(err))
	}
	if err := tx.Commit(ctx); err != nil {
		return queue.Enqueued{}, fmt.Errorf("enqueueing event: committing: %w", interpretError(err))
	}
	return out, nil
}

// claim records one claim in the events table through the store's rules
// (st runs in the enqueue's transaction): claimed, then completed with
// status at once, so the event reads as accepted; else why not.
func claim(ctx context.Context, st store.Store, k queue.Key, status int, hold bool) (queue.Outcome, time.Duration, error) {
	c, err := st.Claim(ctx, store.ClaimParams{Scope: k.Scope, EventID: k.EventID, Lease: claimLease, HoldOnExpiry: hold})
	if err != nil {
		return 0, 0, err
	}
	switch c.Outcome {
	case store.Claimed:
		return queue.Queued, 0, st.Complete(ctx, k.Scope, k.EventID, c.Token, status)
	case store.Duplicate:
		return queue.Duplicate, 0, nil
	case store.InFlight:
		return queue.InFlight, c.RetryAfter, nil
	case store.Held:
		return queue.Held, 0, nil
	}
	return 0, 0, fmt.Errorf("claiming event: unexpected outcome %v", c.Outcome)
}
