// Package dispatch is the store-and-forward engine of async mode: it takes
// queued events from a queue.Queue and delivers them over HTTP to each
// scope's upstream, retrying with backoff until they are delivered or dead
// (README "Async mode (store-and-forward)").
//
// A Dispatcher runs one route per registered scope. Each route has a worker
// loop (worker.go) that takes due events within the caps the database
// enforces, deliveries (deliver.go) that each renew their lease while the
// upstream answers (heartbeat.go), and maintenance (maintain.go) that
// refreshes the queue gauges and applies retention and keep_body. Timings,
// metrics and the logger come from Options; the package keeps no state of
// its own, so it runs, and is tested, without Caddy.
package dispatch

import (
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
)

// Defaults of Options' timings.
const (
	// DefaultWorkers is how many deliveries of one scope an instance runs at
	// once when Route.MaxConcurrency does not say.
	DefaultWorkers = 16
	// DefaultIdlePoll is how often an idle route looks for work that another
	// instance queued (work queued on this instance wakes it at once, Poke).
	DefaultIdlePoll = time.Second
	// DefaultBusyPoll is how often a route whose MaxConcurrency is reached
	// (by all instances together) looks for a free slot.
	DefaultBusyPoll = 100 * time.Millisecond
	// DefaultErrorPoll is the first back-off after a failed take; it
	// doubles, up to DefaultMaxErrorPoll.
	DefaultErrorPoll    = time.Second
	DefaultMaxErrorPoll = 30 * time.Second
	// DefaultGrace is how long in-flight deliveries may finish when a route
	// or the dispatcher stops; then they are cancelled and their events
	// handed back to the queue.
	DefaultGrace = 10 * time.Second
	// DefaultStatsInterval is how often the queue gauges are refreshed.
	DefaultStatsInterval = 15 * time.Second
	// DefaultSweepInterval is how often retention and keep_body are applied.
	DefaultSweepInterval = 10 * time.Minute
	// DefaultSweepBatch is the most rows one sweep statement touches.
	DefaultSweepBatch = 1000
	// DefaultStoreTimeout bounds each queue call (take, settle, release,
	// stats, sweep).
	DefaultStoreTimeout = 5 * time.Second
)

// Options configure a Dispatcher. Zero values mean the defaults above.
type Options struct {
	// Logger receives the dispatcher's logs when a Route has none. Event
	// IDs, scopes, statuses and errors are logged; bodies and headers never.
	// Default: zap.NewNop().
	Logger *zap.Logger
	// Metrics are updated as events are delivered; nil fields are skipped.
	Metrics Metrics
	// Worker names this process in the attempts table. Default:
	// host/pid/random.
	Worker string
	// Client makes the deliveries. Default: a client that reaches the
	// upstream directly (no proxy) and never follows redirects (a redirect
	// is an answer other than 2xx: retried).
	Client *http.Client

	// Timings and the sweep's batch size; zero means the Default constant
	// of the same name (DefaultIdlePoll, ...).
	IdlePoll, BusyPoll      time.Duration
	ErrorPoll, MaxErrorPoll time.Duration
	Grace                   time.Duration
	StatsInterval           time.Duration
	SweepInterval           time.Duration
	SweepBatch              int
	StoreTimeout            time.Duration
}

