package caddymodule

// Async mode's queue on a store that was unreachable at start
// (storeready.go): the dispatcher runs on it from the start and waits, as
// in any outage, until the store is open and the queue's tables exist.

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// pendingQueue is async mode's queue on a pendingStore: created (its
// tables migrated) in the background once the store is open, failing every
// call with the store's errStoreNotReady until then. The dispatcher runs
// on it from the start and backs off on those errors as in any outage.
type pendingQueue struct {
	p      *pendingStore
	ready  atomic.Pointer[closingQueue]
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// newPendingQueue returns the queue of p, created by newQueue (the opened
// store's) once p is ready, retried with backoff.
func newPendingQueue(p *pendingStore) *pendingQueue {
	ctx, cancel := context.WithCancel(context.Background())
	pq := &pendingQueue{p: p, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	go pq.run()
	return pq
}

func (pq *pendingQueue) run() {
	defer close(pq.done)
	select {
	case <-pq.ctx.Done():
		return
	case <-pq.p.readyCh:
	}
	o := pq.p.ready.Load()
	for wait := openRetryMin; ; wait = min(2*wait, openRetryMax) {
		ctx, cancel := context.WithTimeout(pq.ctx, time.Minute)
		q, err := o.newQueue(ctx)
		cancel()
		if err == nil {
			pq.ready.Store(&q)
			return
		}
		if pq.ctx.Err() != nil {
			return
		}
		pq.p.logger.Warn("creating async mode's queue failed; trying again", zap.String("storage", pq.p.desc),
			zap.Duration("retry_in", wait), zap.Error(err))
		if !store.Sleep(pq.ctx, wait) {
			return
		}
	}
}

// queue returns the created queue, or the error of a call until then.
func (pq *pendingQueue) queue() (queue.Queue, error) {
	if q := pq.ready.Load(); q != nil {
		return *q, nil
	}
	if _, err := pq.p.store(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("%w: async mode's queue on %s is being created", errStoreNotReady, pq.p.desc)
}

// Close stops the background creation and closes the queue if it was
// created.
func (pq *pendingQueue) Close() {
	pq.cancel()
	<-pq.done
	if q := pq.ready.Load(); q != nil {
		(*q).Close()
	}
}

var _ closingQueue = (*pendingQueue)(nil)

func (pq *pendingQueue) Enqueue(ctx context.Context, e queue.Entry) (queue.Enqueued, error) {
	q, err := pq.queue()
	if err != nil {
		return queue.Enqueued{}, err
	}
	return q.Enqueue(ctx, e)
}

func (pq *pendingQueue) Take(ctx context.Context, tp queue.TakeParams) (queue.Batch, error) {
	q, err := pq.queue()
	if err != nil {
		return queue.Batch{}, err
	}
	return q.Take(ctx, tp)
}

func (pq *pendingQueue) Heartbeat(ctx context.Context, id int64, token string, lease time.Duration) error {
	q, err := pq.queue()
	if err != nil {
		return err
	}
	return q.Heartbeat(ctx, id, token, lease)
}

func (pq *pendingQueue) Settle(ctx context.Context, s queue.Settlement) (queue.State, error) {
	q, err := pq.queue()
	if err != nil {
		return "", err
	}
	return q.Settle(ctx, s)
}

func (pq *pendingQueue) Conclude(ctx context.Context, s queue.Settlement, wait time.Duration) (queue.State, bool, error) {
	q, err := pq.queue()
	if err != nil {
		return "", false, err
	}
	return q.Conclude(ctx, s, wait)
}

func (pq *pendingQueue) Release(ctx context.Context, id int64, token string, attempt int) error {
	q, err := pq.queue()
	if err != nil {
		return err
	}
	return q.Release(ctx, id, token, attempt)
}

func (pq *pendingQueue) Get(ctx context.Context, scope, eventID string) (queue.Event, error) {
	q, err := pq.queue()
	if err != nil {
		return queue.Event{}, err
	}
	return q.Get(ctx, scope, eventID)
}

func (pq *pendingQueue) Attempts(ctx context.Context, id int64) ([]queue.Attempt, error) {
	q, err := pq.queue()
	if err != nil {
		return nil, err
	}
	return q.Attempts(ctx, id)
}

func (pq *pendingQueue) List(ctx context.Context, lq queue.ListQuery) ([]queue.Event, error) {
	q, err := pq.queue()
	if err != nil {
		return nil, err
	}
	return q.List(ctx, lq)
}

func (pq *pendingQueue) Retry(ctx context.Context, scope, eventID string) error {
	q, err := pq.queue()
	if err != nil {
		return err
	}
	return q.Retry(ctx, scope, eventID)
}

func (pq *pendingQueue) RetryDead(ctx context.Context, scope string) (int, error) {
	q, err := pq.queue()
	if err != nil {
		return 0, err
	}
	return q.RetryDead(ctx, scope)
}

func (pq *pendingQueue) Purge(ctx context.Context, scope, eventID string) error {
	q, err := pq.queue()
	if err != nil {
		return err
	}
	return q.Purge(ctx, scope, eventID)
}

func (pq *pendingQueue) PurgeState(ctx context.Context, scope string, state queue.State) (int, error) {
	q, err := pq.queue()
	if err != nil {
		return 0, err
	}
	return q.PurgeState(ctx, scope, state)
}

func (pq *pendingQueue) Stats(ctx context.Context, scope string) (queue.Stats, error) {
	q, err := pq.queue()
	if err != nil {
		return queue.Stats{}, err
	}
	return q.Stats(ctx, scope)
}

func (pq *pendingQueue) Sweep(ctx context.Context, sp queue.SweepParams) (int, int, error) {
	q, err := pq.queue()
	if err != nil {
		return 0, 0, err
	}
	return q.Sweep(ctx, sp)
}
