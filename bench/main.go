// Command bench measures what a webhook delivery costs through the gateway,
// side by side with plain Caddy and with the store's own limit, on loopback.
//
//	go build -o bin/caddy ./xcaddy && go run ./bench            # make bench
//	go run ./bench -mode growth                                 # make bench-growth
//	go run ./bench -mode memory                                 # make bench-memory
//	go run ./bench -mode sweep -caddy bin/caddy-benchretention  # make bench-sweep
//	go run ./bench -mode floor                                  # make bench-floor
//
// Mode load starts a fast upstream (this program, re-executed) and, for each
// scenario, a Caddy process of bin/caddy with one site, then drives it with
// vegeta's attacker: the same Stripe-signed deliveries, the same number of
// workers, a warm-up whose results are dropped, then a fixed duration cut
// into slices. Scenario store-limit issues the gateway's claim and complete
// statements straight through internal/store/postgres, without HTTP. The
// scenarios a ratio compares form a group whose slices are interleaved
// (A B C A B C ...), so a change in the machine's load hits them alike.
// Results go to stdout and to a JSON file under bench-results/.
//
// Everything listens on 127.0.0.1 only; every loop is bounded in time.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"time"
)

// config is what the flags set.
type config struct {
	mode      string
	caddyBin  string
	dsn       string
	workers   int
	duration  time.Duration
	warmup    time.Duration
	rounds    int
	only      map[string]bool
	out       string
	dupEvents int
	workdir   string
	keep      bool
	pprof     bool
	poolConns int

	// caddyBefore, when set, is a second binary (the code before a change)
	// whose gateways run as "<scenario>@before" in the same groups.
	caddyBefore string

	growthRows     int
	growthDuration time.Duration
	growthWorkers  int
	retentionMax   time.Duration

	sweepRows      int
	sweepClaimRate int
	sweepEvents    int
	sweepRetention time.Duration
	sweepSteady    time.Duration

	memBig      int
	memBigSize  int
	memBigTime  time.Duration
	memSoakTime time.Duration
	// memGitHub concurrent senders of memGitHubRounds GitHub deliveries of
	// memGitHubSize bytes each: the spill phase.
	memGitHub, memGitHubSize, memGitHubRounds int
}

