package dispatch

import (
	"time"

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

func (m *Metrics) attempt(scope, outcome string, n int) {
	if m.Attempts != nil {
		m.Attempts.WithLabelValues(scope, outcome).Add(float64(n))
	}
}

func (m *Metrics) observeStore(op string, d time.Duration) {
	if m.Store != nil {
		m.Store.WithLabelValues(op).Observe(d.Seconds())
	}
}

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
