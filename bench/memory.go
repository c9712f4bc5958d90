package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// MemoryReport is the JSON of a memory run: the gateway process's resident
// memory (VmRSS, VmHWM from /proc/<pid>/status) under large and small
// deliveries.
type MemoryReport struct {
	Started time.Time   `json:"started"`
	Command string      `json:"command"`
	Machine MachineInfo `json:"machine"`
	Big     BigPhase    `json:"big"`
	Soak    SoakPhase   `json:"soak"`
}

// BigPhase: many large deliveries at once.
type BigPhase struct {
	Concurrency int     `json:"concurrency"`
	BodyBytes   int     `json:"body_bytes"`
	Seconds     float64 `json:"seconds"`
	Deliveries  int     `json:"deliveries"`
	Errors      int     `json:"errors"`
	RSSBeforeMB float64 `json:"rss_before_mb"`
	PeakRSSMB   float64 `json:"peak_rss_mb"` // VmHWM
	RSSAfterMB  float64 `json:"rss_after_mb"`
	P99ms       float64 `json:"p99_ms"`
}

// SoakPhase: small deliveries for a while; RSS sampled every second.
type SoakPhase struct {
	Seconds      float64      `json:"seconds"`
	Deliveries   int          `json:"deliveries"`
	Errors       int          `json:"errors"`
	RPS          float64      `json:"rps"`
	CacheEntries int          `json:"cache_entries"`
	Samples      [][2]float64 `json:"rss_samples_s_mb"`
	RSSFirstMB   float64      `json:"rss_after_first_tenth_mb"`
	RSSMidMB     float64      `json:"rss_mid_mb"`
	RSSEndMB     float64      `json:"rss_end_mb"`
	SlopeMBMin   float64      `json:"second_half_slope_mb_per_min"`
}

// soakCache is the cache size of the soak: small enough to be full within
// the first seconds, so growth after that is not the (bounded) cache
// filling up.
const soakCache = 10000

func runMemory(ctx context.Context, c config) (*MemoryReport, error) {
	if _, err := os.Stat(c.caddyBin); err != nil {
		return nil, fmt.Errorf("%s: %w (build it: go build -o bin/caddy ./xcaddy)", c.caddyBin, err)
	}
	octx, cancel := context.WithTimeout(ctx, time.Minute)
	st, err := postgres.New(octx, postgres.Options{DSN: c.dsn, Table: benchTable})
	cancel()
	if err != nil {
		return nil, err
	}
	defer dropStore(st, benchTable)
	trackPostgres(st)
	up, upAddr, err := startUpstream(ctx, 0, "", "")
	if err != nil {
		return nil, err
	}
	defer up.stop()
	rep := &MemoryReport{Started: time.Now().UTC(), Command: strings.Join(os.Args, " "), Machine: machineInfo(ctx, st)}
	g := newIDs()
	route := func(cache int) string {
		return fmt.Sprintf("webhook_idempotency {\n\tprovider stripe\n\tsecret %s\n\tstorage postgres %q\n\ttable %s\n\tcache %d\n}\nreverse_proxy %s",
			secret, c.dsn, benchTable, cache, upAddr)
	}

	// Large deliveries, many at once.
	{
		gw, url, err := startCaddy(ctx, c, "memory-big", route(100000))
		if err != nil {
			return rep, err
		}
		url += "/webhooks/stripe"
		small, _ := loadPayload("examples/payloads/stripe_payment_intent_succeeded.json")
		attack(ctx, newClient(4), targeter(url, small, g, nil, true), 4, 2*time.Second, checkForwarded, nil)
		before, _, _ := e2e.ProcessMemory(gw.pid())
		col := newCollector()
		attack(ctx, newClient(c.memBig), targeter(url, paddedPayload(c.memBigSize), g, nil, true), c.memBig, c.memBigTime, checkForwarded, col)
		after, hwm, _ := e2e.ProcessMemory(gw.pid()) // VmHWM: the kernel's own peak
		r := col.result("big", 0)
		rep.Big = BigPhase{Concurrency: c.memBig, BodyBytes: c.memBigSize, Seconds: r.Seconds, Deliveries: r.OK,
			Errors: r.Errors, RSSBeforeMB: mb(before), PeakRSSMB: mb(hwm), RSSAfterMB: mb(after), P99ms: r.P99ms}
		gw.stop()
		fmt.Printf("memory: %d concurrent %d-byte deliveries for %s: %d delivered, %d errors; RSS %.0f MB before, peak (VmHWM) %.0f MB, %.0f MB after\n",
			c.memBig, c.memBigSize, c.memBigTime, r.OK, r.Errors, mb(before), mb(hwm), mb(after))
		if r.Errors > 0 {
			fmt.Printf("  errors: %v\n", col.kinds)
		}
	}

	// Small deliveries for a while.
	{
		gw, url, err := startCaddy(ctx, c, "memory-soak", route(soakCache))
		if err != nil {
			return rep, err
		}
		defer gw.stop()
		url += "/webhooks/stripe"
		p, err := loadPayload("examples/payloads/stripe_payment_intent_succeeded.json")
		if err != nil {
			return rep, err
		}
		var (
			mu      sync.Mutex
			samples [][2]float64
		)
		t0 := time.Now()
		stopSampling := sampleRSS(gw.pid(), time.Second, func(rss int64) {
			mu.Lock()
			samples = append(samples, [2]float64{time.Since(t0).Seconds(), mb(rss)})
			mu.Unlock()
		})
		col := newCollector()
		attack(ctx, newClient(c.workers), targeter(url, p, g, nil, true), c.workers, c.memSoakTime, checkForwarded, col)
		stopSampling()
		r := col.result("soak", 0)
		s := SoakPhase{Seconds: r.Seconds, Deliveries: r.OK, Errors: r.Errors, RPS: r.RPS, CacheEntries: soakCache, Samples: samples}
		if n := len(samples); n >= 4 {
			s.RSSFirstMB = samples[n/10][1]
			s.RSSMidMB = samples[n/2][1]
			s.RSSEndMB = samples[n-1][1]
			s.SlopeMBMin = slope(samples[n/2:]) * 60
		}
		rep.Soak = s
		rep.Machine.LoadAfter = loadavg()
		fmt.Printf("memory: soak of %s, %d small deliveries (%.0f/s), %d errors; RSS %.0f MB at 10%%, %.0f MB at half, %.0f MB at the end; second half %.2f MB/min\n",
			c.memSoakTime, r.OK, r.RPS, r.Errors, s.RSSFirstMB, s.RSSMidMB, s.RSSEndMB, s.SlopeMBMin)
	}
	return rep, nil
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }

// sampleRSS reads the process's VmRSS every interval and passes it to f
// (when not nil) until the returned stop function is called.
func sampleRSS(pid int, interval time.Duration, f func(int64)) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if rss, _, err := e2e.ProcessMemory(pid); err == nil && f != nil {
				f(rss)
			}
		}
	}()
	return func() { close(done); <-finished }
}

// slope is the least-squares slope of y over x.
func slope(pts [][2]float64) float64 {
	var sx, sy, sxx, sxy float64
	n := float64(len(pts))
	for _, p := range pts {
		sx += p[0]
		sy += p[1]
		sxx += p[0] * p[0]
		sxy += p[0] * p[1]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}
