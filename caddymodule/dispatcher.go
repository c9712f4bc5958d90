package caddymodule

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/lease"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
	pgqueue "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue/postgres"
	pgstore "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// The dispatcher delivers queued events. There is one per queue (storage
// DSN and table) per process, in the queues UsagePool next to the store's
// backends: every async handler of that storage registers its route (scope)
// with it, config reloads hand a route over to the new config without
// stopping it, and when the last handler is cleaned up the dispatcher stops
// gracefully. Every instance runs one; they share the work through the
// database.
var queues = caddy.NewUsagePool()

// Timings of the dispatcher.
const (
	// defaultWorkers is how many deliveries of one scope an instance runs at
	// once when max_concurrency does not say.
	defaultWorkers = 16
	// idlePoll is how often an idle route looks for work that another
	// instance queued (work queued on this instance wakes it at once).
	idlePoll = time.Second
	// busyPoll is how often a route whose max_concurrency is reached (by
	// all instances together) looks for a free slot.
	busyPoll = 100 * time.Millisecond
	// errorPoll is the first back-off after a failed take; it doubles, up
	// to maxErrorPoll.
	errorPoll    = time.Second
	maxErrorPoll = 30 * time.Second
	// shutdownGrace is how long in-flight deliveries may finish when a
	// route or the dispatcher stops; then they are cancelled and their
	// events handed back to the queue.
	shutdownGrace = 10 * time.Second
	// statsInterval is how often the queue gauges are refreshed.
	statsInterval = 15 * time.Second
	// maxUpstreamDrain is the most of an upstream's answer that is read (and
	// discarded) so the connection can be reused.
	maxUpstreamDrain = 64 << 10
	// jitter is the spread of a retry delay: ±20%.
	jitter = 0.2
)

// Causes a delivery's context is cancelled with.
var (
	errShutdown  = errors.New("dispatcher stopping")
	errKilled    = errors.New("dispatcher killed")
	errLeaseLost = errors.New("queue lease lost")
)

// queueBackend is the pooled value: the queue of one storage and its
// dispatcher.
type queueBackend struct {
	q queue.Queue
	d *dispatcher
}

// Destruct implements caddy.Destructor: the last handler using the queue is
// gone. Deliveries in flight get shutdownGrace to finish.
func (qb *queueBackend) Destruct() error {
	qb.d.stop()
	return nil
}

// openQueue returns the pooled queue of a store backend, creating its
// tables (named after the store's table) on first use. key is the store
// backend's pool key: the queue uses the store's connection pool, and a
// handler releases the queue before the store, so the pool outlives the
// dispatcher.
func openQueue(key string, b *backend) (*queueBackend, error) {
	val, _, err := queues.LoadOrNew(key, func() (caddy.Destructor, error) {
		ps, ok := b.Store.(*pgstore.Store)
		if !ok {
			return nil, errors.New("the store is not the PostgreSQL store")
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		q, err := pgqueue.New(ctx, ps, pgqueue.Options{})
		if err != nil {
			return nil, err
		}
		return &queueBackend{q: q, d: newDispatcher(q)}, nil
	})
	if err != nil {
		return nil, err
	}
	qb, ok := val.(*queueBackend)
	if !ok {
		return nil, errors.New("queue pool holds an unexpected value")
	}
	return qb, nil
}

// dispatcher runs one route per scope registered with it.
type dispatcher struct {
	q         queue.Queue
	worker    string // names this process in the attempts table
	client    *http.Client
	transport *http.Transport
	logger    *zap.Logger
	grace     time.Duration

	mu      sync.Mutex
	routes  map[string]*route
	stopped bool
	stops   sync.WaitGroup // routes stopping in the background
}

func newDispatcher(q queue.Queue) *dispatcher {
	host, _ := os.Hostname()
	var b [3]byte
	_, _ = crand.Read(b[:])
	tr := &http.Transport{
		Proxy:                 nil, // deliver_to is reached directly
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   32,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	return &dispatcher{
		q:         q,
		worker:    fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:])),
		transport: tr,
		client: &http.Client{
			Transport: tr,
			// A redirect is an answer other than 2xx: retried, never followed
			// (following would turn the POST into a GET).
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		logger: caddy.Log().Named("http.handlers.webhook_idempotency.dispatcher"),
		grace:  shutdownGrace,
		routes: map[string]*route{},
	}
}

