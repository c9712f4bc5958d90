package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// SweepReport is what -mode sweep measured: claim latency at a fixed rate
// while the retention sweep of sweep-rows expired rows runs (store.Sweep,
// the gateway's batches and rests) and between its runs, in interleaved
// windows, then a route taking
// sweep-events new events per second with retention sweep-retention for
// sweep-steady, its row count sampled.
type SweepReport struct {
	Started  time.Time   `json:"started"`
	Command  string      `json:"command"`
	Machine  MachineInfo `json:"machine"`
	Expired  int         `json:"expired_rows"`
	LoadSecs float64     `json:"load_seconds"`

	ClaimRate int `json:"claim_rate_per_sec"`
	// Claims started while the sweep ran, and while it rested (the
	// interleaved windows between), on the same table.
	DuringSweep SweepLatency `json:"during_sweep"`
	IdleBefore  SweepLatency `json:"between_sweeps"`
	SweepSecs   float64      `json:"sweep_seconds"`
	SweepRows   int          `json:"sweep_rows"`
	SweepRate   float64      `json:"sweep_rows_per_sec"`
	P99Ratio    float64      `json:"claim_p99_ratio"`

	Steady SteadyRun `json:"steady"`
	Target string    `json:"target"`
}

// SweepLatency is claim latency over one window at a fixed rate.
type SweepLatency struct {
	Claims int     `json:"claims"`
	Errors int     `json:"errors"`
	P50ms  float64 `json:"claim_p50_ms"`
	P99ms  float64 `json:"claim_p99_ms"`
	MaxMs  float64 `json:"claim_max_ms"`
}

// SteadyRun is the row count of a route under a steady rate of new events
// delivered over HTTP through a gateway (a Caddy process of -caddy, built
// with -tags benchretention so it accepts a one-minute retention) whose
// own sweep keeps the retention.
type SteadyRun struct {
	EventsPerSec int            `json:"events_per_sec_offered"`
	Offered      float64        `json:"requests_per_sec_sent"`
	Achieved     float64        `json:"events_per_sec_forwarded"`
	Requests     int            `json:"requests"`
	OK           int            `json:"forwarded"`
	Errors       int            `json:"errors"`
	ErrorKinds   map[string]int `json:"error_kinds,omitempty"`
	P50ms        float64        `json:"p50_ms"`
	P99ms        float64        `json:"p99_ms"`
	Retention    string         `json:"retention"`
	SweepEvery   string         `json:"sweep_every"`
	Seconds      float64        `json:"seconds"`
	Samples      []int          `json:"row_samples"`
	MaxRows      int            `json:"max_rows"`
	LastRows     int            `json:"last_rows"`
	Bound        int            `json:"bound"`
	// Swept is derived: rows written (forwarded) minus rows left.
	Swept   int      `json:"rows_swept"`
	CPU     CPUShare `json:"cpu"`
	LoadAvg string   `json:"loadavg"`
	Profile string   `json:"cpu_profile,omitempty"`
}

const sweepTable = "bench_sweep"

func runSweep(ctx context.Context, c config) (*SweepReport, error) {
	st, err := openStore(ctx, c.dsn, sweepTable)
	if err != nil {
		return nil, err
	}
	defer dropStore(st, sweepTable)
	rep := &SweepReport{Started: time.Now().UTC(), Command: strings.Join(os.Args, " "),
		Machine: machineInfo(ctx, st), Expired: c.sweepRows, ClaimRate: c.sweepClaimRate}
	trackPostgres(st)
	if c.sweepRows > 0 {
		if err := sweepLatency(ctx, st, c, rep); err != nil {
			return rep, err
		}
	}

	fmt.Printf("sweep: %d new events/s over HTTP through a gateway with retention %s, for %s...\n",
		c.sweepEvents, c.sweepRetention, c.sweepSteady)
	rep.Steady, err = steady(ctx, st, c)
	verdict := "met"
	if rep.P99Ratio > 1.5 || rep.Steady.MaxRows > rep.Steady.Bound {
		verdict = "NOT met"
	}
	rep.Target = fmt.Sprintf("claim p99 while sweeping ÷ between sweeps = %.2f (target ≤ 1.50); rows at most %d, bound %d: %s",
		rep.P99Ratio, rep.Steady.MaxRows, rep.Steady.Bound, verdict)
	fmt.Println(rep.Target)
	return rep, err
}

