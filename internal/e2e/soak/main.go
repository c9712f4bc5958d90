// Command soak drives at least 200,000 Stripe-signed deliveries through two
// gateway processes sharing one PostgreSQL database, in front of an upstream
// that fails 10% of its calls at random (500), and checks what the gateway
// promises: every event that the provider saw answered 2xx reached the
// upstream successfully exactly once, every event eventually does (failed
// deliveries are redelivered like a provider would), no row is left
// processing, and the gateways' memory stays flat.
//
// The traffic is a mix of new events, concurrent duplicates (bursts of up to
// four deliveries of one event over both gateways at once), provider retries
// after a failure, redeliveries after success, and late redeliveries of
// events completed long before.
//
//	make soak                    # or:
//	go run ./internal/e2e/soak -deliveries 200000 -workers 16
//
// It prints the figures and exits non-zero on any violation. PostgreSQL is
// $TEST_DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test); the
// run creates database e2e_soak_<random> and drops it at the end.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

func main() {
	os.Exit(run())
}

// Delivery kinds, for the report.
const (
	kindFirst     = "first delivery"
	kindBurst     = "concurrent duplicate"
	kindRetry     = "retry after failure"
	kindDuplicate = "redelivery after success"
	kindLate      = "late redelivery"
)

type config struct {
	deliveries int
	workers    int
	failRate   float64
	lease      time.Duration
	keep       bool
	timeout    time.Duration
	rssBound   float64
	rssSlackMB int64
}

// event is what the provider knows about one event.
type event struct {
	gotOK     bool // some delivery was answered 2xx
	forwarded int  // deliveries answered with the upstream's own 2xx
	sent      int
}

type soak struct {
	cfg    config
	secret string
	gws    []*e2e.Gateway
	up     *e2e.Upstream
	client *http.Client

	sent     atomic.Int64
	injected atomic.Int64 // 500s the upstream was told to give

	mu         sync.Mutex
	events     map[string]*event
	completed  []string // events that got a 2xx, for late redeliveries
	byStatus   map[string]int
	byKind     map[string]int
	violations []string
}

func run() int {
	var cfg config
	flag.IntVar(&cfg.deliveries, "deliveries", 200_000, "deliveries to send, at least")
	flag.IntVar(&cfg.workers, "workers", 16, "concurrent provider workers")
	flag.Float64Var(&cfg.failRate, "fail", 0.10, "share of upstream calls answered 500")
	flag.DurationVar(&cfg.lease, "lease", 10*time.Second, "the gateways' lease")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the temp dir (Caddyfiles, logs) and the database")
	flag.DurationVar(&cfg.timeout, "timeout", 30*time.Minute, "give up after this long")
	flag.Float64Var(&cfg.rssBound, "rss-growth", 0.25, "largest RSS growth allowed from the start sample to the end sample, as a share of the start sample")
	flag.Int64Var(&cfg.rssSlackMB, "rss-slack", 16, "MiB of RSS growth always allowed on top of -rss-growth")
	flag.Parse()

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, cfg.timeout)
	defer cancelT()

	s := &soak{
		cfg:      cfg,
		secret:   e2e.NewSecret(),
		client:   e2e.NewClient(cfg.workers*4, 30*time.Second),
		events:   map[string]*event{},
		byStatus: map[string]int{},
		byKind:   map[string]int{},
	}
	if err := s.main(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 2
	}
	if len(s.violations) > 0 {
		fmt.Printf("FAIL: %d violation(s)\n", len(s.violations))
		for i, v := range s.violations {
			if i == 20 {
				fmt.Printf("  ... and %d more\n", len(s.violations)-20)
				break
			}
			fmt.Println("  " + v)
		}
		return 1
	}
	fmt.Println("PASS: no violation")
	return 0
}

func (s *soak) violate(format string, args ...any) {
	s.mu.Lock()
	s.violations = append(s.violations, fmt.Sprintf(format, args...))
	s.mu.Unlock()
}