// registration is one handler's hold on a route.
type registration struct {
	rt  *route
	cfg *routeConfig
	qb  *queueBackend
}

// register adds a handler's route config. The newest registration of a
// scope is the one in force: after a reload, the new config's.
func (d *dispatcher) register(qb *queueBackend, cfg *routeConfig) *registration {
	d.mu.Lock()
	defer d.mu.Unlock()
	rt := d.routes[cfg.scope]
	if rt == nil {
		rt = newRoute(d, cfg)
		if !d.stopped {
			d.routes[cfg.scope] = rt
			rt.startLoop()
		}
	}
	reg := &registration{rt: rt, cfg: cfg, qb: qb}
	rt.regs = append(rt.regs, reg)
	rt.cfg.Store(cfg)
	queueScopes.add(cfg.scope, qb)
	return reg
}

// unregister drops a handler's registration; the config in force falls
// back to the newest remaining one, and a route without registrations
// stops in the background (the dispatcher's stop waits for it).
func (d *dispatcher) unregister(reg *registration) {
	d.mu.Lock()
	rt := reg.rt
	for i, r := range rt.regs {
		if r == reg {
			rt.regs = append(rt.regs[:i], rt.regs[i+1:]...)
			break
		}
	}
	if len(rt.regs) > 0 {
		rt.cfg.Store(rt.regs[len(rt.regs)-1].cfg)
	} else {
		if d.routes[rt.scope] == rt {
			delete(d.routes, rt.scope)
		}
		d.stops.Add(1)
		go func() {
			defer d.stops.Done()
			rt.stop(d.grace)
		}()
	}
	d.mu.Unlock()
	queueScopes.remove(reg.cfg.scope, reg.qb)
}

// stop stops every route gracefully and waits for them.
func (d *dispatcher) stop() {
	d.mu.Lock()
	routes := d.routes
	d.routes = map[string]*route{}
	d.stopped = true
	for _, rt := range routes {
		d.stops.Add(1)
		go func() {
			defer d.stops.Done()
			rt.stop(d.grace)
		}()
	}
	d.mu.Unlock()
	d.stops.Wait()
	d.transport.CloseIdleConnections()
}

// kill stops every route the way a crash would: deliveries are cut off and
// nothing is settled or released; their leases expire by the database
// clock and another dispatcher takes the events back. For tests of the
// crash guarantees.
func (d *dispatcher) kill() {
	d.mu.Lock()
	routes := d.routes
	d.routes = map[string]*route{}
	d.stopped = true
	d.mu.Unlock()
	for _, rt := range routes {
		rt.kill()
	}
}

// poke wakes the route of a scope (work is due now).
func (d *dispatcher) poke(scope string) {
	d.mu.Lock()
	rt := d.routes[scope]
	d.mu.Unlock()
	if rt != nil {
		rt.poke()
	}
}

// routeConfig is what one handler config says about delivering its scope.
type routeConfig struct {
	scope          string
	target         *url.URL
	schedule       []time.Duration
	maxAttempts    int
	maxAge         time.Duration
	maxConcurrency int
	rate           int
	per            time.Duration
	lease          time.Duration
	timeout        time.Duration
	retention      time.Duration
	keepBody       time.Duration
	logger         *zap.Logger
	// attempts are the scope's queue_attempts_total series by outcome,
	// resolved at Provision (queueAttempts).
	attempts map[string]prometheus.Counter
}

// workers is how many deliveries this instance runs at once.
func (c *routeConfig) workers() int {
	if c.maxConcurrency > 0 {
		return c.maxConcurrency
	}
	return defaultWorkers
}

// backoff is the delay after the round's attempt n failed: the schedule's
// nth entry (the last one repeats), ±20% jitter.
func (c *routeConfig) backoff(n int) time.Duration {
	i := min(max(n-1, 0), len(c.schedule)-1)
	d := float64(c.schedule[i]) * (1 - jitter + 2*jitter*rand.Float64()) //nolint:gosec // jitter needs no crypto
	return time.Duration(d)
}

