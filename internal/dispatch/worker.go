package dispatch

import (
	"time"

	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
)

// run takes work while the route lives: as many events as it has free
// workers, within the caps the database enforces; it sleeps until work is
// due, a delivery ends, or this instance queues an event.
func (rt *route) run() {
	defer close(rt.loopDone)
	opts := &rt.d.opts
	var (
		wait     time.Duration
		failures int
	)
	for {
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-rt.quit:
				t.Stop()
				return
			case <-rt.wake:
				t.Stop()
			case <-t.C:
			}
		}
		select {
		case <-rt.quit:
			return
		default:
		}
		cfg := rt.cfg.Load()
		free := cfg.workers() - int(rt.inflight.Load())
		if free <= 0 {
			wait = opts.IdlePoll // a delivery's end wakes the loop
			continue
		}
		b, err := rt.d.q.Take(rt.lctx, queue.TakeParams{
			Scope: cfg.Scope, Limit: free, MaxConcurrency: cfg.MaxConcurrency, Rate: cfg.Rate, Per: cfg.Per,
			Lease: cfg.Lease, MaxAttempts: cfg.MaxAttempts, MaxAge: cfg.MaxAge, Worker: opts.Worker,
		})
		if err != nil {
			if rt.lctx.Err() != nil {
				return
			}
			failures++
			wait = min(opts.ErrorPoll<<min(failures-1, 5), opts.MaxErrorPoll)
			rt.logger().Warn("taking queued events failed", zap.String("scope", cfg.Scope),
				zap.Int("failures", failures), zap.Duration("retry_in", wait), zap.Error(err))
			continue
		}
		failures = 0
		if b.Lost > 0 {
			rt.attempts[queue.AttemptLost].Add(float64(b.Lost))
			rt.logger().Warn("took back events whose dispatcher stopped mid-delivery; they may be delivered twice",
				zap.String("scope", cfg.Scope), zap.Int("events", b.Lost), zap.Int("dead", b.LostDead))
		}
		// Deliveries use the config in force now: a reload during the take
		// already applies to them.
		for _, j := range b.Jobs {
			rt.start(rt.cfg.Load(), j)
		}
		switch {
		case len(b.Jobs) == free:
			wait = 0 // there may be more
		case b.Busy:
			wait = opts.BusyPoll
		case b.RateLimited:
			wait = min(max(b.NextIn, 10*time.Millisecond), opts.IdlePoll)
		default:
			wait = opts.IdlePoll
			if b.NextIn > 0 && b.NextIn < wait {
				wait = b.NextIn
			}
		}
	}
}

// start runs one delivery in its own goroutine; its end wakes the loop.
func (rt *route) start(cfg *Route, j queue.Job) {
	rt.inflight.Add(1)
	rt.active.Add(1)
	go func() {
		defer func() {
			rt.inflight.Add(-1)
			rt.active.Done()
			rt.poke()
		}()
		rt.deliver(cfg, j)
	}()
}
