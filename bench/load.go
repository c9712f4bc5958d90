package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	vegeta "github.com/tsenart/vegeta/v12/lib"

	pgqueue "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue/postgres"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// benchTable is the events table of the load scenarios, beforeTable the
// one of the -caddy-before gateways (the two binaries' migrations may
// differ); dropped at the end.
const (
	benchTable  = "bench_events"
	beforeTable = "bench_events_before"
)

// scenario is one configuration under load.
type scenario struct {
	name string
	// route is the site's Caddyfile route; empty for store-limit.
	route func(up string, round int) string
	// dup: redeliveries of completed events; the events are completed
	// through the same gateway before the warm-up.
	dup bool
	// async: mode async; deliveries are answered once queued.
	async bool
	// bin is the Caddy binary; empty: -caddy.
	bin string
}

// asyncTable is the events table of async/ack (its queue tables are
// <asyncTable>_queue and _attempts), asyncBeforeTable async/ack@before's;
// dropped at the end.
const (
	asyncTable       = "bench_async"
	asyncBeforeTable = "bench_async_before"
)

// slowUpstreamDelay is how long the upstream that async/ack's dispatcher
// delivers to takes per event: the slow legacy handler async mode is for.
const slowUpstreamDelay = 2 * time.Second

// slowUpstreamAddr is that upstream's address, set by runLoad.
var slowUpstreamAddr string

func scenarios(c config) []scenario {
	gateway := func(storage, extra string) func(string, int) string {
		return func(up string, round int) string {
			st := strings.ReplaceAll(storage, "{round}", fmt.Sprint(round))
			return fmt.Sprintf("webhook_idempotency {\n\tprovider stripe\n\tsecret %s\n\t%s\n%s}\nreverse_proxy %s",
				secret, st, extra, up)
		}
	}
	pg := fmt.Sprintf("storage postgres %q\n\ttable %s", c.dsn, benchTable)
	async := func(table string) func(string, int) string {
		return func(up string, _ int) string {
			return fmt.Sprintf("webhook_idempotency {\n\tprovider stripe\n\tsecret %s\n\tstorage postgres %q\n\ttable %s\n"+
				"\tmode async\n\tdeliver_to http://%s\n}\nreverse_proxy %s", secret, c.dsn, table, slowUpstreamAddr, up)
		}
	}
	sq := "storage sqlite " + filepath.Join(c.workdir, "sqlite-{round}", "events.db")
	all := []scenario{
		{name: "respond", route: func(string, int) string { return "respond `{\"ok\":true}` 200" }},
		{name: "proxy", route: func(up string, _ int) string { return "reverse_proxy " + up }},
		{name: "store-limit"},
		{name: "new/postgres", route: gateway(pg, "")},
		// complete_by upstream: the upstream calls the commit function in a
		// transaction before it answers, and the gateway reads the claim's
		// truth after the forward (its own transaction, unbatched).
		{name: "new/postgres+upstream", route: gateway(pg, "\tcomplete_by upstream\n")},
		{name: "new/sqlite", route: gateway(sq, "")},
		{name: "dup/cached", route: gateway(pg, ""), dup: true},
		{name: "dup/store", route: gateway(pg, "\tcache 0\n"), dup: true},
		{name: "async/ack", async: true, route: async(asyncTable)},
	}
	if c.caddyBefore != "" {
		pg := fmt.Sprintf("storage postgres %q\n\ttable %s", c.dsn, beforeTable)
		sqBefore := "storage sqlite " + filepath.Join(c.workdir, "sqlite-before-{round}", "events.db")
		all = append(all,
			scenario{name: "new/postgres" + before, route: gateway(pg, ""), bin: c.caddyBefore},
			scenario{name: "new/sqlite" + before, route: gateway(sqBefore, ""), bin: c.caddyBefore},
			scenario{name: "dup/store" + before, route: gateway(pg, "\tcache 0\n"), dup: true, bin: c.caddyBefore},
			scenario{name: "dup/cached" + before, route: gateway(pg, ""), dup: true, bin: c.caddyBefore},
			// Its own tables: the two binaries' queue migrations may differ.
			scenario{name: "async/ack" + before, async: true, route: async(asyncBeforeTable), bin: c.caddyBefore})
	}
	return all
}

