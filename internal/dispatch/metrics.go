package dispatch

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
)

// Metrics are the collectors the dispatcher updates; the caller creates and
// registers them (the module does, on Caddy's registry). A nil field is
// skipped.
type Metrics struct {
	// Depth{scope,state}: queued and delivering events (all instances).
	Depth *prometheus.GaugeVec
	// Oldest{scope}: age of the oldest event not yet delivered, seconds.
	Oldest *prometheus.GaugeVec
	// Attempts{scope,outcome}: this instance's attempts: delivered, retry,
	// dead, lost, released, lease_lost, settle_failed.
	Attempts *prometheus.CounterVec
	// Dead{scope}: dead events waiting for an operator (all instances).
	Dead *prometheus.GaugeVec
	// Store{operation}: latency of heartbeat_queued and settle_queued, in
	// seconds.
	Store *prometheus.HistogramVec
}

// Attempt outcomes of Attempts besides the queue's own (queue.Attempt*).
const (
	AttemptLeaseLost    = "lease_lost"    // the lease was lost before settling
	AttemptSettleFailed = "settle_failed" // the store failed the settle
	// AttemptUncommitted: delivered on a 2xx the upstream answered without
	// committing its claim (complete_by upstream broken: it does not call
	// the commit function, or uses another database).
	AttemptUncommitted = "delivered_uncommitted"
	// AttemptPending: complete_by upstream, the upstream's transaction
	// still held the event when the wait ran out; not settled.
	AttemptPending = "commit_pending"
)

// attemptOutcomes are every outcome label of Attempts.
var attemptOutcomes = []string{queue.AttemptDelivered, queue.AttemptRetry, queue.AttemptDead, queue.AttemptLost,
	queue.AttemptReleased, AttemptLeaseLost, AttemptSettleFailed, AttemptUncommitted, AttemptPending}

// series are the metrics' series a dispatcher and its routes update,
// resolved once (New, newRoute) so no delivery does a label lookup. The
// stats gauges are set every StatsInterval and deleted when a route stops,
// so they are looked up when set.
type series struct {
	heartbeat, settle prometheus.Observer
}

func (m *Metrics) resolve() series {
	if m.Store == nil {
		return series{heartbeat: noObserver{}, settle: noObserver{}}
	}
	return series{heartbeat: m.Store.WithLabelValues("heartbeat_queued"), settle: m.Store.WithLabelValues("settle_queued")}
}

// attempts resolves a scope's Attempts series, one per outcome.
func (m *Metrics) attempts(scope string) map[string]prometheus.Counter {
	out := make(map[string]prometheus.Counter, len(attemptOutcomes))
	for _, o := range attemptOutcomes {
		if m.Attempts == nil {
			out[o] = noCounter{}
		} else {
			out[o] = m.Attempts.WithLabelValues(scope, o)
		}
	}
	return out
}

type noObserver struct{}

func (noObserver) Observe(float64) {}

// noCounter stands in for a counter the caller did not supply.
type noCounter struct{ prometheus.Counter }

func (noCounter) Inc()        {}
func (noCounter) Add(float64) {}

func (m *Metrics) setStats(scope string, st queue.Stats) {
	if m.Depth != nil {
		m.Depth.WithLabelValues(scope, string(queue.StateQueued)).Set(float64(st.Queued))
		m.Depth.WithLabelValues(scope, string(queue.StateDelivering)).Set(float64(st.Delivering))
	}
	if m.Dead != nil {
		m.Dead.WithLabelValues(scope).Set(float64(st.Dead))
	}
	if m.Oldest != nil {
		m.Oldest.WithLabelValues(scope).Set(st.OldestAge.Seconds())
	}
}

func (m *Metrics) dropStats(scope string) {
	if m.Depth != nil {
		m.Depth.DeleteLabelValues(scope, string(queue.StateQueued))
		m.Depth.DeleteLabelValues(scope, string(queue.StateDelivering))
	}
	if m.Dead != nil {
		m.Dead.DeleteLabelValues(scope)
	}
	if m.Oldest != nil {
		m.Oldest.DeleteLabelValues(scope)
	}
}
