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
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// The growth run's tables: one kept empty, one bulk-loaded. Both dropped at
// the end.
const (
	emptyTable = "bench_growth_empty"
	bigTable   = "bench_growth"
)

// GrowthReport is the JSON of a growth run.
type GrowthReport struct {
	Started     time.Time      `json:"started"`
	Command     string         `json:"command"`
	Machine     MachineInfo    `json:"machine"`
	Workers     int            `json:"workers"`
	Rows        int            `json:"rows"`
	LoadSeconds float64        `json:"bulk_load_seconds"`
	TableBytes  int64          `json:"table_bytes_with_indexes"`
	Phases      []GrowthPhase  `json:"phases"`
	Median      map[string]any `json:"median"`
	Retention   RetentionRun   `json:"retention"`
	Target      string         `json:"target"`
}

// GrowthPhase is one window of claim + complete load on one table.
type GrowthPhase struct {
	Name        string  `json:"name"`
	Round       int     `json:"round"`
	Claims      int     `json:"claims"`
	Errors      int     `json:"errors"`
	OpsPerSec   float64 `json:"claim_complete_per_sec"`
	ClaimP50ms  float64 `json:"claim_p50_ms"`
	ClaimP99ms  float64 `json:"claim_p99_ms"`
	ClaimMaxMs  float64 `json:"claim_max_ms"`
	CompleteP99 float64 `json:"complete_p99_ms"`
	LoadAvg     string  `json:"loadavg"`
	// WAL written per claim + complete (pg_stat_wal, server-wide: other
	// sessions' writes count too) and full-page images per claim + complete.
	WALBytesPerOp float64 `json:"wal_bytes_per_op"`
	FPIPerOp      float64 `json:"full_page_images_per_op"`
}

// walStats reads the server's WAL counters (PostgreSQL 14+; zero if absent).
func walStats(ctx context.Context, st *postgres.Store) (bytes, fpi float64) {
	_ = st.Pool().QueryRow(ctx, `SELECT wal_bytes::float8, wal_fpi::float8 FROM pg_stat_wal`).Scan(&bytes, &fpi)
	return bytes, fpi
}

// withWAL runs claimLoad and adds the WAL it wrote per operation.
func withWAL(ctx context.Context, st *postgres.Store, f func() (GrowthPhase, error)) (GrowthPhase, error) {
	b0, f0 := walStats(ctx, st)
	ph, err := f()
	b1, f1 := walStats(ctx, st)
	if n := float64(ph.Claims); n > 0 {
		ph.WALBytesPerOp, ph.FPIPerOp = (b1-b0)/n, (f1-f0)/n
	}
	return ph, err
}

// RetentionRun is the retention sweep run against the big table under load.
type RetentionRun struct {
	Cutoff      string      `json:"cutoff"`
	Deleted     int         `json:"deleted"`
	Batches     int         `json:"batches"`
	Seconds     float64     `json:"seconds"`
	RowsPerSec  float64     `json:"rows_per_sec"`
	BatchP50ms  float64     `json:"batch_p50_ms"`
	BatchP99ms  float64     `json:"batch_p99_ms"`
	Finished    bool        `json:"finished"`
	DuringClaim GrowthPhase `json:"claims_during"`
}

