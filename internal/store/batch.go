package store

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Defaults of BatchOptions.
const (
	DefaultMaxBatch     = 128
	DefaultBatchTimeout = 5 * time.Second
)

// ErrClosed is returned by an operation submitted to a closed store.
var ErrClosed = errors.New("store closed")

// BatchOptions configure the coalescer of a store whose driver is a
// BatchDriver (group commit, after River's batch completer): claims and
// settles that arrive while a batch is being written wait for the next
// one, which a single writer writes in one transaction. Zero values mean
// the defaults.
type BatchOptions struct {
	// Disabled writes each operation with its own statement and commit.
	Disabled bool
	// MaxBatch bounds the operations (claims plus settles) of one
	// transaction. Defaults to DefaultMaxBatch (128).
	MaxBatch int
	// MaxWait is how long the writer waits for more operations after the
	// first before writing a batch that is not full. Defaults to 0:
	// natural batching only (what queued while the previous batch was
	// written), so a lone delivery never waits.
	MaxWait time.Duration
	// Writers is how many batches may be written at once: while one
	// waits for its commit, the next is written on another connection
	// (PostgreSQL then flushes their commits together). Defaults to 1;
	// the postgres store defaults it to its DefaultBatchWriters. A single
	// writer makes the biggest batches; several, the shortest waits.
	Writers int
	// Timeout bounds the writing of one batch (its statements and commit).
	// Defaults to DefaultBatchTimeout (5s).
	Timeout time.Duration
	// Observe, when set, is told the size of each batch written: op is
	// "claim", "complete" or "release" with the count of that kind, and
	// "transaction" with the batch's total. Called on the writer goroutine:
	// it must be quick.
	Observe func(op string, n int)
}

// batcher is the coalescer: callers queue ops on ops, one writer goroutine
// takes the first, then everything else queued (up to MaxBatch), and
// writes them with one WriteBatch.
type batcher struct {
	d    BatchDriver
	opts BatchOptions
	ops  chan *op
	quit chan struct{}
	wg   sync.WaitGroup
	once sync.Once
	// mu orders queuing against close: once closed is set, nothing more is
	// queued, so close's drain answers every op the writers left.
	mu     sync.RWMutex
	closed bool
}

// op is one caller's claim or settle; done receives the batch's error.
type op struct {
	ctx    context.Context
	claim  *BatchClaim
	settle *BatchSettle
	// follows is set by the writer on a claim whose (scope, event ID) an
	// earlier claim of the same batch carries: its result is derived from
	// the leader's, as if it had run right after it.
	follows *BatchClaim
	done    chan error
}

func newBatcher(d BatchDriver, opts BatchOptions) *batcher {
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = DefaultMaxBatch
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultBatchTimeout
	}
	if opts.Writers <= 0 {
		opts.Writers = 1
	}
	b := &batcher{d: d, opts: opts, ops: make(chan *op, opts.MaxBatch), quit: make(chan struct{})}
	for range opts.Writers {
		b.wg.Go(b.run)
	}
	return b
}

// do queues o and waits for its batch to be committed. It returns the
// batch's error, ctx's when ctx ends first (the op may still be written),
// or ErrClosed.
func (b *batcher) do(ctx context.Context, o *op) error {
	o.ctx = ctx
	o.done = make(chan error, 1)
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		return ErrClosed
	}
	select {
	case b.ops <- o: // the writers run until closed is set, so this cannot block close
	case <-ctx.Done():
		b.mu.RUnlock()
		return ctx.Err()
	}
	b.mu.RUnlock()
	select {
	case err := <-o.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close stops the writer after the batch it is writing; queued ops fail
// with ErrClosed.
func (b *batcher) close() {
	b.once.Do(func() {
		b.mu.Lock()
		b.closed = true
		b.mu.Unlock()
		close(b.quit)
		b.wg.Wait()
		for {
			select {
			case o := <-b.ops:
				o.done <- ErrClosed
			default:
				return
			}
		}
	})
}

func (b *batcher) run() {
	batch := make([]*op, 0, b.opts.MaxBatch)
	for {
		select {
		case o := <-b.ops:
			batch = append(batch[:0], o)
		case <-b.quit:
			return
		}
		batch = b.gather(batch)
		b.write(batch)
		clear(batch)
	}
}

// gather adds to batch what is queued, up to MaxBatch; with MaxWait, it
// waits that long for the batch to fill.
func (b *batcher) gather(batch []*op) []*op {
	for len(batch) < b.opts.MaxBatch {
		select {
		case o := <-b.ops:
			batch = append(batch, o)
			continue
		default:
		}
		break
	}
	if b.opts.MaxWait <= 0 || len(batch) >= b.opts.MaxBatch {
		return batch
	}
	t := time.NewTimer(b.opts.MaxWait)
	defer t.Stop()
	for len(batch) < b.opts.MaxBatch {
		select {
		case o := <-b.ops:
			batch = append(batch, o)
		case <-t.C:
			return batch
		case <-b.quit:
			return batch
		}
	}
	return batch
}

// write writes one batch and answers its ops. Ops whose caller has given
// up are left out; a claim repeating an earlier one's (scope, event ID)
// follows it instead of entering the statement.
func (b *batcher) write(batch []*op) {
	var (
		wb      Batch
		leaders map[claimKey]int
		live    = make([]*op, 0, len(batch))
		leader  = make([]int, 0, len(batch)) // per live op: its claim's index in wb.Claims, or -1
	)
	for _, o := range batch {
		if err := o.ctx.Err(); err != nil {
			o.done <- err
			continue
		}
		live = append(live, o)
		if o.settle != nil {
			wb.Settles = append(wb.Settles, *o.settle)
			leader = append(leader, -1)
			continue
		}
		if leaders == nil {
			leaders = make(map[claimKey]int, len(batch))
		}
		k := claimKey{o.claim.Scope, o.claim.EventID}
		i, ok := leaders[k]
		if !ok {
			i = len(wb.Claims)
			leaders[k] = i
			wb.Claims = append(wb.Claims, *o.claim)
		} else {
			o.follows = &BatchClaim{} // filled below
		}
		leader = append(leader, i)
	}
	if len(live) == 0 {
		return
	}
	b.observe(&wb, len(live))

	ctx, cancel := context.WithTimeout(context.Background(), b.opts.Timeout)
	err := b.d.WriteBatch(ctx, &wb)
	cancel()

	si := 0
	for n, o := range live {
		switch {
		case err != nil:
		case o.settle != nil:
			*o.settle = wb.Settles[si]
			si++
		case o.follows != nil:
			*o.follows = wb.Claims[leader[n]]
		default:
			*o.claim = wb.Claims[leader[n]]
		}
		o.done <- err
	}
}

func (b *batcher) observe(wb *Batch, total int) {
	if b.opts.Observe == nil {
		return
	}
	var complete, release int
	for _, s := range wb.Settles {
		if s.Stmt == StmtComplete {
			complete++
		} else {
			release++
		}
	}
	claims := total - len(wb.Settles)
	for _, c := range [...]struct {
		op string
		n  int
	}{{"claim", claims}, {"complete", complete}, {"release", release}} {
		if c.n > 0 {
			b.opts.Observe(c.op, c.n)
		}
	}
	b.opts.Observe("transaction", total)
}

type claimKey struct{ scope, eventID string }