// before suffixes the scenarios run with -caddy-before.
const before = "@before"

// groupsOf are the groups of a run: with -caddy-before, each before
// scenario joins its own scenario's group.
func groupsOf(c config) [][]string {
	if c.caddyBefore == "" {
		return groups
	}
	return [][]string{
		append(slices.Clone(groups[0]), "dup/cached"+before, "dup/store"+before, "async/ack"+before),
		append(slices.Clone(groups[1]), "new/postgres"+before, "new/sqlite"+before),
	}
}

// LoadReport is the JSON of a load run.
type LoadReport struct {
	Started  time.Time      `json:"started"`
	Command  string         `json:"command"`
	Machine  MachineInfo    `json:"machine"`
	Settings map[string]any `json:"settings"`
	Runs     []Result       `json:"runs"`
	// Summary is each scenario over all its slices.
	Summary map[string]Result  `json:"summary"`
	Ratios  map[string]float64 `json:"ratios"`
	// RoundRatios are the ratios of each round's own runs.
	RoundRatios map[string][]float64 `json:"ratios_by_round"`
	Targets     map[string]string    `json:"targets"`
	// BatchSizes is each gateway's caddy_webhook_idempotency_store_batch_size
	// at the end of its group (warm-up and priming included), as exposed:
	// read through the admin API, so only with -pprof.
	BatchSizes map[string][]string `json:"batch_sizes,omitempty"`
}

// MachineInfo says what the numbers were measured on.
type MachineInfo struct {
	CPUs          int    `json:"cpus"`
	CPUModel      string `json:"cpu_model"`
	LoadBefore    string `json:"loadavg_before"`
	LoadAfter     string `json:"loadavg_after"`
	GoVersion     string `json:"go_version"`
	Postgres      string `json:"postgres"`
	SyncCommit    string `json:"synchronous_commit"`
	PostgresFsync string `json:"fsync"`
}