// sweepLatency is the first part of the sweep run: claim latency while
// store.Sweep deletes sweepRows expired rows, against between its runs.
func sweepLatency(ctx context.Context, st *postgres.Store, c config, rep *SweepReport) error {

	// Expired rows: completed, first seen two days ago.
	fmt.Printf("sweep: loading %d expired rows...\n", c.sweepRows)
	t0 := time.Now()
	if _, err := st.Pool().Exec(ctx, `INSERT INTO `+pgx.Identifier{sweepTable}.Sanitize()+`
			(scope, event_id, state, attempts, first_seen, updated_at, completed_at, status)
		SELECT 'stripe', 'evt_old_' || g, 'completed', 1, t, t, t, 200
		FROM generate_series(1, $1::int) g, LATERAL (SELECT now() - interval '2 days' + g * interval '1 ms' AS t) ts`,
		c.sweepRows); err != nil {
		return fmt.Errorf("loading: %w", err)
	}
	if _, err := st.Pool().Exec(ctx, `VACUUM ANALYZE `+pgx.Identifier{sweepTable}.Sanitize()); err != nil {
		return err
	}
	rep.LoadSecs = time.Since(t0).Seconds()

	// Interleaved windows, so that the machine's drift (other processes)
	// hits both sides: the sweep runs for a window (a sweep cut short
	// resumes where it stopped: what is left is what is expired), then
	// rests for one, until nothing expired is left; claims run at a fixed
	// rate throughout, each counted in the window it started in.
	const window = 4 * time.Second
	fmt.Printf("sweep: claims at %d/s; store.Sweep of the %d expired rows in %s windows, every other one...\n",
		c.sweepClaimRate, c.sweepRows, window)
	var sweeping atomic.Bool
	done := make(chan struct{})
	var sweepErr error
	go func() {
		defer close(done)
		cutoff := []store.Expiry{{Scopes: []string{"stripe"}, Cutoff: time.Now().Add(-24 * time.Hour)}}
		if !store.Sleep(ctx, window) { // a rest window first
			return
		}
		for {
			sweeping.Store(true)
			s0 := time.Now()
			wctx, cancel := context.WithTimeout(ctx, window)
			n, err := store.Sweep(wctx, st, cutoff, 1000, 5*time.Second)
			cancel()
			sweeping.Store(false)
			rep.SweepSecs += time.Since(s0).Seconds()
			rep.SweepRows += n
			if err != nil && (ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded)) {
				sweepErr = err
				return
			}
			if !store.Sleep(ctx, window) || err == nil { // nothing left: one last rest window
				return
			}
		}
	}()
	rep.DuringSweep, rep.IdleBefore = fixedRateTagged(ctx, st, c.sweepClaimRate, c.retentionMax, done, &sweeping)
	<-done
	if sweepErr != nil {
		return fmt.Errorf("sweep: %w", sweepErr)
	}
	if rep.SweepSecs > 0 {
		rep.SweepRate = float64(rep.SweepRows) / rep.SweepSecs
	}
	if rep.IdleBefore.P99ms > 0 {
		rep.P99Ratio = rep.DuringSweep.P99ms / rep.IdleBefore.P99ms
	}
	fmt.Printf("  swept %d rows in %.1fs of sweeping (%.0f rows/s)\n", rep.SweepRows, rep.SweepSecs, rep.SweepRate)
	fmt.Printf("  claims while sweeping: p50 %.2fms p99 %.2fms max %.1fms (%d claims, %d errors)\n",
		rep.DuringSweep.P50ms, rep.DuringSweep.P99ms, rep.DuringSweep.MaxMs, rep.DuringSweep.Claims, rep.DuringSweep.Errors)
	fmt.Printf("  claims while resting: p50 %.2fms p99 %.2fms max %.1fms (%d claims, %d errors)\n",
		rep.IdleBefore.P50ms, rep.IdleBefore.P99ms, rep.IdleBefore.MaxMs, rep.IdleBefore.Claims, rep.IdleBefore.Errors)
	return nil
}