func (s *soak) main(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "e2e-soak-")
	if err != nil {
		return err
	}
	if s.cfg.keep {
		fmt.Println("soak: keeping", dir)
	} else {
		defer os.RemoveAll(dir)
	}

	fmt.Println("soak: building ./xcaddy ...")
	bin, err := e2e.BuildCaddy(ctx, dir)
	if err != nil {
		return err
	}
	db, err := e2e.CreateDatabase(ctx, e2e.AdminDSN(), "e2e_soak")
	if err != nil {
		return err
	}
	if s.cfg.keep {
		fmt.Println("soak: keeping database", db.Name)
	} else {
		defer func() {
			dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := db.Drop(dctx); err != nil {
				fmt.Fprintln(os.Stderr, "soak: dropping database:", err)
			}
		}()
	}

	s.up, err = e2e.NewUpstream(func(string, int) e2e.Answer {
		if rand.Float64() < s.cfg.failRate {
			s.injected.Add(1)
			return e2e.Answer{Status: http.StatusInternalServerError}
		}
		// A quick application: up to 2ms of work per call.
		return e2e.Answer{Delay: time.Duration(rand.IntN(2000)) * time.Microsecond}
	})
	if err != nil {
		return err
	}
	defer s.up.Close()

	for _, name := range []string{"a", "b"} {
		g, err := e2e.StartGateway(e2e.GatewayConfig{
			Binary:   bin,
			Dir:      dir,
			Name:     name,
			Upstream: s.up.Addr(),
			Handler:  e2e.StripeHandler(s.secret, db.DSN, "lease "+s.cfg.lease.String()),
			LogLevel: "WARN", // no line per delivery
		})
		if err != nil {
			return err
		}
		defer g.Kill()
		s.gws = append(s.gws, g)
	}
	fmt.Printf("soak: gateways a (pid %d, %s) and b (pid %d, %s) on database %s; upstream fails %.0f%% at random; %d workers\n",
		s.gws[0].PID(), s.gws[0].Addr, s.gws[1].PID(), s.gws[1].Addr, db.Name, s.cfg.failRate*100, s.cfg.workers)

	// RSS samples: idle (before any delivery), start (after 10% of the
	// deliveries, warmed up), middle (50%), end (100%).
	marks := []struct {
		name string
		at   int64
	}{{"start", int64(s.cfg.deliveries) / 10}, {"middle", int64(s.cfg.deliveries) / 2}}
	rss := map[string][]int64{}
	fds := map[string][]int{}
	sample := func(name string) {
		for _, g := range s.gws {
			v, err := g.RSS()
			if err != nil {
				s.violate("reading RSS of gateway %s: %v", g.Name, err)
			}
			rss[name] = append(rss[name], v)
			n, _ := g.OpenFiles()
			fds[name] = append(fds[name], n)
		}
	}
	sample("idle")

	began := time.Now()
	var wg sync.WaitGroup
	for w := range s.cfg.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.worker(ctx, rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano()))))
		}()
	}
	workersDone := make(chan struct{})
	go func() { wg.Wait(); close(workersDone) }()
	progress := time.NewTicker(10 * time.Second)
	defer progress.Stop()
	for next := 0; ; {
		select {
		case <-workersDone:
		case <-progress.C:
			fmt.Printf("soak: %d deliveries after %s\n", s.sent.Load(), time.Since(began).Round(time.Second))
			continue
		case <-time.After(100 * time.Millisecond):
			if next < len(marks) && s.sent.Load() >= marks[next].at {
				sample(marks[next].name)
				next++
			}
			continue
		}
		break
	}
	elapsed := time.Since(began)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("interrupted after %d deliveries: %w", s.sent.Load(), err)
	}
	for _, m := range marks {
		if _, ok := rss[m.name]; !ok {
			sample(m.name)
		}
	}
	sample("end")
	for _, g := range s.gws {
		if g.Exited() {
			s.violate("gateway %s exited during the soak; log:\n%s", g.Name, g.LogTail(20))
		}
	}

	return s.report(ctx, db, elapsed, rss, fds)
}