func runGrowth(ctx context.Context, c config) (*GrowthReport, error) {
	empty, err := openStore(ctx, c.dsn, emptyTable)
	if err != nil {
		return nil, err
	}
	defer dropStore(empty, emptyTable)
	big, err := openStore(ctx, c.dsn, bigTable)
	if err != nil {
		return nil, err
	}
	defer dropStore(big, bigTable)

	rep := &GrowthReport{
		Started: time.Now().UTC(), Command: strings.Join(os.Args, " "), Machine: machineInfo(ctx, big),
		Workers: c.growthWorkers, Rows: c.growthRows, Median: map[string]any{},
	}
	if err := checkDisk(ctx, big, c.growthRows); err != nil {
		return rep, err
	}
	fmt.Printf("growth: bulk-loading %d rows into %s (COPY)...\n", c.growthRows, bigTable)
	t0 := time.Now()
	if err := bulkLoad(ctx, big, c.growthRows); err != nil {
		return rep, fmt.Errorf("bulk load: %w", err)
	}
	rep.LoadSeconds = time.Since(t0).Seconds()
	_ = big.Pool().QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass)`, bigTable).Scan(&rep.TableBytes)
	fmt.Printf("  loaded in %.0fs, %.2f GB with indexes\n", rep.LoadSeconds, float64(rep.TableBytes)/1e9)

	// Alternate the two tables so drift in the machine's load hits both.
	const rounds = 3
	var p99s = map[string][]float64{}
	for round := 1; round <= rounds; round++ {
		for _, t := range []struct {
			name string
			st   *postgres.Store
		}{{"empty", empty}, {fmt.Sprintf("%dM rows", c.growthRows/1_000_000), big}} {
			if t.st == empty {
				if _, err := empty.Pool().Exec(ctx, `TRUNCATE `+emptyTable); err != nil {
					return rep, err
				}
			}
			ph, err := withWAL(ctx, t.st, func() (GrowthPhase, error) {
				return claimLoad(ctx, t.st, c.growthWorkers, c.growthDuration, nil)
			})
			if err != nil {
				return rep, fmt.Errorf("%s: %w", t.name, err)
			}
			ph.Name, ph.Round = t.name, round
			rep.Phases = append(rep.Phases, ph)
			p99s[t.name] = append(p99s[t.name], ph.ClaimP99ms)
			fmt.Printf("  round %d %-10s %7.0f claim+complete/s  claim p50 %6.2fms p99 %6.2fms  errors %d  WAL %.0f B/op, %.2f FPI/op\n",
				round, t.name, ph.OpsPerSec, ph.ClaimP50ms, ph.ClaimP99ms, ph.Errors, ph.WALBytesPerOp, ph.FPIPerOp)
		}
	}
	bigName := fmt.Sprintf("%dM rows", c.growthRows/1_000_000)
	me, mb := medianF(p99s["empty"]), medianF(p99s[bigName])
	rep.Median["claim_p99_ms_empty"] = me
	rep.Median["claim_p99_ms_big"] = mb
	if me > 0 {
		ratio := mb / me
		rep.Median["ratio"] = ratio
		verdict := "met"
		if ratio > 1.5 {
			verdict = "MISSED"
		}
		rep.Target = fmt.Sprintf("claim p99 at %s ÷ empty = %.2f (target ≤ 1.50): %s", bigName, ratio, verdict)
	}

	// Retention: delete the oldest day (first_seen spans 31 days, retention
	// is 30) in the gateway's batches, back to back, while claims run.
	fmt.Printf("growth: retention sweep of the oldest day under claim load...\n")
	rr, err := retentionUnderLoad(ctx, big, c)
	rep.Retention = rr
	if err != nil {
		return rep, err
	}
	fmt.Printf("  deleted %d rows in %d batches, %.0fs (%.0f rows/s), batch p99 %.1fms; claims during: p50 %.2fms p99 %.2fms (%.0f/s)\n",
		rr.Deleted, rr.Batches, rr.Seconds, rr.RowsPerSec, rr.BatchP99ms, rr.DuringClaim.ClaimP50ms, rr.DuringClaim.ClaimP99ms, rr.DuringClaim.OpsPerSec)
	fmt.Println()
	fmt.Println("| table | claim+complete/s | claim p50 ms | claim p99 ms | WAL bytes / op | full-page images / op |")
	fmt.Println("| --- | ---: | ---: | ---: | ---: | ---: |")
	for _, ph := range rep.Phases {
		fmt.Printf("| %s (round %d) | %.0f | %.2f | %.2f | %.0f | %.2f |\n", ph.Name, ph.Round, ph.OpsPerSec, ph.ClaimP50ms, ph.ClaimP99ms, ph.WALBytesPerOp, ph.FPIPerOp)
	}
	d := rr.DuringClaim
	fmt.Printf("| %s during retention | %.0f | %.2f | %.2f | %.0f | %.2f |\n", bigName, d.OpsPerSec, d.ClaimP50ms, d.ClaimP99ms, d.WALBytesPerOp, d.FPIPerOp)
	fmt.Println()
	fmt.Println(rep.Target)
	rep.Machine.LoadAfter = loadavg()
	return rep, nil
}

func medianF(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// openStore opens (and migrates) the events table of a run, bounded by a
// minute; dropStore drops it.
func openStore(ctx context.Context, dsn, table string) (*postgres.Store, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return postgres.New(ctx, postgres.Options{DSN: dsn, Table: table})
}

func dropStore(st *postgres.Store, table string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dropEventTables(ctx, st, table)
	_ = st.Close()
}

// checkDisk refuses to load when the database's disk lacks room for the
// rows (about 300 bytes a row with indexes, doubled for WAL and slack).
func checkDisk(ctx context.Context, st *postgres.Store, rows int) error {
	var dir string
	if err := st.Pool().QueryRow(ctx, `SELECT current_setting('data_directory')`).Scan(&dir); err != nil {
		return nil // not allowed to see it: trust the operator
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		return nil // a remote server: nothing to check here
	}
	free := int64(fs.Bavail) * int64(fs.Bsize)
	need := int64(rows) * 600
	if free < need {
		return fmt.Errorf("%s has %.1f GB free; the growth run needs about %.1f GB", dir, float64(free)/1e9, float64(need)/1e9)
	}
	fmt.Printf("  disk: %.1f GB free at %s, need about %.1f GB\n", float64(free)/1e9, dir, float64(need)/1e9)
	return nil
}

const idChars = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// randomEventID is shaped like a Stripe event ID: "evt_" and 24 base62
// characters, random, so index inserts land anywhere in the key space.
func randomEventID(r *rand.Rand) string {
	var b [28]byte
	copy(b[:], "evt_")
	for i := 4; i < len(b); i++ {
		b[i] = idChars[r.IntN(len(idChars))]
	}
	return string(b[:])
}

// bulkLoad fills the table with n completed rows whose first_seen spans the
// last 31 days, in time order: the indexes are dropped, the rows COPYed, the indexes built
// again from their own definitions (so the schema stays the migration's),
// then VACUUM ANALYZE and CHECKPOINT, so the measurement does not pay for
// the load's hint bits and dirty buffers.
func bulkLoad(ctx context.Context, st *postgres.Store, n int) error {
	conn, err := st.Pool().Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	c := conn.Conn()
	if _, err := c.Exec(ctx, `TRUNCATE `+bigTable); err != nil {
		return err
	}
	var pkName, pkDef string
	if err := c.QueryRow(ctx, `SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
		WHERE conrelid = $1::regclass AND contype = 'p'`, bigTable).Scan(&pkName, &pkDef); err != nil {
		return fmt.Errorf("reading primary key: %w", err)
	}
	rows, err := c.Query(ctx, `SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid) FROM pg_index i
		WHERE i.indrelid = $1::regclass AND NOT i.indisprimary`, bigTable)
	if err != nil {
		return err
	}
	type index struct{ name, def string }
	idx, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (index, error) {
		var x index
		return x, r.Scan(&x.name, &x.def)
	})
	if err != nil {
		return err
	}
	for _, x := range idx {
		if _, err := c.Exec(ctx, `DROP INDEX `+x.name); err != nil {
			return err
		}
	}
	if _, err := c.Exec(ctx, `ALTER TABLE `+bigTable+` DROP CONSTRAINT `+pgx.Identifier{pkName}.Sanitize()); err != nil {
		return err
	}

	r := rand.New(rand.NewPCG(1, 2))
	now := time.Now()
	span := 31 * 24 * time.Hour
	i := 0
	t0 := time.Now()
	copied, err := c.CopyFrom(ctx, pgx.Identifier{bigTable},
		[]string{"scope", "event_id", "state", "token", "attempts", "first_seen", "updated_at", "completed_at", "status"},
		pgx.CopyFromFunc(func() ([]any, error) {
			if i >= n || ctx.Err() != nil {
				return nil, ctx.Err()
			}
			i++
			if i%1_000_000 == 0 {
				fmt.Printf("  %dM rows (%.0fs)\n", i/1_000_000, time.Since(t0).Seconds())
			}
			// Rows arrive in time order, as in production: the heap is
			// ordered by first_seen, so a day's rows sit in neighbouring
			// pages (what a retention sweep deletes), while event IDs are
			// random, so the primary key's inserts land anywhere.
			seen := now.Add(-span + time.Duration(int64(span)/int64(n)*int64(i)))
			return []any{"stripe", randomEventID(r), "completed", "", 1, seen, seen, seen, 200}, nil
		}))
	if err != nil {
		return err
	}
	if copied != int64(n) {
		return fmt.Errorf("copied %d rows of %d", copied, n)
	}
	fmt.Printf("  copied in %.0fs; building indexes...\n", time.Since(t0).Seconds())
	if _, err := c.Exec(ctx, `SET maintenance_work_mem = '512MB'`); err != nil {
		return err
	}
	if _, err := c.Exec(ctx, `ALTER TABLE `+bigTable+` ADD CONSTRAINT `+pgx.Identifier{pkName}.Sanitize()+` `+pkDef); err != nil {
		return err
	}
	for _, x := range idx {
		if _, err := c.Exec(ctx, x.def); err != nil {
			return err
		}
	}
	if _, err := c.Exec(ctx, `VACUUM ANALYZE `+bigTable); err != nil {
		return err
	}
	_, _ = c.Exec(ctx, `CHECKPOINT`) // needs superuser or pg_checkpoint; optional
	return nil
}

// claimLoad runs claim + complete for fresh random event IDs, workers at a
// time, for du or until stop is closed, and reports the claim latency.
func claimLoad(ctx context.Context, st store.Store, workers int, du time.Duration, stop <-chan struct{}) (GrowthPhase, error) {
	ctx, cancel := context.WithTimeout(ctx, du)
	defer cancel()
	if stop != nil {
		go func() {
			select {
			case <-stop:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	var (
		mu        sync.Mutex
		claims    []time.Duration
		completes []time.Duration
		errs      int
		firstErr  error
		wg        sync.WaitGroup
	)
	t0 := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(w)))
			for ctx.Err() == nil {
				id := randomEventID(r)
				a := time.Now()
				cl, err := st.Claim(ctx, store.ClaimParams{Scope: "stripe", EventID: id, Lease: 30 * time.Second})
				b := time.Now()
				if err == nil && cl.Outcome != store.Claimed {
					err = fmt.Errorf("claim: %s", cl.Outcome)
				}
				if err == nil {
					err = st.Complete(ctx, "stripe", id, cl.Token, 200)
				}
				e := time.Now()
				if ctx.Err() != nil {
					return
				}
				mu.Lock()
				if err != nil {
					errs++
					if firstErr == nil {
						firstErr = err
					}
				} else {
					claims = append(claims, b.Sub(a))
					completes = append(completes, e.Sub(b))
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	secs := time.Since(t0).Seconds()
	ph := GrowthPhase{Claims: len(claims), Errors: errs, OpsPerSec: float64(len(claims)) / secs, LoadAvg: loadavg()}
	if len(claims) > 0 {
		slices.Sort(claims)
		slices.Sort(completes)
		ph.ClaimP50ms, ph.ClaimP99ms = ms(pct(claims, 0.5)), ms(pct(claims, 0.99))
		ph.ClaimMaxMs = ms(claims[len(claims)-1])
		ph.CompleteP99 = ms(pct(completes, 0.99))
	}
	if errs > len(claims)/100+10 {
		return ph, fmt.Errorf("%d errors, first: %w", errs, firstErr)
	}
	return ph, nil
}

// retentionUnderLoad deletes rows older than 30 days (the oldest of the 31
// days loaded) with DeleteBefore in the gateway's batch size, back to back,
// while claimLoad runs, and reports both.
func retentionUnderLoad(ctx context.Context, st *postgres.Store, c config) (RetentionRun, error) {
	const batch = 1000 // the handler's retentionBatch
	cutoff := time.Now().Add(-30 * 24 * time.Hour)
	rr := RetentionRun{Cutoff: cutoff.UTC().Format(time.RFC3339)}
	done := make(chan struct{})
	var (
		batches []time.Duration
		delErr  error
	)
	t0 := time.Now()
	go func() {
		defer close(done)
		dctx, cancel := context.WithTimeout(ctx, c.retentionMax)
		defer cancel()
		for dctx.Err() == nil {
			b0 := time.Now()
			n, err := st.DeleteBefore(dctx, []string{"stripe"}, cutoff, batch)
			if err != nil {
				if !errors.Is(err, context.DeadlineExceeded) && dctx.Err() == nil {
					delErr = err
				}
				return
			}
			batches = append(batches, time.Since(b0))
			rr.Deleted += n
			if n < batch {
				rr.Finished = true
				return
			}
		}
	}()
	ph, err := withWAL(ctx, st, func() (GrowthPhase, error) {
		return claimLoad(ctx, st, c.growthWorkers, c.retentionMax+time.Minute, done)
	})
	<-done
	rr.Seconds = time.Since(t0).Seconds()
	rr.Batches = len(batches)
	if rr.Seconds > 0 {
		rr.RowsPerSec = float64(rr.Deleted) / rr.Seconds
	}
	if len(batches) > 0 {
		slices.Sort(batches)
		rr.BatchP50ms, rr.BatchP99ms = ms(pct(batches, 0.5)), ms(pct(batches, 0.99))
	}
	ph.Name = "during retention"
	rr.DuringClaim = ph
	return rr, errors.Join(err, delErr)
}
