package dispatch

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// maintain refreshes the queue gauges and applies retention and keep_body
// to the scope until the route stops.
func (rt *route) maintain() {
	defer rt.bg.Done()
	opts := &rt.d.opts
	stats := time.NewTicker(opts.StatsInterval)
	defer stats.Stop()
	sweep := time.NewTicker(opts.SweepInterval)
	defer sweep.Stop()
	rt.refreshStats()
	for {
		select {
		case <-rt.quit:
			return
		case <-stats.C:
			rt.refreshStats()
		case <-sweep.C:
			rt.sweep()
		}
	}
}

// refreshStats sets the scope's gauges from the database: the same values
// on every instance.
func (rt *route) refreshStats() {
	ctx, cancel := context.WithTimeout(rt.lctx, rt.d.opts.StoreTimeout)
	defer cancel()
	st, err := rt.d.q.Stats(ctx, rt.scope)
	if err != nil {
		if rt.lctx.Err() == nil {
			rt.logger().Warn("counting queued events failed", zap.String("scope", rt.scope), zap.Error(err))
		}
		return
	}
	rt.gauges.Store(true)
	rt.d.opts.Metrics.setStats(rt.scope, st)
}

// dropGauges removes the scope's gauges once this instance no longer
// serves it, so they don't go stale.
func (rt *route) dropGauges() {
	if rt.gauges.Load() {
		rt.d.opts.Metrics.dropStats(rt.scope)
	}
}

// sweep deletes delivered and dead events older than retention and drops
// bodies older than keep_body, in bounded batches until none is left (no
// cap per tick: the sweep keeps up with any rate), resting between them
// as store.Sweep does.
func (rt *route) sweep() {
	cfg := rt.cfg.Load()
	batch := rt.d.opts.SweepBatch
	for { // until nothing expired is left, resting between batches (store.Sweep)
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(rt.lctx, rt.d.opts.StoreTimeout)
		deleted, stripped, err := rt.d.q.Sweep(ctx, queue.SweepParams{
			Scope: cfg.Scope, Retention: cfg.Retention, KeepBody: cfg.KeepBody, Limit: batch,
		})
		cancel()
		if err != nil {
			if rt.lctx.Err() == nil {
				rt.logger().Warn("queue retention sweep failed", zap.String("scope", cfg.Scope), zap.Error(err))
			}
			return
		}
		if deleted < batch && stripped < batch {
			return
		}
		if !store.Sleep(rt.lctx, store.SweepRest(time.Since(t0))) {
			return
		}
	}
}