func machineInfo(ctx context.Context, st *postgres.Store) MachineInfo {
	m := MachineInfo{CPUs: runtime.NumCPU(), LoadBefore: loadavg(), GoVersion: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if st != nil {
		_ = st.Pool().QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('synchronous_commit'), current_setting('fsync')`).
			Scan(&m.Postgres, &m.SyncCommit, &m.PostgresFsync)
	}
	return m
}

func runLoad(ctx context.Context, c config) (*LoadReport, error) {
	if _, err := os.Stat(c.caddyBin); err != nil {
		return nil, fmt.Errorf("%s: %w (build it: go build -o bin/caddy ./xcaddy)", c.caddyBin, err)
	}
	p, err := loadPayload("examples/payloads/stripe_payment_intent_succeeded.json")
	if err != nil {
		return nil, err
	}
	// The store-limit scenario's store, opened like the gateway opens its own
	// (same package, same default pool size), which also creates the table.
	octx, cancel := context.WithTimeout(ctx, time.Minute)
	// Batching off: store-limit stays the one-at-a-time ceiling (a claim,
	// then a complete, each its own statement and commit) that serial is
	// defined by.
	st, err := postgres.New(octx, postgres.Options{DSN: c.dsn, Table: benchTable,
		Batch: store.BatchOptions{Disabled: true}})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("store-limit needs PostgreSQL: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		dropEventTables(dctx, st, benchTable)
		_ = st.Close()
	}()
	if _, err := st.Pool().Exec(ctx, `TRUNCATE `+benchTable); err != nil {
		return nil, fmt.Errorf("emptying %s: %w", benchTable, err)
	}
	trackPostgres(st)

	up, upAddr, err := startUpstream(ctx, 0, c.dsn, benchTable+"_commit")
	if err != nil {
		return nil, err
	}
	defer up.stop()
	slow, slowAddr, err := startUpstream(ctx, slowUpstreamDelay, "", "")
	if err != nil {
		return nil, err
	}
	defer slow.stop()
	slowUpstreamAddr = slowAddr
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, t := range []string{asyncTable, asyncBeforeTable, beforeTable} {
			dropEventTables(dctx, st, t)
		}
	}()

	slice := c.duration / time.Duration(c.rounds)
	rep := &LoadReport{
		Started: time.Now().UTC(),
		Command: strings.Join(os.Args, " "),
		Machine: machineInfo(ctx, st),
		Settings: map[string]any{
			"workers": c.workers, "duration": c.duration.String(), "warmup": c.warmup.String(),
			"rounds": c.rounds, "slice": slice.String(), "dup_events": c.dupEvents,
			"payload_bytes": len(p.body(newIDs().next())), "pool_max_conns": st.Pool().Config().MaxConns,
			"caddy_processes": "one per scenario, alive for its group",
			"groups":          groupsOf(c),
			"caddy_before":    c.caddyBefore,
		},
		Summary: map[string]Result{},
	}
	g := newIDs()
	byName := map[string]scenario{}
	for _, sc := range scenarios(c) {
		byName[sc.name] = sc
	}
	fmt.Printf("load: %d workers; per scenario %s warm-up, then %d slices of %s interleaved with the others of its group; loadavg %s\n",
		c.workers, c.warmup, c.rounds, slice, loadavg())
	for _, group := range groupsOf(c) {
		var runners []*runner
		for _, name := range group {
			if c.only == nil || c.only[name] {
				runners = append(runners, &runner{sc: byName[name], total: newCollector()})
			}
		}
		if len(runners) == 0 {
			continue
		}
		err := runGroup(ctx, c, runners, st, p, g, up, upAddr, slice, rep)
		for _, r := range runners {
			r.gw.stop()
		}
		if err != nil {
			return rep, err
		}
	}
	rep.Machine.LoadAfter = loadavg()
	rep.Ratios, rep.Targets = ratios(rep.Summary)
	// The same ratios within each round, to show how much they move.
	rep.RoundRatios = map[string][]float64{}
	for round := 1; round <= c.rounds; round++ {
		m := map[string]Result{}
		for _, r := range rep.Runs {
			if r.Round == round {
				m[r.Scenario] = r
			}
		}
		rr, _ := ratios(m)
		for k, v := range rr {
			rep.RoundRatios[k] = append(rep.RoundRatios[k], v)
		}
	}
	printTable(rep)
	return rep, nil
}

// groups are the scenarios compared with each other. The gateways of a
// group are all started first and then driven in turn, one slice each,
// round after round, so that a change in the machine's load (other
// processes) hits every scenario of a ratio alike, instead of whichever ran
// at that moment.
var groups = [][]string{
	{"respond", "dup/cached", "dup/store", "async/ack"},
	{"proxy", "store-limit", "new/postgres", "new/sqlite", "new/postgres+upstream"},
}

// runner is one scenario under load: its gateway, deliveries and client
// (whose connections are kept from slice to slice), and what it measured.
type runner struct {
	sc     scenario
	gw     *child
	url    string
	tr     vegeta.Targeter
	check  func(*vegeta.Result) error
	client *http.Client
	total  *collector
	cpu    []CPUShare
	oks    []int
}

func newClient(workers int) *http.Client {
	return &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: workers,
			MaxConnsPerHost:     workers,
			IdleConnTimeout:     time.Minute,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// runGroup starts, primes and warms every runner of a group, then measures
// them in interleaved slices.
func runGroup(ctx context.Context, c config, runners []*runner, st *postgres.Store, p payload, g *ids, up *child, upAddr string, slice time.Duration, rep *LoadReport) error {
	for _, r := range runners {
		r.client = newClient(c.workers)
		if r.sc.route == nil {
			continue // store-limit
		}
		cc := c
		if r.sc.bin != "" {
			cc.caddyBin = r.sc.bin
		}
		gw, url, err := startCaddy(ctx, cc, r.sc.name, r.sc.route(upAddr, 1))
		if err != nil {
			return err
		}
		r.gw, r.url = gw, url+"/webhooks/stripe"
		r.check = checkForwarded
		if r.sc.async {
			r.check = checkQueued
		}
		var fixed []string
		if r.sc.dup {
			r.check = checkDuplicate
			fixed = make([]string, c.dupEvents)
			for i := range fixed {
				fixed[i] = g.next()
			}
			// Complete every event once, through this gateway.
			prime := newCollector()
			attack(ctx, r.client, targeter(r.url, p, g, fixed, false), c.workers, 5*time.Minute, checkForwarded, prime)
			if prime.errors > 0 || prime.ok != len(fixed) {
				return fmt.Errorf("%s: completing %d events: %d ok, errors %v", r.sc.name, len(fixed), prime.ok, prime.kinds)
			}
		}
		r.tr = targeter(r.url, p, g, fixed, true)
	}
	for _, r := range runners {
		if c.warmup <= 0 {
			break
		}
		warm := newCollector()
		if err := r.run(ctx, c, st, g, c.warmup, warm); err != nil {
			return fmt.Errorf("%s: warm-up: %w", r.sc.name, err)
		}
		if warm.ok == 0 {
			return fmt.Errorf("%s: warm-up: no successful delivery: %v", r.sc.name, warm.kinds)
		}
	}
	defer func() {
		for _, r := range runners {
			if r.gw == nil {
				continue
			}
			if lines := r.gw.batchSizes(); len(lines) > 0 {
				if rep.BatchSizes == nil {
					rep.BatchSizes = map[string][]string{}
				}
				rep.BatchSizes[r.sc.name] = lines
			}
		}
	}()
	for round := 1; round <= c.rounds; round++ {
		for _, r := range runners {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			col := newCollector()
			gwPid := 0
			if r.gw != nil {
				gwPid = r.gw.pid()
			}
			meter := startCPU(gwPid, up.pid())
			var prof sync.WaitGroup
			if c.pprof && round == (c.rounds+1)/2 && r.gw != nil && slice >= 1500*time.Millisecond {
				prof.Add(1)
				go func() {
					defer prof.Done()
					if path, err := r.gw.profile(slice - 500*time.Millisecond); err != nil {
						fmt.Printf("  profile: %v\n", err)
					} else {
						fmt.Printf("  profile: %s\n", path)
					}
				}()
			}
			err := r.run(ctx, c, st, g, slice, col)
			res := col.result(r.sc.name, round)
			res.CPU = meter.stop(col.ok)
			prof.Wait()
			if err != nil {
				return fmt.Errorf("%s (round %d): %w", r.sc.name, round, err)
			}
			if r.gw != nil && r.gw.exited() {
				return fmt.Errorf("%s: caddy exited during the run: %s", r.sc.name, tail(r.gw.log))
			}
			r.total.merge(col)
			r.cpu = append(r.cpu, res.CPU)
			r.oks = append(r.oks, col.ok)
			rep.Runs = append(rep.Runs, res)
			fmt.Printf("  round %d %-13s %8.0f/s  p50 %7.2fms  p99 %7.2fms  errors %d  cpu: gw %.2f pg %.2f gen %.2f machine %.0f%%\n",
				round, r.sc.name, res.RPS, res.P50ms, res.P99ms, res.Errors, res.CPU.Gateway, res.CPU.Postgres, res.CPU.LoadGen, res.CPU.Machine*100)
		}
	}
	for _, r := range runners {
		sum := r.total.result(r.sc.name, 0)
		sum.CPU = meanCPU(r.cpu, r.oks)
		rep.Summary[r.sc.name] = sum
	}
	return nil
}

// run drives the scenario for du into col.
func (r *runner) run(ctx context.Context, c config, st *postgres.Store, g *ids, du time.Duration, col *collector) error {
	if r.sc.route == nil {
		return storeLimit(ctx, c, st, g, du, col)
	}
	attack(ctx, r.client, r.tr, c.workers, du, r.check, col)
	return nil
}

// meanCPU averages equal-length slices' CPU shares; the gateway's CPU per
// delivery is weighted by the deliveries of each slice.
func meanCPU(s []CPUShare, oks []int) CPUShare {
	var m CPUShare
	var w, n float64
	for i, x := range s {
		m.Gateway += x.Gateway
		m.Upstream += x.Upstream
		m.Postgres += x.Postgres
		m.LoadGen += x.LoadGen
		m.Machine += x.Machine
		m.GatewayMs += x.GatewayMs * float64(oks[i])
		m.UpstreamMs += x.UpstreamMs * float64(oks[i])
		m.PostgresMs += x.PostgresMs * float64(oks[i])
		m.PostgresBackendsMs += x.PostgresBackendsMs * float64(oks[i])
		m.PostgresBackgroundMs += x.PostgresBackgroundMs * float64(oks[i])
		for kind, ms := range x.PostgresByTypeMs {
			if m.PostgresByTypeMs == nil {
				m.PostgresByTypeMs = map[string]float64{}
			}
			m.PostgresByTypeMs[kind] += ms * float64(oks[i])
		}
		m.WALSyncsPerOp += x.WALSyncsPerOp * float64(oks[i])
		m.WALBytesPerOp += x.WALBytesPerOp * float64(oks[i])
		w += float64(oks[i])
		n++
	}
	if n > 0 {
		m.Gateway, m.Upstream, m.Postgres, m.LoadGen, m.Machine = m.Gateway/n, m.Upstream/n, m.Postgres/n, m.LoadGen/n, m.Machine/n
	}
	if w > 0 {
		m.GatewayMs /= w
		m.UpstreamMs /= w
		m.PostgresMs /= w
		m.PostgresBackendsMs /= w
		m.PostgresBackgroundMs /= w
		for kind := range m.PostgresByTypeMs {
			m.PostgresByTypeMs[kind] /= w
		}
		m.WALSyncsPerOp /= w
		m.WALBytesPerOp /= w
	}
	return m
}

var errReplayed = errors.New("answered as a duplicate, expected a forward")

// checkForwarded: the delivery reached the upstream (or respond) and was
// answered 200, not as a duplicate.
func checkForwarded(r *vegeta.Result) error {
	if r.Code != 200 {
		return fmt.Errorf("status %d: %.80s", r.Code, r.Body)
	}
	if r.Headers.Get("Idempotent-Replayed") != "" {
		return errReplayed
	}
	if string(r.Body) != `{"ok":true}` {
		return fmt.Errorf("unexpected body %.80q", r.Body)
	}
	return nil
}

// checkQueued: async mode acknowledged the delivery once it was queued.
func checkQueued(r *vegeta.Result) error {
	if r.Code != 200 {
		return fmt.Errorf("status %d: %.80s", r.Code, r.Body)
	}
	if !strings.Contains(string(r.Body), `"queued":true`) {
		return fmt.Errorf("unexpected body %.80q", r.Body)
	}
	return nil
}

// checkDuplicate: the delivery was answered 200 at the edge as a duplicate.
func checkDuplicate(r *vegeta.Result) error {
	if r.Code != 200 {
		return fmt.Errorf("status %d: %.80s", r.Code, r.Body)
	}
	if r.Headers.Get("Idempotent-Replayed") != "true" {
		return errors.New("forwarded, expected a duplicate answer")
	}
	return nil
}

// storeLimit issues the gateway's claim and complete statements for fresh
// event IDs straight through the postgres store, c.workers at a time, for
// du: the throughput the store allows a gateway, with no HTTP at all.
func storeLimit(ctx context.Context, c config, st *postgres.Store, g *ids, du time.Duration, col *collector) error {
	ctx, cancel := context.WithTimeout(ctx, du)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		fatal error
	)
	for range c.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				id := g.next()
				t0 := time.Now()
				err := claimComplete(ctx, st, id)
				lat := time.Since(t0)
				// Cut by the window's end: not a result. The clock, not
				// ctx.Err(): a statement's own deadline (the window's) can
				// fail it a moment before ctx's timer has marked ctx done.
				if d, _ := ctx.Deadline(); ctx.Err() != nil || !time.Now().Before(d) {
					return
				}
				mu.Lock()
				col.add(t0, lat, err)
				if err != nil && fatal == nil && col.errors > 100 {
					fatal = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return fatal
}

// dropEventTables drops an events table t and what its store and async
// mode's queue made next to it.
func dropEventTables(ctx context.Context, st *postgres.Store, t string) {
	if tbl, err := store.ParseTable(t); err == nil {
		_ = pgqueue.Drop(ctx, st.Pool(), tbl)
	}
}

// claimComplete is what the gateway asks of the store for a delivery that
// is forwarded and answered 2xx.
func claimComplete(ctx context.Context, st store.Store, id string) error {
	cl, err := st.Claim(ctx, store.ClaimParams{Scope: "stripe", EventID: id, Lease: 30 * time.Second})
	if err != nil {
		return err
	}
	if cl.Outcome != store.Claimed {
		return fmt.Errorf("claim: %s", cl.Outcome)
	}
	return st.Complete(ctx, "stripe", id, cl.Token, 200)
}

// limit is the verdict of a figure whose target is at most max.
func limit(v, max float64) string {
	ok := "met"
	if v > max {
		ok = "MISSED"
	}
	return fmt.Sprintf("%.0f (target ≤ %.0f): %s", v, max, ok)
}

// ratios computes the figures the issue asks for from the median runs.
func ratios(m map[string]Result) (map[string]float64, map[string]string) {
	r := map[string]float64{}
	div := func(name, a, b string) {
		if m[a].RPS > 0 && m[b].RPS > 0 {
			r[name] = m[a].RPS / m[b].RPS
		}
	}
	div("dup/cached ÷ respond", "dup/cached", "respond")
	div("dup/store ÷ respond", "dup/store", "respond")
	div("new/postgres ÷ proxy", "new/postgres", "proxy")
	div("new/sqlite ÷ proxy", "new/sqlite", "proxy")
	div("async/ack ÷ respond", "async/ack", "respond")
	div("dup/store"+before+" ÷ respond", "dup/store"+before, "respond")
	div("dup/cached"+before+" ÷ respond", "dup/cached"+before, "respond")
	div("new/postgres"+before+" ÷ proxy", "new/postgres"+before, "proxy")
	div("new/sqlite"+before+" ÷ proxy", "new/sqlite"+before, "proxy")
	div("new/postgres ÷ new/postgres"+before, "new/postgres", "new/postgres"+before)
	div("new/postgres+upstream ÷ new/postgres", "new/postgres+upstream", "new/postgres")
	div("new/sqlite ÷ new/sqlite"+before, "new/sqlite", "new/sqlite"+before)
	div("dup/store ÷ dup/store"+before, "dup/store", "dup/store"+before)
	div("async/ack ÷ async/ack"+before, "async/ack", "async/ack"+before)
	if px, sl := m["proxy"].RPS, m["store-limit"].RPS; px > 0 && sl > 0 {
		serial := 1 / (1/px + 1/sl)
		r["serial (rps)"] = serial
		if np := m["new/postgres"].RPS; np > 0 {
			r["new/postgres ÷ serial"] = np / serial
		}
		if np := m["new/postgres"+before].RPS; np > 0 {
			r["new/postgres"+before+" ÷ serial"] = np / serial
		}
	}
	targets := map[string]string{}
	verdict := func(name string, min float64) {
		if v, ok := r[name]; ok {
			ok := "met"
			if v < min {
				ok = "MISSED"
			}
			targets[name] = fmt.Sprintf("%.2f (target ≥ %.2f): %s", v, min, ok)
		}
	}
	verdict("dup/cached ÷ respond", 0.9)
	verdict("dup/store ÷ respond", 0.5)
	verdict("new/postgres ÷ proxy", 0.6)
	verdict("new/sqlite ÷ proxy", 0.65)
	verdict("new/postgres ÷ serial", 0.8)
	// CPU per new event: PostgreSQL's, and the gateway's beyond plain
	// reverse_proxy's (µs).
	for _, sfx := range []string{"", before} {
		np, px := m["new/postgres"+sfx], m["proxy"]
		if np.RPS == 0 || px.RPS == 0 {
			continue
		}
		pgk, gwk := "new/postgres"+sfx+" postgres CPU µs", "new/postgres"+sfx+" gateway CPU µs − proxy's"
		r[pgk] = np.CPU.PostgresMs * 1000
		r[pgk+": backends"] = np.CPU.PostgresBackendsMs * 1000
		r[pgk+": background"] = np.CPU.PostgresBackgroundMs * 1000
		r[gwk] = (np.CPU.GatewayMs - px.CPU.GatewayMs) * 1000
		if sfx == "" {
			targets[pgk] = limit(r[pgk], 40)
			targets[gwk] = limit(r[gwk], 35)
		}
	}
	return r, targets
}

// tableOrder is the order of the scenarios in the printed tables.
var tableOrder = []string{"respond", "proxy", "store-limit", "new/postgres", "new/postgres" + before,
	"new/postgres+upstream", "new/sqlite",
	"new/sqlite" + before, "dup/cached", "dup/cached" + before, "dup/store", "dup/store" + before, "async/ack", "async/ack" + before}

func printTable(rep *LoadReport) {
	fmt.Printf("\n%d workers; per scenario %s warm-up, then %s measured in %d slices of %s, interleaved within its group; loadavg before %s, after %s\n\n",
		rep.Settings["workers"], rep.Settings["warmup"], rep.Settings["duration"], rep.Settings["rounds"], rep.Settings["slice"],
		rep.Machine.LoadBefore, rep.Machine.LoadAfter)
	fmt.Println("| scenario | req/s | p50 ms | p99 ms | errors | CPU µs/req: gateway / upstream / postgres | postgres CPU µs/req: backends / background | CPU cores: gateway / upstream / postgres / load gen | machine busy | WAL flushes/req | WAL bytes/req |")
	fmt.Println("| --- | ---: | ---: | ---: | ---: | --- | --- | --- | ---: | ---: | ---: |")
	for _, sc := range tableOrder {
		r, ok := rep.Summary[sc]
		if !ok {
			continue
		}
		gwus := fmt.Sprintf("%.0f", r.CPU.GatewayMs*1000)
		if sc == "store-limit" {
			gwus = "–"
		}
		fmt.Printf("| %s | %.0f | %.2f | %.2f | %d | %s / %.0f / %.0f | %.0f / %.0f | %.2f / %.2f / %.2f / %.2f | %.0f%% | %.2f | %.0f |\n",
			sc, r.RPS, r.P50ms, r.P99ms, r.Errors, gwus, r.CPU.UpstreamMs*1000, r.CPU.PostgresMs*1000,
			r.CPU.PostgresBackendsMs*1000, r.CPU.PostgresBackgroundMs*1000,
			r.CPU.Gateway, r.CPU.Upstream, r.CPU.Postgres, r.CPU.LoadGen, r.CPU.Machine*100, r.CPU.WALSyncsPerOp, r.CPU.WALBytesPerOp)
	}
	printPostgresTypes(rep)
	fmt.Println()
	for _, k := range []string{"dup/cached ÷ respond", "dup/cached" + before + " ÷ respond", "dup/store ÷ respond", "dup/store" + before + " ÷ respond",
		"new/postgres ÷ proxy", "new/postgres" + before + " ÷ proxy", "new/sqlite ÷ proxy", "new/sqlite" + before + " ÷ proxy",
		"serial (rps)", "new/postgres ÷ serial", "new/postgres" + before + " ÷ serial",
		"new/postgres ÷ new/postgres" + before, "new/sqlite ÷ new/sqlite" + before, "dup/store ÷ dup/store" + before,
		"new/postgres+upstream ÷ new/postgres",
		"async/ack ÷ async/ack" + before,
		"new/postgres postgres CPU µs", "new/postgres" + before + " postgres CPU µs",
		"new/postgres postgres CPU µs: backends", "new/postgres" + before + " postgres CPU µs: backends",
		"new/postgres postgres CPU µs: background", "new/postgres" + before + " postgres CPU µs: background",
		"new/postgres gateway CPU µs − proxy's", "new/postgres" + before + " gateway CPU µs − proxy's"} {
		if v, ok := rep.Ratios[k]; ok {
			line := fmt.Sprintf("%-40s %.3f", k, v)
			if rs := rep.RoundRatios[k]; len(rs) > 1 {
				line += fmt.Sprintf("  (rounds: %.2f–%.2f)", slices.Min(rs), slices.Max(rs))
			}
			if t, ok := rep.Targets[k]; ok {
				line += "   " + t
			}
			fmt.Println(line)
		}
	}
}

// printPostgresTypes prints PostgreSQL's CPU per delivery by backend_type,
// the run's client backends first, for the scenarios that used it.
func printPostgresTypes(rep *LoadReport) {
	seen := map[string]bool{}
	var kinds []string
	for _, r := range rep.Summary {
		for k := range r.CPU.PostgresByTypeMs {
			if !seen[k] && k != clientBackend {
				seen[k] = true
				kinds = append(kinds, k)
			}
		}
	}
	if len(kinds) == 0 {
		return
	}
	slices.Sort(kinds)
	kinds = append([]string{clientBackend}, kinds...)
	fmt.Printf("\n| scenario | postgres CPU µs/req | %s |\n", strings.Join(kinds, " | "))
	fmt.Printf("| --- | ---:%s |\n", strings.Repeat(" | ---:", len(kinds)))
	for _, sc := range tableOrder {
		r, ok := rep.Summary[sc]
		if !ok || r.CPU.PostgresMs == 0 {
			continue
		}
		cells := make([]string, len(kinds))
		for i, k := range kinds {
			cells[i] = fmt.Sprintf("%.1f", r.CPU.PostgresByTypeMs[k]*1000)
		}
		fmt.Printf("| %s | %.0f | %s |\n", sc, r.CPU.PostgresMs*1000, strings.Join(cells, " | "))
	}
}

// trackPostgres points the CPU meter at the server processes that work for
// this run (see pgPIDs).
func trackPostgres(st *postgres.Store) {
	walCounters = func() (syncs, bytes float64) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = st.Pool().QueryRow(ctx, `SELECT wal_sync::float8, wal_bytes::float8 FROM pg_stat_wal`).Scan(&syncs, &bytes)
		return syncs, bytes
	}
	pgPIDs = func() map[int]string {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		rows, err := st.Pool().Query(ctx, `SELECT pid, coalesce(backend_type, '') FROM pg_stat_activity
			WHERE application_name = $1 OR backend_type <> 'client backend'`, appName)
		if err != nil {
			return nil
		}
		out := map[int]string{}
		var (
			pid  int32
			kind string
		)
		if _, err := pgx.ForEachRow(rows, []any{&pid, &kind}, func() error {
			out[int(pid)] = kind
			return nil
		}); err != nil {
			return nil
		}
		return out
	}
}