// urlFor is where an event received at uri is delivered.
func (c *routeConfig) urlFor(uri string) string {
	if c.target.Path == "" || c.target.Path == "/" {
		if c.target.RawQuery == "" {
			u := *c.target
			u.Path, u.RawPath, u.RawQuery = "", "", ""
			return u.String() + uri
		}
	}
	return c.target.String()
}

// route delivers one scope's events.
type route struct {
	d     *dispatcher
	scope string
	regs  []*registration // guarded by d.mu
	cfg   atomic.Pointer[routeConfig]

	wake     chan struct{}
	quit     chan struct{}
	quitOnce sync.Once
	loopDone chan struct{}
	// lctx ends the loop's and the maintenance's store calls at stop.
	lctx    context.Context
	lcancel context.CancelFunc
	// dctx is the deliveries' parent: cancelled with errShutdown after the
	// grace period, or errKilled.
	dctx     context.Context
	dcancel  context.CancelCauseFunc
	active   sync.WaitGroup // deliveries
	bg       sync.WaitGroup // maintenance
	inflight atomic.Int32
	gauges   atomic.Bool // this instance has set the scope's gauges
}

func newRoute(d *dispatcher, cfg *routeConfig) *route {
	rt := &route{d: d, scope: cfg.scope, wake: make(chan struct{}, 1), quit: make(chan struct{}), loopDone: make(chan struct{})}
	rt.lctx, rt.lcancel = context.WithCancel(context.Background())
	rt.dctx, rt.dcancel = context.WithCancelCause(context.Background())
	rt.cfg.Store(cfg)
	return rt
}

func (rt *route) startLoop() {
	rt.bg.Add(1)
	go rt.maintain()
	go rt.run()
}

// poke wakes the loop without blocking.
func (rt *route) poke() {
	select {
	case rt.wake <- struct{}{}:
	default:
	}
}

func (rt *route) logger() *zap.Logger {
	if cfg := rt.cfg.Load(); cfg != nil && cfg.logger != nil {
		return cfg.logger
	}
	return rt.d.logger
}

// stop ends the loop, gives the deliveries in flight the grace period, then
// cancels the rest (their events are released back to the queue).
func (rt *route) stop(grace time.Duration) {
	rt.quitOnce.Do(func() { close(rt.quit) })
	rt.lcancel()
	<-rt.loopDone
	done := make(chan struct{})
	go func() {
		rt.active.Wait()
		close(done)
	}()
	t := time.NewTimer(grace)
	select {
	case <-done:
		t.Stop()
	case <-t.C:
		rt.dcancel(errShutdown)
		<-done
	}
	rt.dcancel(errShutdown)
	rt.bg.Wait()
	rt.dropGauges()
}

// kill ends the route like a crash (see dispatcher.kill).
func (rt *route) kill() {
	rt.dcancel(errKilled)
	rt.quitOnce.Do(func() { close(rt.quit) })
	rt.lcancel()
	<-rt.loopDone
	rt.active.Wait()
	rt.bg.Wait()
}

// run takes work while the route lives: as many events as it has free
// workers, within the caps the database enforces; it sleeps until work is
// due, a delivery ends, or this instance queues an event.
func (rt *route) run() {
	defer close(rt.loopDone)
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
			wait = idlePoll // a delivery's end wakes the loop
			continue
		}
		b, err := rt.d.q.Take(rt.lctx, queue.TakeParams{
			Scope: cfg.scope, Limit: free, MaxConcurrency: cfg.maxConcurrency, Rate: cfg.rate, Per: cfg.per,
			Lease: cfg.lease, MaxAttempts: cfg.maxAttempts, MaxAge: cfg.maxAge, Worker: rt.d.worker,
		})
		if err != nil {
			if rt.lctx.Err() != nil {
				return
			}
			failures++
			wait = min(errorPoll<<min(failures-1, 5), maxErrorPoll)
			rt.logger().Warn("taking queued events failed", zap.String("scope", cfg.scope),
				zap.Int("failures", failures), zap.Duration("retry_in", wait), zap.Error(err))
			continue
		}
		failures = 0
		if b.Lost > 0 {
			cfg.attempts[queue.AttemptLost].Add(float64(b.Lost))
			rt.logger().Warn("took back events whose dispatcher stopped mid-delivery; they may be delivered twice",
				zap.String("scope", cfg.scope), zap.Int("events", b.Lost), zap.Int("dead", b.LostDead))
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
			wait = busyPoll
		case b.RateLimited:
			wait = min(max(b.NextIn, 10*time.Millisecond), idlePoll)
		default:
			wait = idlePoll
			if b.NextIn > 0 && b.NextIn < wait {
				wait = b.NextIn
			}
		}
	}
}

