// Package coalesce writes concurrent operations in batches (group commit),
// by flat combining: a caller queues its operation; when fewer than Writers
// batches are being written, it becomes a writer itself, takes what is
// queued (up to MaxBatch, in arrival order) and writes it with one call of
// the write function, on its own goroutine, so a lone operation pays no
// hand-off to another goroutine. Operations queued meanwhile wait for the
// next batch; a writer whose own operation is done hands what is left to a
// new goroutine, so no caller waits for batches that are not its own.
//
// There is no timer: a batch is what queued while the previous one was
// written (natural batching), unless MaxWait says otherwise. The store's
// claims and settles and the queue's enqueues are written this way.
package coalesce

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Defaults of Options.
const (
	DefaultMaxBatch = 128
	DefaultTimeout  = 5 * time.Second
)

// Options configure a Coalescer. Zero values mean the defaults.
type Options struct {
	// MaxBatch bounds the operations of one batch. Defaults to
	// DefaultMaxBatch (128).
	MaxBatch int
	// MaxWait is how long a writer waits for more operations before
	// writing a batch that is not full. Defaults to 0: natural batching
	// only, so a lone operation never waits.
	MaxWait time.Duration
	// Writers is how many batches may be written at once. Defaults to 1.
	Writers int
	// Timeout bounds the writing of one batch: the context the write
	// function gets. Defaults to DefaultTimeout (5s).
	Timeout time.Duration
}

// Coalescer batches operations of type T (typically a pointer that the
// write function fills in with each operation's result). Safe for
// concurrent use.
type Coalescer[T any] struct {
	write func(ctx context.Context, batch []T) error
	opts  Options

	mu      sync.Mutex
	queue   []*item[T]
	writers int   // batches being written
	closed  error // set by Close: no more operations are queued
	wg      sync.WaitGroup
}

// item is one caller's operation; done receives its batch's error.
type item[T any] struct {
	ctx  context.Context
	v    T
	done chan error
}

// New returns a coalescer that writes batches with write. write gets the
// batch's operations in arrival order (those whose caller has given up
// are left out, never an empty batch) and a context bounded by
// Options.Timeout; it fills in each operation's result and returns nil,
// or returns the error that fails the whole batch. It runs on a caller's
// goroutine or on one of the coalescer's, never twice at once beyond
// Options.Writers.
func New[T any](opts Options, write func(ctx context.Context, batch []T) error) *Coalescer[T] {
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = DefaultMaxBatch
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Writers <= 0 {
		opts.Writers = 1
	}
	return &Coalescer[T]{write: write, opts: opts}
}

// Do queues v and waits for its batch to be written, writing batches itself
// when a writer is free. It returns the batch's error, ctx's when ctx ends
// first (v may still be written: its result must not be read), or the
// error Close was given.
func (c *Coalescer[T]) Do(ctx context.Context, v T) error {
	it := &item[T]{ctx: ctx, v: v, done: make(chan error, 1)}
	c.mu.Lock()
	if err := c.closed; err != nil {
		c.mu.Unlock()
		return err
	}
	c.queue = append(c.queue, it)
	lead := c.writers < c.opts.Writers
	if lead {
		c.writers++
		c.wg.Add(1)
	}
	c.mu.Unlock()
	if lead {
		c.lead(it)
	}
	select {
	case err := <-it.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// lead writes batches until own is answered, then hands what is queued to
// a new goroutine (or stops when nothing is).
func (c *Coalescer[T]) lead(own *item[T]) {
	for {
		batch := c.take()
		if batch == nil {
			return
		}
		c.writeBatch(batch)
		select {
		case err := <-own.done:
			own.done <- err // put back for Do
			c.mu.Lock()
			if len(c.queue) == 0 {
				c.writers--
				c.wg.Done()
				c.mu.Unlock()
				return
			}
			c.mu.Unlock()
			go c.drain()
			return
		default:
		}
	}
}

// drain writes batches until the queue is empty.
func (c *Coalescer[T]) drain() {
	for {
		batch := c.take()
		if batch == nil {
			return
		}
		c.writeBatch(batch)
	}
}

// take removes the next batch from the queue (waiting MaxWait for it to
// fill, if set), or, when the queue is empty, retires the writer and
// returns nil.
func (c *Coalescer[T]) take() []*item[T] {
	if c.opts.MaxWait > 0 {
		c.mu.Lock()
		n := len(c.queue)
		c.mu.Unlock()
		if n > 0 && n < c.opts.MaxBatch {
			time.Sleep(c.opts.MaxWait)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		c.writers--
		c.wg.Done()
		return nil
	}
	n := min(len(c.queue), c.opts.MaxBatch)
	batch := slices.Clone(c.queue[:n])
	clear(c.queue[:n])
	c.queue = c.queue[n:]
	if len(c.queue) == 0 {
		c.queue = nil
	}
	return batch
}

// writeBatch writes one batch and answers its operations. Operations whose
// caller has given up are answered with their context's error and left out.
func (c *Coalescer[T]) writeBatch(batch []*item[T]) {
	live := batch[:0]
	for _, it := range batch {
		if err := it.ctx.Err(); err != nil {
			it.done <- err
			continue
		}
		live = append(live, it)
	}
	if len(live) == 0 {
		return
	}
	vs := make([]T, len(live))
	for i, it := range live {
		vs[i] = it.v
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.Timeout)
	err := c.write(ctx, vs)
	cancel()
	for _, it := range live {
		it.done <- err
	}
}

// Queued reports how many operations wait for a batch to be taken (for
// tests and diagnostics).
func (c *Coalescer[T]) Queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// Close fails the queued operations with err, makes Do refuse new ones
// with err, and waits for the batches being written. err must not be nil.
func (c *Coalescer[T]) Close(err error) {
	c.mu.Lock()
	if c.closed == nil {
		c.closed = err
	}
	queued := c.queue
	c.queue = nil
	c.mu.Unlock()
	for _, it := range queued {
		it.done <- err
	}
	c.wg.Wait()
}
