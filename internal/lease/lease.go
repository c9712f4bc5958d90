// Package lease keeps a lease alive while its work runs: the heartbeat of a
// synchronous forward (its claims in the store) and of a queued delivery
// (its lease in the queue), written once.
package lease

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"
)

// minInterval bounds how often a very short lease is renewed.
const minInterval = 10 * time.Millisecond

// retryDivisor: after a failed renewal the next one is tried a tenth of the
// renewal interval (a thirtieth of the lease: 1 s of the default 30 s)
// after it began, not a whole interval: waiting the interval, a lease whose
// store was away across two renewals' times expired although it came back
// a third of the lease before.
const retryDivisor = 10

// Renewal describes one lease to keep alive.
type Renewal struct {
	// Lease is the lease's length. It is renewed every third of it (at
	// least every 10 ms), and each renewal may take a third of it; after a
	// failed renewal, again every thirtieth of it (retryDivisor), so a
	// store that comes back in time keeps the lease: an outage that began
	// just before a renewal was due may last up to two thirds of the
	// lease, not one third.
	Lease time.Duration
	// Renew extends the lease by Lease, within ctx.
	Renew func(ctx context.Context) error
	// Lost is the error Renew returns (errors.Is) once the lease is gone,
	// e.g. store.ErrLeaseLost: renewing again cannot help.
	Lost error
	// Logger receives failed renewals at Warn, as "renewing <Name>
	// failed" with Fields; never bodies or secrets. Nil discards them.
	Logger *zap.Logger
	Name   string
	Fields []zap.Field
}

// Keep renews r's lease until ctx ends or stop is closed (it returns nil),
// or a renewal reports r.Lost (it returns that error and renews no more).
// Other failures are logged, unless ctx ended meanwhile (the work is
// over), and renewing goes on: a store that comes back in time keeps the
// lease. A renewal under way when stop closes is finished first.
func Keep(ctx context.Context, stop <-chan struct{}, r Renewal) error {
	h := Start(ctx, r)
	select {
	case <-stop:
	case <-ctx.Done():
	case <-h.lost:
	}
	return h.Stop()
}

// Held is a lease kept alive by Start. Between renewals nothing runs for
// it: a timer, not a goroutine, waits for the next one, so work that ends
// before its first renewal is due (a forward shorter than a third of its
// lease, the common case) costs a timer set and stopped.
type Held struct {
	ctx      context.Context //nolint:containedctx // the work's: it bounds every renewal
	r        Renewal
	interval time.Duration
	retry    time.Duration // the wait after a failed renewal
	t        *time.Timer

	mu       sync.Mutex
	stopped  bool
	renewing chan struct{} // closed when the renewal under way ends; nil when none is
	err      error         // r.Lost, once a renewal reported it
	lost     chan struct{} // closed with err set
}

// Start keeps r's lease alive, renewing it every third of r.Lease (at
// least every 10 ms; each renewal bounded by that much too) on a timer's
// goroutine, until Stop is called, ctx ends, or a renewal reports r.Lost.
// Failed renewals are logged as Keep's are.
func Start(ctx context.Context, r Renewal) *Held {
	if r.Logger == nil {
		r.Logger = zap.NewNop()
	}
	interval := max(r.Lease/3, minInterval)
	h := &Held{ctx: ctx, r: r, interval: interval, retry: max(interval/retryDivisor, minInterval), lost: make(chan struct{})}
	h.mu.Lock()
	h.t = time.AfterFunc(h.interval, h.renew)
	h.mu.Unlock()
	return h
}

// renew runs one renewal, then sets the timer for the next one: a third of
// the lease after this one started, as a ticker would.
func (h *Held) renew() {
	h.mu.Lock()
	if h.stopped || h.err != nil || h.ctx.Err() != nil {
		h.mu.Unlock()
		return
	}
	done := make(chan struct{})
	h.renewing = done
	h.mu.Unlock()

	began := time.Now()
	rctx, cancel := context.WithTimeout(h.ctx, h.interval)
	err := h.r.Renew(rctx)
	cancel()
	lost, next := false, h.interval
	switch {
	case err == nil:
	case h.r.Lost != nil && errors.Is(err, h.r.Lost):
		lost = true
	case h.ctx.Err() == nil:
		h.r.Logger.Warn("renewing "+h.r.Name+" failed", append(h.r.Fields[:len(h.r.Fields):len(h.r.Fields)], zap.Error(err))...)
		next = h.retry
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	h.renewing = nil
	close(done)
	if lost {
		h.err = err
		close(h.lost)
		return
	}
	if !h.stopped {
		h.t.Reset(max(next-time.Since(began), 0))
	}
}

// Stop ends the renewals: none starts after it returns, and one under way
// is waited for. It returns the r.Lost error a renewal reported, if one
// did. Stop may be called more than once.
func (h *Held) Stop() error {
	h.mu.Lock()
	h.stopped = true
	h.t.Stop()
	done := h.renewing
	h.mu.Unlock()
	if done != nil {
		<-done
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}