// worker plays a provider: new events, each delivered in a burst, retried
// until a 2xx, then redelivered a few times; now and then a late
// redelivery of an event completed earlier.
func (s *soak) worker(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil && s.sent.Load() < int64(s.cfg.deliveries) {
		id := e2e.NewEventID()
		s.mu.Lock()
		s.events[id] = &event{}
		s.mu.Unlock()

		// A burst of 1-4 deliveries at once, spread over both gateways.
		burst := 1 + rng.IntN(4)
		var wg sync.WaitGroup
		for i := range burst {
			kind := kindFirst
			if i > 0 {
				kind = kindBurst
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.deliver(ctx, (i+rng.IntN(2))%2, id, kind)
			}()
		}
		wg.Wait()

		// Retries until a 2xx, as a provider does (with far shorter waits).
		for attempt := 0; !s.gotOK(id); attempt++ {
			if attempt == 200 || ctx.Err() != nil {
				s.violate("event %s: no 2xx after %d retries", id, attempt)
				break
			}
			time.Sleep(time.Duration(1+rng.IntN(20)) * time.Millisecond)
			s.deliver(ctx, rng.IntN(2), id, kindRetry)
		}
		for range rng.IntN(3) {
			r := s.deliver(ctx, rng.IntN(2), id, kindDuplicate)
			if r.Status != 0 && !(r.Status == 200 && r.Replayed) && r.Status != 409 {
				s.violate("event %s: redelivery after success answered %d (replayed %v)", id, r.Status, r.Replayed)
			}
		}
		s.mu.Lock()
		late := len(s.completed) > 0 && rng.IntN(5) == 0
		old := ""
		if late {
			old = s.completed[rng.IntN(len(s.completed))]
		}
		s.mu.Unlock()
		if late {
			r := s.deliver(ctx, rng.IntN(2), old, kindLate)
			if r.Status != 0 && !(r.Status == 200 && r.Replayed) {
				s.violate("event %s: late redelivery answered %d (replayed %v)", old, r.Status, r.Replayed)
			}
		}
	}
}

func (s *soak) gotOK(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.events[id].gotOK
}

// deliver sends one delivery and accounts for its answer. Status is 0 on a
// transport error.
func (s *soak) deliver(ctx context.Context, gw int, id, kind string) e2e.Result {
	s.sent.Add(1)
	r, err := e2e.Deliver(ctx, s.client, s.gws[gw].URL(), s.secret, id)
	key := fmt.Sprint(r.Status)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			s.violate("event %s via %s: transport error: %v", id, s.gws[gw].Name, err)
		}
		r.Status, key = 0, "transport error"
	case r.Forwarded():
		key += " forwarded"
	case r.Replayed:
		key += " replayed"
		if r.Status != 200 || strings.TrimSpace(r.Body) != `{"received":true,"duplicate":true}` {
			s.violate("event %s: duplicate answered %d %q", id, r.Status, r.Body)
		}
	case r.Status == 409:
		if r.RetryAfterSeconds() < 1 {
			s.violate("event %s: 409 without Retry-After", id)
		}
	case r.Status == 500: // the upstream's injected failure, passed on
	default:
		s.violate("event %s via %s: unexpected answer %d %s", id, s.gws[gw].Name, r.Status, r.Body)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byStatus[key]++
	s.byKind[kind]++
	ev := s.events[id]
	ev.sent++
	if r.Forwarded() {
		ev.forwarded++
	}
	if r.OK() && !ev.gotOK {
		ev.gotOK = true
		s.completed = append(s.completed, id)
	}
	return r
}

