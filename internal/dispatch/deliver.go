package dispatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/proxyerr"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/sendonce"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// maxUpstreamDrain is the most of an upstream's answer that is read (and
// discarded) so the connection can be reused.
const maxUpstreamDrain = 64 << 10

// deliver makes one attempt, renewing the lease meanwhile, and settles it:
// delivered on 2xx, else queued again after the backoff or dead. At
// shutdown an attempt without an answer is released (it does not count);
// after Kill nothing is settled.
func (rt *route) deliver(cfg *Route, j queue.Job) {
	ctx, cancel := context.WithCancelCause(rt.dctx)
	defer cancel(nil)
	stopHB := make(chan struct{})
	hbDone := make(chan struct{})
	go rt.heartbeat(ctx, cancel, cfg, j, stopHB, hbDone)

	start := time.Now()
	status, errText := rt.sendSafe(ctx, cfg, j)
	dur := time.Since(start)
	close(stopHB)
	<-hbDone

	opts := &rt.d.opts
	cause := context.Cause(ctx)
	log := rt.logger()
	fields := []zap.Field{zap.String("scope", cfg.Scope), zap.String("event_id", j.EventID), zap.Int("attempt", j.Attempt)}
	switch {
	case errors.Is(cause, errKilled):
		return // as a crash: nothing is settled
	case status == 0 && errors.Is(cause, errShutdown) && !cfg.CompleteByUpstream:
		// complete_by upstream settles by the truth below instead: the
		// upstream may have committed before the shutdown cut its answer.
		sctx, scancel := context.WithTimeout(context.Background(), opts.StoreTimeout)
		err := rt.d.q.Release(sctx, j.ID, j.Token, j.Attempt)
		scancel()
		rt.attempts[queue.AttemptReleased].Inc()
		if err != nil {
			log.Warn("handing a delivery back at shutdown failed; its lease will expire", append(fields, zap.Error(err))...)
		}
		return
	case errors.Is(cause, errLeaseLost) && errText == "":
		errText = "lease lost during the delivery"
	}

	delivered := status >= 200 && status < 300
	settlement := queue.Settlement{
		ID: j.ID, Token: j.Token, Attempt: j.Attempt, Status: status, Error: errText, Duration: dur,
		Delivered: delivered, RetryIn: cfg.backoff(j.RoundAttempts), MaxAttempts: cfg.MaxAttempts, MaxAge: cfg.MaxAge,
	}
	t0 := time.Now()
	var (
		state     queue.State
		err       error
		committed bool
	)
	if cfg.CompleteByUpstream {
		// Settled by the truth: the wait for the upstream's transaction
		// comes on top of the store timeout.
		wait := cmp.Or(cfg.CommitWait, DefaultCommitWait)
		if errors.Is(cause, errShutdown) {
			wait = min(wait, opts.Grace)
		}
		sctx, scancel := context.WithTimeout(context.Background(), opts.StoreTimeout+wait)
		state, committed, err = rt.d.q.Conclude(sctx, settlement, wait)
		scancel()
	} else {
		sctx, scancel := context.WithTimeout(context.Background(), opts.StoreTimeout)
		state, err = rt.d.q.Settle(sctx, settlement)
		scancel()
	}
	rt.d.series.settle.Observe(time.Since(t0).Seconds())
	fields = append(fields, zap.Int("status", status), zap.Duration("duration", dur))
	if cfg.CompleteByUpstream {
		fields = append(fields, zap.Bool("committed_by_upstream", committed))
		if delivered && !committed && err == nil {
			log.Warn("upstream answered 2xx without committing the claim (complete_by upstream): "+
				"it does not call the commit function, or uses another database; its lost answers are not protected",
				fields...)
		}
	}
	switch {
	case errors.Is(err, queue.ErrPending):
		rt.attempts[AttemptPending].Inc()
		log.Warn("the upstream's transaction still held the event when the wait ended; "+
			"it is settled when that transaction ends and the lease expires", fields...)
		return
	case errors.Is(err, queue.ErrLeaseLost):
		rt.attempts[AttemptLeaseLost].Inc()
		log.Warn("queue lease lost before settling; the event may be delivered twice", fields...)
		return
	case err != nil:
		rt.attempts[AttemptSettleFailed].Inc()
		log.Warn("settling a delivery failed; its lease will expire and it will be delivered again",
			append(fields, zap.Error(err))...)
		return
	}
	outcome := queue.AttemptRetry
	switch state {
	case queue.StateDelivered:
		outcome = queue.AttemptDelivered
		if cfg.CompleteByUpstream && !committed {
			outcome = AttemptUncommitted
		}
	case queue.StateDead:
		outcome = queue.AttemptDead
	}
	rt.attempts[outcome].Inc()
	fields = append(fields, zap.String("outcome", outcome))
	switch {
	case state == queue.StateDead:
		log.Warn("event is dead: out of attempts or max_age; retry it through the admin API",
			append(fields, zap.String("error", errText))...)
	case !delivered:
		if c := log.Check(zap.InfoLevel, "queued delivery failed; will retry"); c != nil {
			c.Write(append(fields, zap.String("error", errText))...)
		}
	default:
		if c := log.Check(zap.DebugLevel, "queued event delivered"); c != nil {
			c.Write(fields...)
		}
	}
}