// fixedRateTagged claims and completes new events at rate per second (an
// open loop: a slow claim does not slow the next) until stop closes or du
// passes, and reports the claims' latency, each counted on the side of on
// (the sweep running or not) when it started.
func fixedRateTagged(ctx context.Context, st store.Store, rate int, du time.Duration, stop <-chan struct{}, on *atomic.Bool) (yes, no SweepLatency) {
	ctx, cancel := context.WithTimeout(ctx, du)
	defer cancel()
	var (
		mu         sync.Mutex
		latY, latN []time.Duration
		errY, errN int
		wg         sync.WaitGroup
		sem        = make(chan struct{}, 512)
	)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2)) // #nosec G404 -- event IDs of a benchmark
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-stop:
			break loop
		case <-tick.C:
		}
		id, sweeping := randomEventID(r), on.Load()
		select {
		case sem <- struct{}{}:
		default:
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer ccancel()
			a := time.Now()
			cl, err := st.Claim(cctx, store.ClaimParams{Scope: "stripe", EventID: id, Lease: 30 * time.Second})
			d := time.Since(a)
			if err == nil && cl.Outcome == store.Claimed {
				err = st.Complete(cctx, "stripe", id, cl.Token, 200)
			} else if err == nil {
				err = fmt.Errorf("claim: %s", cl.Outcome)
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil && sweeping:
				errY++
			case err != nil:
				errN++
			case sweeping:
				latY = append(latY, d)
			default:
				latN = append(latN, d)
			}
		})
	}
	wg.Wait()
	return latency(latY, errY), latency(latN, errN)
}

func latency(lat []time.Duration, errs int) SweepLatency {
	out := SweepLatency{Claims: len(lat), Errors: errs}
	if len(lat) > 0 {
		slices.Sort(lat)
		out.P50ms, out.P99ms, out.MaxMs = ms(pct(lat, 0.5)), ms(pct(lat, 0.99)), ms(lat[len(lat)-1])
	}
	return out
}

