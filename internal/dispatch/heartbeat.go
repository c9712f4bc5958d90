package dispatch

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/lease"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
)

// heartbeat renews the lease every third of it (lease.Keep, the loop the
// synchronous forward uses too) until stop is closed or ctx ends; a lost
// lease cancels the delivery with errLeaseLost (another dispatcher holds the
// event now).
func (rt *route) heartbeat(ctx context.Context, cancel context.CancelCauseFunc, cfg *Route, j queue.Job, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	err := lease.Keep(ctx, stop, lease.Renewal{
		Lease: cfg.Lease,
		Renew: func(ctx context.Context) error {
			t0 := time.Now()
			defer func() { rt.d.series.heartbeat.Observe(time.Since(t0).Seconds()) }()
			return rt.d.q.Heartbeat(ctx, j.ID, j.Token, cfg.Lease)
		},
		Lost:   queue.ErrLeaseLost,
		Logger: rt.logger(), Name: "queue lease",
		Fields: []zap.Field{zap.String("scope", cfg.Scope), zap.String("event_id", j.EventID)},
	})
	if err != nil {
		cancel(errLeaseLost)
	}
}