// sendSafe is send, with a panic turned into a failed attempt (status 0),
// so the attempt is still settled and the dispatcher's goroutine, which no
// net/http server recovers, does not take the process down.
func (rt *route) sendSafe(ctx context.Context, cfg *Route, j queue.Job) (status int, errText string) {
	defer func() {
		if p := recover(); p != nil {
			rt.logger().Error("delivery attempt panicked; settled as failed", zap.String("scope", cfg.Scope),
				zap.String("event_id", j.EventID), zap.Any("panic", p))
			status, errText = 0, fmt.Sprintf("ambiguous (the delivery panicked): %v", p)
		}
	}()
	return rt.send(ctx, cfg, j)
}

// send makes the HTTP request: the stored method, headers and body, to the
// route's target, bounded by its Timeout. It returns the upstream's status
// (0 when there was no answer) and, unless 2xx, why the attempt failed.
func (rt *route) send(ctx context.Context, cfg *Route, j queue.Job) (int, string) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, j.Request.Method, cfg.urlFor(j.Request.URI), nil)
	if err != nil {
		return 0, "building the request: " + err.Error()
	}
	req.Header = j.Request.Header.Clone()
	if req.Header == nil {
		req.Header = http.Header{}
	}
	// Never one from outside (a stored request's, say): the upstream
	// commits whatever claim it is given.
	req.Header.Del(ClaimHeader)
	if cfg.CompleteByUpstream {
		req.Header.Set(ClaimHeader, store.QueueClaimValue(cfg.Scope, j.EventID, j.Token))
	}
	// A dispatch attempt is a forward of a claimed job: never re-sent by
	// the Transport inside the attempt (the job's retries are counted).
	sendonce.SetBody(req, j.Request.Body)
	resp, err := rt.d.client.Do(req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return 0, "no answer within forward_timeout (" + cfg.Timeout.String() + "; ambiguous: the upstream may have done the work)"
		}
		// Classified as in sync mode (proxyerr.Ambiguous); async mode
		// retries either way (at least once), the text tells operators
		// which attempts may have reached the upstream.
		if proxyerr.Ambiguous(err) {
			return 0, "ambiguous (the request may have reached the upstream): " + err.Error()
		}
		return 0, "not delivered (the request never reached the upstream): " + err.Error()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxUpstreamDrain))
	_ = resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp.StatusCode, ""
	}
	return resp.StatusCode, "upstream answered " + strconv.Itoa(resp.StatusCode)
}
