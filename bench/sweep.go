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
// with a short retention and the gateway's sweep cadence.
type SteadyRun struct {
	EventsPerSec  int     `json:"events_per_sec_target"`
	Achieved      float64 `json:"events_per_sec"`
	Errors        int     `json:"errors"`
	Retention     string  `json:"retention"`
	SweepEvery    string  `json:"sweep_every"`
	Seconds       float64 `json:"seconds"`
	Samples       []int   `json:"row_samples"`
	MaxRows       int     `json:"max_rows"`
	Bound         int     `json:"bound"`
	Swept         int     `json:"rows_swept"`
	LongestSweepS float64 `json:"longest_sweep_seconds"`
}

const sweepTable = "bench_sweep"

func runSweep(ctx context.Context, c config) (*SweepReport, error) {
	octx, cancel := context.WithTimeout(ctx, time.Minute)
	st, err := postgres.New(octx, postgres.Options{DSN: c.dsn, Table: sweepTable})
	cancel()
	if err != nil {
		return nil, err
	}
	defer dropStore(st, sweepTable)
	rep := &SweepReport{Started: time.Now().UTC(), Command: strings.Join(os.Args, " "),
		Machine: machineInfo(ctx, st), Expired: c.sweepRows, ClaimRate: c.sweepClaimRate}

	// Expired rows: completed, first seen two days ago.
	fmt.Printf("sweep: loading %d expired rows...\n", c.sweepRows)
	t0 := time.Now()
	if _, err := st.Pool().Exec(ctx, `INSERT INTO `+pgx.Identifier{sweepTable}.Sanitize()+`
			(scope, event_id, state, attempts, first_seen, updated_at, completed_at, status)
		SELECT 'stripe', 'evt_old_' || g, 'completed', 1, t, t, t, 200
		FROM generate_series(1, $1::int) g, LATERAL (SELECT now() - interval '2 days' + g * interval '1 ms' AS t) ts`,
		c.sweepRows); err != nil {
		return rep, fmt.Errorf("loading: %w", err)
	}
	if _, err := st.Pool().Exec(ctx, `VACUUM ANALYZE `+pgx.Identifier{sweepTable}.Sanitize()); err != nil {
		return rep, err
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
		return rep, fmt.Errorf("sweep: %w", sweepErr)
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

	fmt.Printf("sweep: %d new events/s, retention %s, for %s...\n", c.sweepEvents, c.sweepRetention, c.sweepSteady)
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

// steady runs sweepEvents new events per second into scope "steady" for
// sweepSteady while a sweeper does what a route's does (store.Sweep of
// rows older than the retention, every quarter of the retention), and
// samples the scope's row count every 5s.
func steady(ctx context.Context, st *postgres.Store, c config) (SteadyRun, error) {
	every := min(10*time.Minute, max(c.sweepRetention/4, 100*time.Millisecond)) // the handler's sweepEvery
	run := SteadyRun{EventsPerSec: c.sweepEvents, Retention: c.sweepRetention.String(), SweepEvery: every.String(),
		// What a route keeps at most: the events of one retention plus
		// those of one sweep interval, plus one sweep's duration's worth.
		Bound: int(float64(c.sweepEvents) * (c.sweepRetention + 2*every).Seconds())}
	ctx, cancel := context.WithTimeout(ctx, c.sweepSteady)
	defer cancel()
	var (
		wg       sync.WaitGroup
		sweepErr error
	)
	wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			s0 := time.Now()
			n, err := store.Sweep(ctx, st, []store.Expiry{{Scopes: []string{"steady"}, Cutoff: time.Now().Add(-c.sweepRetention)}},
				1000, 5*time.Second)
			run.Swept += n
			run.LongestSweepS = max(run.LongestSweepS, time.Since(s0).Seconds())
			if err != nil && ctx.Err() == nil {
				sweepErr = err
				return
			}
		}
	})
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
	t0 := time.Now()
	lat := fixedRateScope(ctx, st, "steady", c.sweepEvents)
	run.Seconds = time.Since(t0).Seconds()
	run.Achieved = float64(lat.Claims) / run.Seconds
	run.Errors = lat.Errors
	cancel()
	wg.Wait()
	if sweepErr != nil && !errors.Is(sweepErr, context.Canceled) {
		return run, sweepErr
	}
	fmt.Printf("  %.0f events/s achieved (%d errors); rows at most %d (bound %d); swept %d, longest sweep %.1fs\n",
		run.Achieved, run.Errors, run.MaxRows, run.Bound, run.Swept, run.LongestSweepS)
	return run, nil
}

// fixedRateScope is fixedRate on scope until ctx ends, spreading the rate
// over several tickers (one ticker cannot tick 1,000 times a second
// reliably).
func fixedRateScope(ctx context.Context, st store.Store, scope string, rate int) SweepLatency {
	const lanes = 10
	var (
		mu  sync.Mutex
		all SweepLatency
		wg  sync.WaitGroup
	)
	for lane := range lanes {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(lane))) // #nosec G404 -- event IDs of a benchmark
			tick := time.NewTicker(time.Second * lanes / time.Duration(rate))
			defer tick.Stop()
			var inner sync.WaitGroup
			for {
				select {
				case <-ctx.Done():
					inner.Wait()
					return
				case <-tick.C:
				}
				id := randomEventID(r)
				inner.Go(func() {
					cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					cl, err := st.Claim(cctx, store.ClaimParams{Scope: scope, EventID: id, Lease: 30 * time.Second})
					if err == nil && cl.Outcome == store.Claimed {
						err = st.Complete(cctx, scope, id, cl.Token, 200)
					}
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						all.Errors++
						return
					}
					all.Claims++
				})
			}
		})
	}
	wg.Wait()
	return all
}