// steady starts a fast upstream and a gateway (-caddy) on route scope
// "steady" with retention sweepRetention, drives it with vegeta at a
// constant sweepEvents new Stripe-signed deliveries per second for
// sweepSteady, and samples the scope's row count every 5s. The gateway
// sweeps on its own cadence (every quarter of the retention). With -pprof
// its CPU is profiled for 30s in the middle of the run.
func steady(ctx context.Context, st *postgres.Store, c config) (SteadyRun, error) {
	every := min(10*time.Minute, max(c.sweepRetention/4, 100*time.Millisecond)) // the handler's sweepEvery
	run := SteadyRun{EventsPerSec: c.sweepEvents, Retention: c.sweepRetention.String(), SweepEvery: every.String(),
		// What a route keeps at most: the events of one retention plus
		// those of one sweep interval, plus one sweep's duration's worth.
		Bound: int(float64(c.sweepEvents) * (c.sweepRetention + 2*every).Seconds())}
	p, err := loadPayload("examples/payloads/stripe_payment_intent_succeeded.json")
	if err != nil {
		return run, err
	}
	up, upAddr, err := startUpstream(ctx, 0, "", "")
	if err != nil {
		return run, err
	}
	defer up.stop()
	route := fmt.Sprintf("webhook_idempotency {\n\tprovider stripe\n\tsecret %s\n\tstorage postgres %q\n\ttable %s\n"+
		"\tscope steady\n\tretention %s\n\ttolerance 30s\n}\nreverse_proxy %s", secret, c.dsn, sweepTable, c.sweepRetention, upAddr)
	gw, url, err := startCaddy(ctx, c, "sweep-steady", route)
	if err != nil {
		return run, fmt.Errorf("%w (make bench-sweep builds %s with -tags benchretention, which a one-minute retention needs)", err, c.caddyBin)
	}
	defer gw.stop()

	ctx, cancel := context.WithTimeout(ctx, c.sweepSteady)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			var n int
			if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{sweepTable}.Sanitize()+
				` WHERE scope = 'steady'`).Scan(&n); err == nil {
				run.Samples = append(run.Samples, n)
				run.MaxRows = max(run.MaxRows, n)
				fmt.Printf("  %3.0fs: %d rows\n", float64(len(run.Samples)*5), n)
			}
		}
	})
	if c.pprof {
		wg.Go(func() {
			du := min(30*time.Second, c.sweepSteady/2)
			if !store.Sleep(ctx, (c.sweepSteady-du)/2) {
				return
			}
			path, err := gw.profile(du)
			if err != nil {
				fmt.Printf("  profiling the gateway: %v\n", err)
				return
			}
			run.Profile = path
		})
	}

	atk := vegeta.NewAttacker(
		vegeta.Client(newClient(1024)),
		vegeta.Workers(64),
		vegeta.MaxWorkers(1024), // more when answers lag: the rate is held, not the concurrency
		vegeta.MaxBody(4096),
	)
	stop := context.AfterFunc(ctx, func() { atk.Stop() })
	defer stop()
	col := newCollector()
	cpu := startCPU(gw.pid(), up.pid())
	t0 := time.Now()
	rate := vegeta.Rate{Freq: c.sweepEvents, Per: time.Second}
	for res := range atk.Attack(targeter(url+"/webhooks/stripe", p, newIDs(), nil, false), rate, c.sweepSteady, "sweep") {
		var err error
		if res.Error != "" && res.Code == 0 {
			err = fmt.Errorf("%s", res.Error)
		} else {
			err = checkForwarded(res)
		}
		col.add(res.Timestamp, res.Latency, err)
	}
	run.Seconds = time.Since(t0).Seconds()
	res := col.result("steady", 1)
	run.CPU = cpu.stop(res.OK)
	run.LoadAvg = loadavg()
	run.Requests, run.OK, run.Errors, run.ErrorKinds = res.Requests, res.OK, res.Errors, res.ErrorKind
	run.Offered = float64(res.Requests) / run.Seconds
	run.Achieved = float64(res.OK) / run.Seconds
	run.P50ms, run.P99ms = res.P50ms, res.P99ms
	cancel()
	wg.Wait()
	if err := st.Pool().QueryRow(context.WithoutCancel(ctx), `SELECT count(*) FROM `+pgx.Identifier{sweepTable}.Sanitize()+
		` WHERE scope = 'steady'`).Scan(&run.LastRows); err == nil {
		run.Swept = run.OK - run.LastRows
	}
	fmt.Printf("  sent %.0f/s, forwarded %.0f events/s (%d errors), p50 %.1fms p99 %.1fms; rows at most %d (bound %d), %d at the end; "+
		"%d swept; CPU cores: gateway %.2f, postgres %.2f, upstream %.2f, load generator %.2f, machine busy %.0f%%\n",
		run.Offered, run.Achieved, run.Errors, run.P50ms, run.P99ms, run.MaxRows, run.Bound, run.LastRows, run.Swept,
		run.CPU.Gateway, run.CPU.Postgres, run.CPU.Upstream, run.CPU.LoadGen, 100*run.CPU.Machine)
	if run.Profile != "" {
		fmt.Printf("  gateway CPU profile: %s\n", run.Profile)
	}
	return run, nil
}
