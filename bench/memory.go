package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// MemoryReport is the JSON of a memory run: the gateway process's resident
// memory (VmRSS, VmHWM from /proc/<pid>/status) under large and small
// deliveries.
type MemoryReport struct {
	Started time.Time   `json:"started"`
	Command string      `json:"command"`
	Machine MachineInfo `json:"machine"`
	Big     BigPhase    `json:"big"`
	GitHub  SpillPhase  `json:"github"`
	Soak    SoakPhase   `json:"soak"`
}

// SpillPhase: GitHub deliveries of provider size (25 MB) at once, each
// past the in-memory threshold, so written to a temporary file, verified
// and forwarded from it.
type SpillPhase struct {
	Concurrency int     `json:"concurrency"`
	BodyBytes   int     `json:"body_bytes"`
	Seconds     float64 `json:"seconds"`
	Deliveries  int     `json:"deliveries"`
	Errors      int     `json:"errors"`
	RSSBeforeMB float64 `json:"rss_before_mb"`
	PeakRSSMB   float64 `json:"peak_rss_mb"` // VmHWM
	RSSAfterMB  float64 `json:"rss_after_mb"`
	P99ms       float64 `json:"p99_ms"`
	// TempFilesLeft counts the gateway's temporary body files after the
	// phase: 0, as each is removed when its request ends.
	TempFilesLeft int `json:"temp_files_left"`
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
	st, err := openStore(ctx, c.dsn, benchTable)
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

	// GitHub deliveries of provider size, many at once: spilled.
	if c.memGitHub > 0 {
		if err := runSpillPhase(ctx, c, rep, upAddr); err != nil {
			return rep, err
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

// githubSecret signs the spill phase's deliveries.
const githubSecret = "bench-github-secret"

// runSpillPhase measures the gateway's peak RSS (VmHWM) while c.memGitHub
// senders each deliver c.memGitHubRounds GitHub pushes of c.memGitHubSize
// bytes, one after the other. The bodies are generated as streams (never
// held by the load generator), signed by a first pass over the stream.
func runSpillPhase(ctx context.Context, c config, rep *MemoryReport, upAddr string) error {
	// read_timeout 2m: the measure is memory, and on a loaded machine 50
	// concurrent 25 MB uploads through one loopback take longer than the
	// default 10s to arrive.
	route := fmt.Sprintf("webhook_idempotency {\n\tprovider github\n\tsecret %s\n\tstorage postgres %q\n\ttable %s\n\tread_timeout 2m\n}\nreverse_proxy %s",
		githubSecret, c.dsn, benchTable, upAddr)
	gw, url, err := startCaddy(ctx, c, "memory-github", route)
	if err != nil {
		return err
	}
	defer gw.stop()
	url += "/webhooks/github"
	client := &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: c.memGitHub}}
	run := newIDs().run
	deliver := func(id string) error {
		mac := hmac.New(sha256.New, []byte(githubSecret))
		if _, err := io.Copy(mac, pushBody(id, c.memGitHubSize)); err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, pushBody(id, c.memGitHubSize))
		if err != nil {
			return err
		}
		req.ContentLength = int64(c.memGitHubSize)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-GitHub-Event", "push")
		req.Header.Set("X-GitHub-Delivery", id)
		req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(mac.Sum(nil)))
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Idempotent-Replayed") != "" || string(b) != `{"ok":true}` {
			return fmt.Errorf("status %d: %.80s", resp.StatusCode, b)
		}
		return nil
	}
	// One delivery first, so the process is warm before it is measured.
	if err := deliver(run + "-warm"); err != nil {
		return fmt.Errorf("github warm-up delivery: %w", err)
	}
	before, _, _ := e2e.ProcessMemory(gw.pid())
	var (
		mu  sync.Mutex
		col = newCollector()
		wg  sync.WaitGroup
	)
	for w := range c.memGitHub {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range c.memGitHubRounds {
				start := time.Now()
				err := deliver(fmt.Sprintf("%s-%d-%d", run, w, i))
				mu.Lock()
				col.add(start, time.Since(start), err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	after, hwm, _ := e2e.ProcessMemory(gw.pid())
	left, _ := filepath.Glob(filepath.Join(gw.dir, "tmp", "caddy-webhook-body-*"))
	r := col.result("github", 0)
	rep.GitHub = SpillPhase{Concurrency: c.memGitHub, BodyBytes: c.memGitHubSize, Seconds: r.Seconds, Deliveries: r.OK,
		Errors: r.Errors, RSSBeforeMB: mb(before), PeakRSSMB: mb(hwm), RSSAfterMB: mb(after), P99ms: r.P99ms, TempFilesLeft: len(left)}
	fmt.Printf("memory: %d concurrent GitHub deliveries of %d bytes (%d each): %d delivered, %d errors in %.0fs; RSS %.0f MB before, peak (VmHWM) %.0f MB, %.0f MB after; %d temporary files left\n",
		c.memGitHub, c.memGitHubSize, c.memGitHubRounds, r.OK, r.Errors, r.Seconds, mb(before), mb(hwm), mb(after), len(left))
	if r.Errors > 0 {
		fmt.Printf("  errors: %v\n", col.kinds)
	}
	return nil
}

// pushBody streams a GitHub push payload of exactly size bytes naming id,
// its commit message padded with "x".
func pushBody(id string, size int) io.Reader {
	head := `{"ref":"refs/heads/main","after":"` + id + `","commits":[{"message":"`
	const tail = `"}]}`
	pad := max(size-len(head)-len(tail), 0)
	return io.MultiReader(strings.NewReader(head), io.LimitReader(xs{}, int64(pad)), strings.NewReader(tail))
}

// xs reads as an endless run of 'x'.
type xs struct{}

func (xs) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = 'x'
	}
	return len(b), nil
}
