package caddymodule

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics, exposed on Caddy's own registry (its /metrics endpoint, next to
// the HTTP metrics). Labels are bounded by the config: scope, provider,
// outcome, operation. Never event IDs or client addresses.
//
//	caddy_webhook_idempotency_deliveries_total{scope,provider,outcome}
//	caddy_webhook_idempotency_store_duration_seconds{operation}
//	caddy_webhook_idempotency_upstream_duration_seconds{scope,provider}
//	caddy_webhook_idempotency_claims_in_flight{scope}
//	caddy_webhook_idempotency_cache_hits_total{scope}
//	caddy_webhook_idempotency_cache_misses_total{scope}
//	caddy_webhook_idempotency_body_mismatch_total{scope}
var metrics = struct {
	once         sync.Once
	deliveries   *prometheus.CounterVec
	store        *prometheus.HistogramVec
	upstream     *prometheus.HistogramVec
	inFlight     *prometheus.GaugeVec
	cacheHits    *prometheus.CounterVec
	cacheMiss    *prometheus.CounterVec
	bodyMismatch *prometheus.CounterVec
}{}

// Outcomes of a delivery; each delivery is counted once, with its final one.
const (
	outcomeCompleted        = "completed"         // forwarded, upstream 2xx, event completed
	outcomeReleased         = "released"          // forwarded, upstream non-2xx or proxy error, claim released
	outcomeAmbiguous        = "ambiguous"         // forward_timeout ended the forward (on_ambiguous hold)
	outcomeDuplicate        = "duplicate"         // completed before: 200 at the edge
	outcomeInFlight         = "in_flight"         // claimed by a live delivery: 409
	outcomeHeld             = "held"              // event held after an ambiguous forward: 503
	outcomeInvalidSignature = "invalid_signature" // 400
	outcomeBadRequest       = "bad_request"       // no usable event ID, unreadable body: 400
	outcomeTooLarge         = "too_large"         // over max_body: 413
	outcomeUnsupported      = "unsupported_encoding"
	outcomeStoreError       = "store_error"   // 503, nothing forwarded
	outcomeHandshake        = "handshake"     // verified challenge, forwarded without a claim
	outcomeForwardedNoID    = "forwarded"     // on_missing_id forward: forwarded without deduplication
	outcomeBodyReplay       = "body_replayed" // dedupe_body: same body under another event ID, 200 at the edge
	outcomeReadTimeout      = "read_timeout"  // the body did not arrive within read_timeout: 408
)

var allOutcomes = []string{outcomeCompleted, outcomeReleased, outcomeAmbiguous, outcomeDuplicate,
	outcomeInFlight, outcomeHeld, outcomeInvalidSignature, outcomeBadRequest, outcomeTooLarge,
	outcomeUnsupported, outcomeStoreError, outcomeHandshake, outcomeForwardedNoID, outcomeBodyReplay, outcomeReadTimeout}

func initMetrics(reg *prometheus.Registry) error {
	const ns, sub = "caddy", "webhook_idempotency"
	metrics.once.Do(func() {
		metrics.deliveries = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "deliveries_total",
			Help: "Webhook deliveries by scope, provider and final outcome.",
		}, []string{"scope", "provider", "outcome"})
		metrics.store = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "store_duration_seconds",
			Help:    "Latency of store operations (claim, complete, release, heartbeat) in seconds.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"operation"})
		metrics.upstream = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "upstream_duration_seconds",
			Help:    "Time the upstream took to answer a forwarded delivery, in seconds.",
			Buckets: prometheus.DefBuckets,
		}, []string{"scope", "provider"})
		metrics.inFlight = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "claims_in_flight",
			Help: "Claims this instance holds while their deliveries are being forwarded.",
		}, []string{"scope"})
		metrics.cacheHits = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "cache_hits_total",
			Help: "Duplicates answered from the in-memory cache of completed event IDs.",
		}, []string{"scope"})
		metrics.cacheMiss = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "cache_misses_total",
			Help: "Lookups of the in-memory cache that had to ask the store.",
		}, []string{"scope"})
		metrics.bodyMismatch = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "body_mismatch_total",
			Help: "Completed event IDs that arrived again with a different body (dedupe_body), answered as duplicates.",
		}, []string{"scope"})
	})
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{metrics.deliveries, metrics.store, metrics.upstream,
		metrics.inFlight, metrics.cacheHits, metrics.cacheMiss, metrics.bodyMismatch} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}
