package dispatch

import (
	"context"
	"math/rand/v2"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// jitter is the spread of a retry delay: ±20%.
const jitter = 0.2

// Route is what one handler config says about delivering its scope.
type Route struct {
	// Scope names the events delivered (the handler's scope).
	Scope string
	// Target is deliver_to: with no path (or "/") and no query the event's
	// own request URI is appended, as reverse_proxy does; otherwise Target
	// is used as is.
	Target *url.URL
	// Schedule is the delay before each retry (the last entry repeats);
	// each gets ±20% jitter. At least one entry.
	Schedule []time.Duration
	// MaxAttempts and MaxAge end a round of attempts: the event is dead.
	// 0: no limit.
	MaxAttempts int
	MaxAge      time.Duration
	// MaxConcurrency caps the scope's deliveries in flight across every
	// instance (enforced in the database), and is this instance's worker
	// count; 0: no cap, DefaultWorkers here.
	MaxConcurrency int
	// Rate caps attempts started in any window of Per across every
	// instance; 0: no cap.
	Rate int
	Per  time.Duration
	// Lease is how long a taken event stays held without a heartbeat; the
	// heartbeat renews it every third of it.
	Lease time.Duration
	// Timeout bounds one HTTP attempt (forward_timeout).
	Timeout time.Duration
	// Retention and KeepBody drive the maintenance sweep: delivered and
	// dead events older than Retention are deleted, bodies of delivered
	// events older than KeepBody dropped (0: kept until Retention).
	Retention time.Duration
	KeepBody  time.Duration
	// Logger, when set, receives this route's logs instead of Options.Logger.
	Logger *zap.Logger
	// CompleteByUpstream (complete_by upstream): each attempt carries the
	// header Webhook-Claim (store.QueueClaimValue of the taken event), the
	// upstream calls <table>_commit with it in the transaction of its work,
	// and the attempt is settled by what the queue row then says
	// (Queue.Conclude), whatever the HTTP exchange showed: an attempt whose
	// answer was lost after the upstream committed is delivered, not
	// retried.
	CompleteByUpstream bool
	// CommitWait bounds the wait for an upstream transaction still holding
	// the event when the attempt ends. Defaults to DefaultCommitWait.
	CommitWait time.Duration
}

// DefaultCommitWait is Route.CommitWait's default: an upstream transaction
// that called <table>_commit commits within it, or the attempt is left for
// its lease to expire (the next take then waits for that transaction).
const DefaultCommitWait = 30 * time.Second

// ClaimHeader is the header that carries an upstream-completed claim
// (complete_by upstream). Any copy arriving from outside is removed before
// a forward, on every route: the upstream trusts it.
const ClaimHeader = "Webhook-Claim"

// workers is how many deliveries this instance runs at once.
func (c *Route) workers() int {
	if c.MaxConcurrency > 0 {
		return c.MaxConcurrency
	}
	return DefaultWorkers
}

// backoff is the delay after the round's attempt n failed: the schedule's
// nth entry (the last one repeats), ±20% jitter.
func (c *Route) backoff(n int) time.Duration {
	i := min(max(n-1, 0), len(c.Schedule)-1)
	d := float64(c.Schedule[i]) * (1 - jitter + 2*jitter*rand.Float64()) //nolint:gosec // jitter needs no crypto
	return time.Duration(d)
}

// urlFor is where an event received at uri is delivered.
func (c *Route) urlFor(uri string) string {
	if (c.Target.Path == "" || c.Target.Path == "/") && c.Target.RawQuery == "" {
		u := *c.Target
		u.Path, u.RawPath, u.RawQuery = "", "", ""
		return u.String() + uri
	}
	return c.Target.String()
}

// route delivers one scope's events.
type route struct {
	d     *Dispatcher
	scope string
	// attempts are the scope's Attempts series by outcome.
	attempts map[string]prometheus.Counter
	regs     []*Registration // guarded by d.mu
	cfg      atomic.Pointer[Route]

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

func newRoute(d *Dispatcher, cfg *Route) *route {
	rt := &route{d: d, scope: cfg.Scope, attempts: d.opts.Metrics.attempts(cfg.Scope), wake: make(chan struct{}, 1), quit: make(chan struct{}), loopDone: make(chan struct{})}
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
	if cfg := rt.cfg.Load(); cfg != nil && cfg.Logger != nil {
		return cfg.Logger
	}
	return rt.d.opts.Logger
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

// kill ends the route like a crash (see Dispatcher.Kill).
func (rt *route) kill() {
	rt.dcancel(errKilled)
	rt.quitOnce.Do(func() { close(rt.quit) })
	rt.lcancel()
	<-rt.loopDone
	rt.active.Wait()
	rt.bg.Wait()
}