func (rt *route) start(cfg *routeConfig, j queue.Job) {
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

// deliver makes one attempt, renewing the lease meanwhile, and settles it.
func (rt *route) deliver(cfg *routeConfig, j queue.Job) {
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

	cause := context.Cause(ctx)
	log := rt.logger()
	fields := []zap.Field{zap.String("scope", cfg.scope), zap.String("event_id", j.EventID), zap.Int("attempt", j.Attempt)}
	switch {
	case errors.Is(cause, errKilled):
		return // as a crash: nothing is settled
	case status == 0 && errors.Is(cause, errShutdown):
		sctx, scancel := context.WithTimeout(context.Background(), storeTimeout)
		err := rt.d.q.Release(sctx, j.ID, j.Token, j.Attempt)
		scancel()
		cfg.attempts[queue.AttemptReleased].Inc()
		if err != nil {
			log.Warn("handing a delivery back at shutdown failed; its lease will expire", append(fields, zap.Error(err))...)
		}
		return
	case errors.Is(cause, errLeaseLost) && errText == "":
		errText = "lease lost during the delivery"
	}

	delivered := status >= 200 && status < 300
	sctx, scancel := context.WithTimeout(context.Background(), storeTimeout)
	t0 := time.Now()
	state, err := rt.d.q.Settle(sctx, queue.Settlement{
		ID: j.ID, Token: j.Token, Attempt: j.Attempt, Status: status, Error: errText, Duration: dur,
		Delivered: delivered, RetryIn: cfg.backoff(j.RoundAttempts), MaxAttempts: cfg.maxAttempts, MaxAge: cfg.maxAge,
	})
	observe(metrics.storeTime.settleQueued, t0)
	scancel()
	fields = append(fields, zap.Int("status", status), zap.Duration("duration", dur))
	switch {
	case errors.Is(err, queue.ErrLeaseLost):
		cfg.attempts[attemptLeaseLost].Inc()
		log.Warn("queue lease lost before settling; the event may be delivered twice", fields...)
		return
	case err != nil:
		cfg.attempts[attemptSettleFailed].Inc()
		log.Warn("settling a delivery failed; its lease will expire and it will be delivered again",
			append(fields, zap.Error(err))...)
		return
	}
	outcome := queue.AttemptRetry
	switch state {
	case queue.StateDelivered:
		outcome = queue.AttemptDelivered
	case queue.StateDead:
		outcome = queue.AttemptDead
	}
	cfg.attempts[outcome].Inc()
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

// heartbeat renews the lease every third of it; a lost lease cancels the
// delivery (another dispatcher holds the event now).
func (rt *route) heartbeat(ctx context.Context, cancel context.CancelCauseFunc, cfg *routeConfig, j queue.Job, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	err := lease.Keep(ctx, stop, lease.Renewal{
		Lease: cfg.lease,
		Renew: func(ctx context.Context) error {
			defer observe(metrics.storeTime.heartbeatQueued, time.Now())
			return rt.d.q.Heartbeat(ctx, j.ID, j.Token, cfg.lease)
		},
		Lost:   queue.ErrLeaseLost,
		Logger: rt.logger(), Name: "queue lease",
		Fields: []zap.Field{zap.String("scope", cfg.scope), zap.String("event_id", j.EventID)},
	})
	if err != nil {
		cancel(errLeaseLost)
	}
}

// sendSafe is send, with a panic turned into a failed attempt (status 0),
// so the attempt is still settled and the dispatcher's goroutine, which no
// net/http server recovers, does not take the process down.
func (rt *route) sendSafe(ctx context.Context, cfg *routeConfig, j queue.Job) (status int, errText string) {
	defer func() {
		if p := recover(); p != nil {
			rt.logger().Error("delivery attempt panicked; settled as failed", zap.String("scope", cfg.scope),
				zap.String("event_id", j.EventID), zap.Any("panic", p))
			status, errText = 0, fmt.Sprintf("ambiguous (the delivery panicked): %v", p)
		}
	}()
	return rt.send(ctx, cfg, j)
}

// send makes the HTTP request: the stored method, headers and body, to
// deliver_to, bounded by forward_timeout. It returns the upstream's status
// (0 when there was no answer) and, unless 2xx, why the attempt failed.
func (rt *route) send(ctx context.Context, cfg *routeConfig, j queue.Job) (int, string) {
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, j.Request.Method, cfg.urlFor(j.Request.URI), bytes.NewReader(j.Request.Body))
	if err != nil {
		return 0, "building the request: " + err.Error()
	}
	req.Header = j.Request.Header.Clone()
	if req.Header == nil {
		req.Header = http.Header{}
	}
	req.ContentLength = int64(len(j.Request.Body))
	if len(j.Request.Body) == 0 {
		req.Body = http.NoBody
	}
	resp, err := rt.d.client.Do(req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return 0, "no answer within forward_timeout (" + cfg.timeout.String() + "; ambiguous: the upstream may have done the work)"
		}
		// Classified as in sync mode (proxyErrorAmbiguous); async mode
		// retries either way (at least once), the text tells operators
		// which attempts may have reached the upstream.
		if proxyErrorAmbiguous(err) {
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

// maintain refreshes the queue gauges and applies retention and keep_body
// to the scope until the route stops.
func (rt *route) maintain() {
	defer rt.bg.Done()
	stats := time.NewTicker(statsInterval)
	defer stats.Stop()
	sweep := time.NewTicker(retentionInterval)
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
	ctx, cancel := context.WithTimeout(rt.lctx, storeTimeout)
	defer cancel()
	st, err := rt.d.q.Stats(ctx, rt.scope)
	if err != nil {
		if rt.lctx.Err() == nil {
			rt.logger().Warn("counting queued events failed", zap.String("scope", rt.scope), zap.Error(err))
		}
		return
	}
	rt.gauges.Store(true)
	queueMetrics.depth.WithLabelValues(rt.scope, string(queue.StateQueued)).Set(float64(st.Queued))
	queueMetrics.depth.WithLabelValues(rt.scope, string(queue.StateDelivering)).Set(float64(st.Delivering))
	queueMetrics.dead.WithLabelValues(rt.scope).Set(float64(st.Dead))
	queueMetrics.oldest.WithLabelValues(rt.scope).Set(st.OldestAge.Seconds())
}

// dropGauges removes the scope's gauges once this instance no longer
// serves it, so they don't go stale.
func (rt *route) dropGauges() {
	if !rt.gauges.Load() {
		return
	}
	queueMetrics.depth.DeleteLabelValues(rt.scope, string(queue.StateQueued))
	queueMetrics.depth.DeleteLabelValues(rt.scope, string(queue.StateDelivering))
	queueMetrics.dead.DeleteLabelValues(rt.scope)
	queueMetrics.oldest.DeleteLabelValues(rt.scope)
}

// sweep deletes delivered and dead events older than retention and drops
// bodies older than keep_body, in bounded batches.
func (rt *route) sweep() {
	cfg := rt.cfg.Load()
	for range 100 { // at most 100 batches a tick
		ctx, cancel := context.WithTimeout(rt.lctx, storeTimeout)
		deleted, stripped, err := rt.d.q.Sweep(ctx, queue.SweepParams{
			Scope: cfg.scope, Retention: cfg.retention, KeepBody: cfg.keepBody, Limit: retentionBatch,
		})
		cancel()
		if err != nil {
			if rt.lctx.Err() == nil {
				rt.logger().Warn("queue retention sweep failed", zap.String("scope", cfg.scope), zap.Error(err))
			}
			return
		}
		if deleted < retentionBatch && stripped < retentionBatch {
			return
		}
	}
}
