package dispatch

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
)

// heartbeat renews the lease every third of it until stop is closed or ctx
// ends; a lost lease cancels the delivery with errLeaseLost (another
// dispatcher holds the event now).
func (rt *route) heartbeat(ctx context.Context, cancel context.CancelCauseFunc, cfg *Route, j queue.Job, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(max(cfg.Lease/3, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		hctx, hcancel := context.WithTimeout(ctx, cfg.Lease/3)
		t0 := time.Now()
		err := rt.d.q.Heartbeat(hctx, j.ID, j.Token, cfg.Lease)
		rt.d.opts.Metrics.observeStore("heartbeat_queued", time.Since(t0))
		hcancel()
		switch {
		case errors.Is(err, queue.ErrLeaseLost):
			cancel(errLeaseLost)
			return
		case err != nil && ctx.Err() == nil:
			rt.logger().Warn("renewing queue lease failed", zap.String("scope", cfg.Scope),
				zap.String("event_id", j.EventID), zap.Error(err))
		}
	}
}