func (s *soak) report(ctx context.Context, db *e2e.Database, elapsed time.Duration, rss map[string][]int64, fds map[string][]int) error {
	sent := s.sent.Load()
	fmt.Printf("\n== soak figures\n")
	fmt.Printf("deliveries sent: %d in %s (%.0f/s)\n", sent, elapsed.Round(time.Second), float64(sent)/elapsed.Seconds())
	fmt.Printf("  by status: %s\n", counts(s.byStatus))
	fmt.Printf("  by kind:   %s\n", counts(s.byKind))

	// Every forward has settled before the gateways answered, or is about
	// to: wait (at most a lease and a bit) for the last settles to land.
	var states map[string]int
	var err error
	for deadline := time.Now().Add(s.cfg.lease + 5*time.Second); ; time.Sleep(250 * time.Millisecond) {
		states, err = db.CountByState(ctx, "")
		if err != nil {
			return err
		}
		if states["processing"] == 0 || time.Now().After(deadline) {
			break
		}
	}
	rows, err := db.Rows(ctx, "", "stripe")
	if err != nil {
		return err
	}

	calls := s.up.Snapshot()
	var totalCalls, successes, failures, aborted int
	perEvent := map[int]int{} // upstream successes per event -> events
	lost, forwardedTwice := 0, 0
	for id, ev := range s.events {
		cs := calls[id]
		n := 0
		for _, c := range cs {
			switch {
			case c.Success():
				n++
			case c.Status == 0:
				aborted++
			default:
				failures++
			}
		}
		totalCalls += len(cs)
		successes += n
		perEvent[n]++
		if !ev.gotOK {
			lost++
			s.violate("event %s: never answered 2xx (%d deliveries)", id, ev.sent)
		}
		if n != 1 {
			s.violate("event %s: %d upstream successes, want exactly 1 (%d deliveries, %d calls)", id, n, ev.sent, len(cs))
		}
		if ev.forwarded > 1 {
			forwardedTwice++
			s.violate("event %s: the provider got the upstream's 2xx %d times", id, ev.forwarded)
		}
		row, ok := rows[id]
		switch {
		case !ok:
			s.violate("event %s: no row", id)
		case row.State != "completed":
			s.violate("event %s: row %s, want completed", id, row.State)
		case row.Attempts < len(cs):
			s.violate("event %s: %d upstream calls but %d claims", id, len(cs), row.Attempts)
		}
	}
	for id := range calls {
		if _, ok := s.events[id]; !ok {
			s.violate("upstream called for unknown event %q", id)
		}
	}
	fmt.Printf("redeliveries (deliveries of an event already sent): %d\n", sent-int64(len(s.events)))
	fmt.Printf("events: %d; answered 2xx: %d; never answered 2xx (lost): %d\n", len(s.events), len(s.events)-lost, lost)
	fmt.Printf("upstream: %d calls: %d successes, %d injected failures (500), %d abandoned\n",
		totalCalls, successes, failures, aborted)
	fmt.Printf("upstream successes per event: %s (must be exactly 1 for every event)\n", intCounts(perEvent))
	fmt.Printf("events whose provider saw the upstream's 2xx more than once: %d\n", forwardedTwice)
	fmt.Printf("rows by state: %s; stuck in processing: %d\n", counts(states), states["processing"])
	if states["processing"] != 0 {
		s.violate("%d rows stuck in processing", states["processing"])
	}
	if len(rows) != len(s.events) {
		s.violate("%d rows for %d events", len(rows), len(s.events))
	}
	if int64(failures) != s.injected.Load() {
		s.violate("upstream injected %d failures but recorded %d", s.injected.Load(), failures)
	}

	const mib = 1 << 20
	fmt.Printf("memory (VmRSS from /proc/<pid>/status), bound: end <= start + %.0f%% + %d MiB\n", s.cfg.rssBound*100, s.cfg.rssSlackMB)
	for i, g := range s.gws {
		at := func(k string) float64 { return float64(rss[k][i]) / mib }
		fmt.Printf("  gateway %s: idle %.1f MiB, start %.1f MiB, middle %.1f MiB, end %.1f MiB (open fds %d, %d, %d, %d)\n",
			g.Name, at("idle"), at("start"), at("middle"), at("end"), fds["idle"][i], fds["start"][i], fds["middle"][i], fds["end"][i])
		limit := float64(rss["start"][i])*(1+s.cfg.rssBound) + float64(s.cfg.rssSlackMB*mib)
		if float64(rss["end"][i]) > limit || float64(rss["middle"][i]) > limit {
			s.violate("gateway %s: RSS grew from %.1f MiB (start) to %.1f (middle), %.1f MiB (end); bound %.1f MiB",
				g.Name, at("start"), at("middle"), at("end"), limit/mib)
		}
	}
	return nil
}

func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s: %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func intCounts(m map[int]int) string {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d success(es): %d events", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
