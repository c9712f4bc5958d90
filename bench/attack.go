package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// Result is one measured scenario run.
type Result struct {
	Scenario  string         `json:"scenario"`
	Round     int            `json:"round"`
	Requests  int            `json:"requests"`
	OK        int            `json:"ok"`
	Errors    int            `json:"errors"`
	ErrorKind map[string]int `json:"error_kinds,omitempty"`
	Seconds   float64        `json:"seconds"`
	RPS       float64        `json:"rps"` // successful deliveries per second
	P50ms     float64        `json:"p50_ms"`
	P90ms     float64        `json:"p90_ms"`
	P99ms     float64        `json:"p99_ms"`
	MaxMs     float64        `json:"max_ms"`
	CPU       CPUShare       `json:"cpu"`
	LoadAvg   string         `json:"loadavg"`
}

// CPUShare is where CPU went during the measured window, in cores (1.0 =
// one core busy the whole window), and the machine's total busy share.
type CPUShare struct {
	Gateway   float64 `json:"gateway_cores"`
	Upstream  float64 `json:"upstream_cores"`
	Postgres  float64 `json:"postgres_cores"`
	LoadGen   float64 `json:"loadgen_cores"`
	Machine   float64 `json:"machine_busy"` // 0..1 of all cores
	GatewayMs float64 `json:"gateway_cpu_ms_per_delivery"`
	// UpstreamMs and PostgresMs are the upstream's and PostgreSQL's CPU
	// time per delivery (ms), as GatewayMs.
	UpstreamMs float64 `json:"upstream_cpu_ms_per_delivery"`
	PostgresMs float64 `json:"postgres_cpu_ms_per_delivery"`
	// PostgresBackendsMs and PostgresBackgroundMs split PostgresMs into
	// the run's own client backends (the statements themselves) and the
	// server's background processes (WAL writer, checkpointer, autovacuum,
	// ...: work every commit causes, done later or by others);
	// PostgresByTypeMs splits it by pg_stat_activity.backend_type. ms per
	// delivery.
	PostgresBackendsMs   float64            `json:"postgres_backends_cpu_ms_per_delivery"`
	PostgresBackgroundMs float64            `json:"postgres_background_cpu_ms_per_delivery"`
	PostgresByTypeMs     map[string]float64 `json:"postgres_cpu_ms_per_delivery_by_type,omitempty"`
	// WAL flushes (fsync) and WAL bytes per delivery, server-wide
	// (pg_stat_wal: other sessions' commits count too).
	WALSyncsPerOp float64 `json:"wal_syncs_per_delivery"`
	WALBytesPerOp float64 `json:"wal_bytes_per_delivery"`
}

// walCounters reads pg_stat_wal's flush and byte counters; nil when the
// run has no PostgreSQL (set by trackPostgres).
var walCounters func() (syncs, bytes float64)

// cpuMeter samples CPU counters at the start and end of a window.
type cpuMeter struct {
	pids        []int // gateway, upstream (0 = none)
	ticks       []int64
	pg          map[int]pgSample
	self        int64
	busy, total int64
	start       time.Time
	syncs, wal  float64
}

const clockTicks = 100 // USER_HZ on Linux

func startCPU(gateway, upstream int) *cpuMeter {
	m := &cpuMeter{pids: []int{gateway, upstream}, start: time.Now()}
	for _, p := range m.pids {
		m.ticks = append(m.ticks, ticksOf(p))
	}
	if pgPIDs != nil {
		m.pg = postgresTicks(pgPIDs())
	}
	m.self = cpuTicks(os.Getpid())
	m.busy, m.total = systemCPU()
	if walCounters != nil {
		m.syncs, m.wal = walCounters()
	}
	return m
}

func ticksOf(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	return cpuTicks(pid)
}