func (o *Options) defaults() {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Worker == "" {
		host, _ := os.Hostname()
		var b [3]byte
		_, _ = crand.Read(b[:])
		o.Worker = fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	setDefault(&o.IdlePoll, DefaultIdlePoll)
	setDefault(&o.BusyPoll, DefaultBusyPoll)
	setDefault(&o.ErrorPoll, DefaultErrorPoll)
	setDefault(&o.MaxErrorPoll, DefaultMaxErrorPoll)
	setDefault(&o.Grace, DefaultGrace)
	setDefault(&o.StatsInterval, DefaultStatsInterval)
	setDefault(&o.SweepInterval, DefaultSweepInterval)
	setDefault(&o.StoreTimeout, DefaultStoreTimeout)
	if o.SweepBatch <= 0 {
		o.SweepBatch = DefaultSweepBatch
	}
}

func setDefault(d *time.Duration, def time.Duration) {
	if *d <= 0 {
		*d = def
	}
}

// Causes a delivery's context is cancelled with.
var (
	errShutdown  = errors.New("dispatcher stopping")
	errKilled    = errors.New("dispatcher killed")
	errLeaseLost = errors.New("queue lease lost")
)

// Dispatcher delivers the events of one queue: one route per registered
// scope. Every gateway instance runs one per queue; they share the work
// through the database. Safe for concurrent use.
type Dispatcher struct {
	q         queue.Queue
	opts      Options
	series    series
	client    *http.Client
	transport *http.Transport // ours, closed at Stop; nil with Options.Client
	grace     atomic.Int64    // time.Duration

	mu      sync.Mutex
	routes  map[string]*route
	stopped bool
	stops   sync.WaitGroup // routes stopping in the background
}

// New returns a dispatcher of q. It starts nothing until a route is
// registered.
func New(q queue.Queue, opts Options) *Dispatcher {
	opts.defaults()
	d := &Dispatcher{q: q, opts: opts, series: opts.Metrics.resolve(), client: opts.Client, routes: map[string]*route{}}
	if d.client == nil {
		d.transport = &http.Transport{
			Proxy:                 nil, // deliver_to is reached directly
			DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			ForceAttemptHTTP2:     true,
			MaxIdleConns:          100,
			MaxIdleConnsPerHost:   32,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
		}
		d.client = &http.Client{
			Transport: d.transport,
			// A redirect is an answer other than 2xx: retried, never followed
			// (following would turn the POST into a GET).
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	d.grace.Store(int64(opts.Grace))
	return d
}

// Worker is the name this dispatcher records in the attempts table.
func (d *Dispatcher) Worker() string { return d.opts.Worker }

// SetGrace changes how long in-flight deliveries may finish when a route or
// the dispatcher stops (Options.Grace).
func (d *Dispatcher) SetGrace(grace time.Duration) { d.grace.Store(int64(grace)) }

// Registration is one holder's claim on a scope's route (a handler config).
type Registration struct {
	rt  *route
	cfg *Route
}

// Register adds a route config for cfg.Scope and starts its route if it
// is not running. The newest registration of a scope is the one in force:
// after a config reload, the new config's. cfg must not change afterwards.
func (d *Dispatcher) Register(cfg *Route) *Registration {
	d.mu.Lock()
	defer d.mu.Unlock()
	rt := d.routes[cfg.Scope]
	if rt == nil {
		rt = newRoute(d, cfg)
		if !d.stopped {
			d.routes[cfg.Scope] = rt
			rt.startLoop()
		}
	}
	reg := &Registration{rt: rt, cfg: cfg}
	rt.regs = append(rt.regs, reg)
	rt.cfg.Store(cfg)
	return reg
}

// Unregister drops a registration; the config in force falls back to the
// newest remaining one, and a route without registrations stops in the
// background (Stop waits for it).
func (d *Dispatcher) Unregister(reg *Registration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	rt := reg.rt
	for i, r := range rt.regs {
		if r == reg {
			rt.regs = append(rt.regs[:i], rt.regs[i+1:]...)
			break
		}
	}
	if len(rt.regs) > 0 {
		rt.cfg.Store(rt.regs[len(rt.regs)-1].cfg)
		return
	}
	if d.routes[rt.scope] == rt {
		delete(d.routes, rt.scope)
	}
	d.stops.Add(1)
	go func() {
		defer d.stops.Done()
		rt.stop(time.Duration(d.grace.Load()))
	}()
}

// Poke wakes the route of a scope: work is due now (an event was queued or
// retried on this instance).
func (d *Dispatcher) Poke(scope string) {
	d.mu.Lock()
	rt := d.routes[scope]
	d.mu.Unlock()
	if rt != nil {
		rt.poke()
	}
}

// Poke wakes the registration's route.
func (r *Registration) Poke() { r.rt.poke() }

// RefreshStats sets the scope's queue gauges from the database now.
func (r *Registration) RefreshStats() { r.rt.refreshStats() }

// Stop stops every route gracefully and waits for them: deliveries in
// flight get the grace period, then are cancelled and handed back.
func (d *Dispatcher) Stop() {
	d.mu.Lock()
	routes := d.routes
	d.routes = map[string]*route{}
	d.stopped = true
	grace := time.Duration(d.grace.Load())
	for _, rt := range routes {
		d.stops.Add(1)
		go func() {
			defer d.stops.Done()
			rt.stop(grace)
		}()
	}
	d.mu.Unlock()
	d.stops.Wait()
	if d.transport != nil {
		d.transport.CloseIdleConnections()
	}
}

// Kill stops every route the way a crash would: deliveries are cut off and
// nothing is settled or released; their leases expire by the database
// clock and another dispatcher takes the events back. For tests of the
// crash guarantees.
func (d *Dispatcher) Kill() {
	d.mu.Lock()
	routes := d.routes
	d.routes = map[string]*route{}
	d.stopped = true
	d.mu.Unlock()
	for _, rt := range routes {
		rt.kill()
	}
}