const secret = "whsec_bench_not_a_real_secret"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "upstream" {
		runUpstream(os.Args[2:])
		return
	}
	var c config
	var only string
	flag.StringVar(&c.mode, "mode", "load", "load | growth | memory | sweep | floor")
	flag.StringVar(&c.caddyBin, "caddy", "bin/caddy", "the custom Caddy binary (go build -o bin/caddy ./xcaddy)")
	flag.StringVar(&c.caddyBefore, "caddy-before", "", "a second binary (say, of the commit before a change): its gateways run as <scenario>@before, interleaved with the others")
	flag.StringVar(&c.dsn, "dsn", envOr("BENCH_DATABASE_URL", envOr("TEST_DATABASE_URL",
		"postgres://postgres@127.0.0.1:5432/test?sslmode=disable")), "PostgreSQL DSN ($BENCH_DATABASE_URL, $TEST_DATABASE_URL)")
	flag.IntVar(&c.workers, "workers", 32, "concurrent workers (vegeta workers, store goroutines)")
	flag.DurationVar(&c.duration, "duration", 20*time.Second, "measured time per scenario, split into -rounds slices")
	flag.DurationVar(&c.warmup, "warmup", 3*time.Second, "warm-up per scenario, results dropped")
	flag.IntVar(&c.rounds, "rounds", 10, "slices per scenario: each round drives every scenario of a group for one slice")
	flag.StringVar(&only, "only", "", "comma-separated scenarios to run (default all)")
	flag.StringVar(&c.out, "out", "", "JSON results file (default bench-results/<mode>-<time>.json)")
	flag.IntVar(&c.dupEvents, "dup-events", 1000, "completed events the dup scenarios redeliver")
	flag.BoolVar(&c.keep, "keep", false, "keep the work directory (Caddyfiles, Caddy logs)")
	flag.IntVar(&c.poolConns, "pool-max-conns", 0, "pgx pool size of the gateway and store-limit (pool_max_conns in the DSN); 0 = the store's default")
	flag.BoolVar(&c.pprof, "pprof", false, "profile each gateway's CPU during the measured window (admin API on loopback); implies -keep")
	flag.IntVar(&c.growthRows, "growth-rows", 10_000_000, "rows bulk-loaded for the growth run")
	flag.DurationVar(&c.growthDuration, "growth-duration", 20*time.Second, "claim measurement per growth phase")
	flag.IntVar(&c.growthWorkers, "growth-workers", 32, "concurrent claimers in the growth run")
	flag.DurationVar(&c.retentionMax, "retention-max", 3*time.Minute, "upper bound of the retention phase")
	flag.IntVar(&c.sweepRows, "sweep-rows", 1_000_000, "expired rows the sweep run deletes under claim load; 0 skips that part")
	flag.IntVar(&c.sweepClaimRate, "sweep-claim-rate", 200, "claims per second (open loop) measured in the sweep run")
	flag.IntVar(&c.sweepEvents, "sweep-events", 1000, "new events per second (constant rate, over HTTP through a gateway) of the sweep run's steady phase")
	flag.DurationVar(&c.sweepRetention, "sweep-retention", time.Minute, "retention of the sweep run's steady phase")
	flag.DurationVar(&c.sweepSteady, "sweep-steady", 10*time.Minute, "duration of the sweep run's steady phase")
	flag.IntVar(&c.memBig, "mem-big", 200, "concurrent large deliveries in the memory run")
	flag.IntVar(&c.memBigSize, "mem-big-size", 1<<20, "size of a large delivery in bytes")
	flag.DurationVar(&c.memBigTime, "mem-big-time", 15*time.Second, "duration of the large-delivery phase")
	flag.DurationVar(&c.memSoakTime, "mem-soak-time", 2*time.Minute, "duration of the small-delivery soak")
	flag.IntVar(&c.memGitHub, "mem-github", 50, "concurrent GitHub deliveries in the memory run's spill phase")
	flag.IntVar(&c.memGitHubSize, "mem-github-size", 25_000_000, "size of a GitHub delivery in the spill phase, in bytes")
	flag.IntVar(&c.memGitHubRounds, "mem-github-rounds", 2, "deliveries each sender of the spill phase makes, one after the other")
	flag.Parse()
	if only != "" {
		c.only = map[string]bool{}
		for _, s := range strings.Split(only, ",") {
			c.only[strings.TrimSpace(s)] = true
		}
	}
	if c.workers < 1 || c.workers > 1024 || c.rounds < 1 || c.rounds > 100 ||
		c.duration <= 0 || c.duration > 10*time.Minute || c.warmup < 0 || c.warmup > time.Minute {
		log.Fatal("bench: workers 1..1024, rounds 1..100, duration (0, 10m], warmup [0, 1m]")
	}
	if c.pprof {
		c.keep = true
	}
	// Every session of the run (the gateways' too) names itself, so the
	// postgres CPU columns count only its backends.
	c.dsn = withParam(c.dsn, "application_name", appName)
	if c.poolConns > 0 {
		c.dsn = withParam(c.dsn, "pool_max_conns", fmt.Sprint(c.poolConns))
	}
	if c.out == "" {
		c.out = filepath.Join("bench-results", c.mode+"-"+time.Now().Format("20060102-150405")+".json")
	}

	dir, err := os.MkdirTemp("", "webhook-bench-")
	if err != nil {
		log.Fatal(err)
	}
	c.workdir = dir
	defer func() {
		if !c.keep {
			_ = os.RemoveAll(dir)
		}
	}()

	// A bound on the whole run, and Ctrl-C ends it cleanly (children
	// stopped, tables dropped).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Hour)
	defer cancel()

	var report any
	switch c.mode {
	case "load":
		report, err = runLoad(ctx, c)
	case "growth":
		report, err = runGrowth(ctx, c)
	case "memory":
		report, err = runMemory(ctx, c)
	case "sweep":
		report, err = runSweep(ctx, c)
	case "floor":
		report, err = runFloor(ctx, c)
	default:
		err = fmt.Errorf("unknown -mode %q (load, growth, memory, sweep, floor)", c.mode)
	}
	// A mode that failed before its report began returns a nil pointer,
	// which is not a nil interface: no results file for it.
	if report != nil && !reflect.ValueOf(report).IsNil() {
		if werr := writeJSON(c.out, report); werr != nil {
			err = errors.Join(err, werr)
		} else {
			fmt.Printf("\nresults: %s\n", c.out)
		}
	}
	if c.keep {
		fmt.Printf("work directory: %s\n", dir)
	}
	if err != nil {
		log.Print(err)
		stop()
		if !c.keep {
			_ = os.RemoveAll(dir)
		}
		os.Exit(1) //nolint:gocritic // the deferred cleanup ran above
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// appName is the application_name of the benchmark's PostgreSQL sessions.
const appName = "webhook-bench"

// withParam adds a query parameter to a URL-form DSN, or a key=value pair to
// a keyword-form one.
func withParam(dsn, key, value string) string {
	if !strings.Contains(dsn, "://") {
		return dsn + " " + key + "=" + value
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + key + "=" + value
}