func (m *cpuMeter) stop(ok int) CPUShare {
	secs := time.Since(m.start).Seconds()
	// A process that exited in the window (a postgres backend) takes its
	// ticks with it: never report less than nothing.
	cores := func(d int64) float64 { return float64(max(d, 0)) / clockTicks / secs }
	var s CPUShare
	s.Gateway = cores(ticksOf(m.pids[0]) - m.ticks[0])
	s.Upstream = cores(ticksOf(m.pids[1]) - m.ticks[1])
	var pg map[string]int64
	if pgPIDs != nil {
		pg = pgDelta(m.pg, postgresTicks(pgPIDs()))
		var all int64
		for _, t := range pg {
			all += t
		}
		s.Postgres = cores(all)
	}
	s.LoadGen = cores(cpuTicks(os.Getpid()) - m.self)
	busy, total := systemCPU()
	if total > m.total {
		s.Machine = float64(busy-m.busy) / float64(total-m.total)
	}
	if ok > 0 {
		s.GatewayMs = float64(ticksOf(m.pids[0])-m.ticks[0]) / clockTicks * 1000 / float64(ok)
		s.UpstreamMs = s.Upstream * secs * 1000 / float64(ok)
		s.PostgresMs = s.Postgres * secs * 1000 / float64(ok)
		if len(pg) > 0 {
			s.PostgresByTypeMs = map[string]float64{}
		}
		for kind, t := range pg {
			ms := float64(max(t, 0)) / clockTicks * 1000 / float64(ok)
			s.PostgresByTypeMs[kind] = ms
			if kind == clientBackend {
				s.PostgresBackendsMs += ms
			} else {
				s.PostgresBackgroundMs += ms
			}
		}
		if walCounters != nil {
			syncs, wal := walCounters()
			s.WALSyncsPerOp, s.WALBytesPerOp = (syncs-m.syncs)/float64(ok), (wal-m.wal)/float64(ok)
		}
	}
	return s
}

// collector accumulates latencies and outcomes of one window.
type collector struct {
	lat        []time.Duration
	ok, errors int
	kinds      map[string]int
	first, end time.Time
	merged     float64 // seconds of the slices merged in
}

// merge adds another window's results; its span counts, not the gaps
// between windows.
func (c *collector) merge(o *collector) {
	c.lat = append(c.lat, o.lat...)
	c.ok += o.ok
	c.errors += o.errors
	for k, v := range o.kinds {
		c.kinds[k] += v
	}
	if o.end.After(o.first) {
		c.merged += o.end.Sub(o.first).Seconds()
	}
}

func newCollector() *collector { return &collector{kinds: map[string]int{}} }

func (c *collector) add(start time.Time, lat time.Duration, err error) {
	if c.first.IsZero() || start.Before(c.first) {
		c.first = start
	}
	if e := start.Add(lat); e.After(c.end) {
		c.end = e
	}
	if err != nil {
		c.errors++
		if len(c.kinds) < 20 {
			c.kinds[err.Error()]++
		} else if _, ok := c.kinds[err.Error()]; ok {
			c.kinds[err.Error()]++
		}
		return
	}
	c.ok++
	c.lat = append(c.lat, lat)
}

func (c *collector) result(name string, round int) Result {
	r := Result{Scenario: name, Round: round, Requests: c.ok + c.errors, OK: c.ok, Errors: c.errors, LoadAvg: loadavg()}
	if len(c.kinds) > 0 {
		r.ErrorKind = c.kinds
	}
	span := c.end.Sub(c.first).Seconds()
	if c.merged > 0 {
		span = c.merged
	}
	if span > 0 {
		r.Seconds = span
		r.RPS = float64(c.ok) / span
	}
	if len(c.lat) > 0 {
		slices.Sort(c.lat)
		r.P50ms = ms(pct(c.lat, 0.50))
		r.P90ms = ms(pct(c.lat, 0.90))
		r.P99ms = ms(pct(c.lat, 0.99))
		r.MaxMs = ms(c.lat[len(c.lat)-1])
	}
	return r
}

func pct(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// attack runs vegeta's attacker with exactly workers concurrent requests,
// as fast as they are answered (no pacing), for du or until tr has no more
// targets, and feeds every result to c after checking it with check. The
// client's keep-alive connections outlive the attack (newClient).
func attack(ctx context.Context, client *http.Client, tr vegeta.Targeter, workers int, du time.Duration, check func(*vegeta.Result) error, c *collector) {
	atk := vegeta.NewAttacker(
		vegeta.Client(client),
		vegeta.Workers(uint64(workers)),
		vegeta.MaxWorkers(uint64(workers)),
		vegeta.MaxBody(4096),
	)
	rate := vegeta.Rate{Freq: 0, Per: time.Second} // 0 = as fast as the workers go
	stop := context.AfterFunc(ctx, func() { atk.Stop() })
	defer stop()
	for res := range atk.Attack(tr, rate, du, "") {
		if res.Error == vegeta.ErrNoTargets.Error() {
			continue // a once-each targeter ran out: not a request
		}
		var err error
		if res.Error != "" && res.Code == 0 {
			err = fmt.Errorf("%s", res.Error)
		} else {
			err = check(res)
		}
		if c != nil {
			c.add(res.Timestamp, res.Latency, err)
		}
	}
}
