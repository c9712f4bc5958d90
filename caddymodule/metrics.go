package caddymodule

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/claim"

	"github.com/caddyserver/caddy/v2"
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
//	caddy_webhook_idempotency_ambiguous_reforwards_total{scope}
//	caddy_webhook_idempotency_body_budget_held_bytes{scope}
//	caddy_webhook_idempotency_body_budget_refused_total{scope}
//	caddy_webhook_idempotency_store_batch_size{op}
//	caddy_webhook_idempotency_store_retries_total{reason}
var metrics = struct {
	once         sync.Once
	deliveries   *prometheus.CounterVec
	store        *prometheus.HistogramVec
	storeTime    storeTimes // store's series, one per operation
	upstream     *prometheus.HistogramVec
	inFlight     *prometheus.GaugeVec
	cacheHits    *prometheus.CounterVec
	cacheMiss    *prometheus.CounterVec
	bodyMismatch *prometheus.CounterVec
	reforwards   *prometheus.CounterVec
	budgetHeld   *prometheus.GaugeVec
	budgetRefuse *prometheus.CounterVec
}{}

// Outcomes of a delivery; each delivery is counted once, with its final one.
const (
	outcomeCompleted = "completed" // forwarded, upstream 2xx, event completed
	outcomeReleased  = "released"  // forwarded, upstream non-2xx or proxy error, claim released
	outcomeAmbiguous = "ambiguous" // the forward ended with no known outcome; event held (on_ambiguous hold, or a second such ending under reforward)
	// outcomeAmbiguousReleased: the forward ended with no known outcome and
	// the event was released (on_ambiguous reforward); the upstream may
	// have run it. Never counted as released.
	outcomeAmbiguousReleased = "ambiguous_released"
	outcomeDuplicate         = "duplicate"         // completed before: 200 at the edge
	outcomeInFlight          = "in_flight"         // claimed by a live delivery: 409
	outcomeHeld              = "held"              // event held after an ambiguous forward: 503
	outcomeInvalidSignature  = "invalid_signature" // 400
	outcomeBadRequest        = "bad_request"       // no usable event ID, unreadable body: 400
	outcomeTooLarge          = "too_large"         // over max_body: 413
	outcomeUnsupported       = "unsupported_encoding"
	outcomeStoreError        = "store_error"     // 503, nothing forwarded
	outcomeHandshake         = "handshake"       // verified challenge, forwarded without a claim
	outcomeForwardedNoID     = "forwarded"       // on_missing_id forward: forwarded without deduplication
	outcomeBodyReplay        = "body_replayed"   // dedupe_body: same body under another event ID, 200 at the edge
	outcomeQueued            = "queued"          // async: stored for delivery, 200 at once
	outcomeReadTimeout       = "read_timeout"    // the body did not arrive within read_timeout: 408
	outcomeKeyUnavailable    = "key_unavailable" // the provider's key could not be fetched: 503, nothing recorded
	outcomeSpooled           = "spooled"         // store unreachable: kept in the spool, 200; forwarded once the store is back
	outcomeSpoolFull         = "spool_full"      // store unreachable and the spool full: 503, nothing kept
	outcomeSpoolError        = "spool_error"     // store unreachable and the spool's disk failing: 503, nothing kept
	outcomeBodyUnkept        = "body_unkept"     // a body past 1 MiB could not be written to or read from its temporary file: 503
	outcomeBodyBudget        = "body_budget"     // the scope's body_budget was spent: 503, the body not read on
	// outcomeProviderGone: the provider hung up while its claim waited on
	// the store (its own timeout); no answer reaches it, a claim committed
	// for it is released, and with a spool the delivery is kept. Not a
	// store failure.
	outcomeProviderGone = "provider_gone"
	// complete_by upstream: a 2xx whose upstream did not commit its claim
	// (completed all the same); a claim whose upstream transaction still
	// held it when the wait ran out (left to its lease).
	outcomeUncommitted = "completed_uncommitted"
	outcomePending     = "commit_pending"
)

var allOutcomes = []string{outcomeCompleted, outcomeReleased, outcomeAmbiguous, outcomeAmbiguousReleased, outcomeDuplicate,
	outcomeInFlight, outcomeHeld, outcomeInvalidSignature, outcomeBadRequest, outcomeTooLarge,
	outcomeUnsupported, outcomeStoreError, outcomeHandshake, outcomeForwardedNoID, outcomeBodyReplay,
	outcomeQueued, outcomeReadTimeout, outcomeKeyReused, outcomeKeyUnavailable, outcomeSpooled, outcomeSpoolFull,
	outcomeSpoolError, outcomeBodyUnkept, outcomeBodyBudget, outcomeProviderGone, outcomeUncommitted, outcomePending}

// storeTimes are the store_duration_seconds series, one per operation,
// resolved once so no store call does a label lookup.
type storeTimes struct {
	claim, complete, release, hold, heartbeat prometheus.Observer
	enqueue, settleQueued, heartbeatQueued    prometheus.Observer
}

// claimTimers are the series internal/claim observes.
func (t storeTimes) claimTimers() claim.Timers {
	return claim.Timers{Claim: t.claim, Complete: t.complete, Release: t.release, Hold: t.hold, Heartbeat: t.heartbeat}
}

// observe records the time since t0.
func observe(o prometheus.Observer, t0 time.Time) { o.Observe(time.Since(t0).Seconds()) }

func initMetrics(reg *prometheus.Registry) error {
	metrics.once.Do(func() {
		metrics.deliveries = newCounterVec("deliveries_total",
			"Webhook deliveries by scope, provider and final outcome.", "scope", "provider", "outcome")
		metrics.store = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "store_duration_seconds",
			Help:    "Latency of store operations (claim, complete, release, hold, heartbeat) in seconds.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"operation"})
		metrics.upstream = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "upstream_duration_seconds",
			Help:    "Time the upstream took to answer a forwarded delivery, in seconds.",
			Buckets: prometheus.DefBuckets,
		}, []string{"scope", "provider"})
		metrics.inFlight = newGaugeVec("claims_in_flight",
			"Claims this instance holds while their deliveries are being forwarded.", "scope")
		metrics.cacheHits = newCounterVec("cache_hits_total",
			"Duplicates answered from the in-memory cache of completed event IDs.", "scope")
		metrics.cacheMiss = newCounterVec("cache_misses_total",
			"Lookups of the in-memory cache that had to ask the store.", "scope")
		metrics.bodyMismatch = newCounterVec("body_mismatch_total",
			"Completed event IDs that arrived again with a different body (dedupe_body), answered as duplicates.", "scope")
		metrics.reforwards = newCounterVec("ambiguous_reforwards_total",
			"Events forwarded again although an earlier forward of theirs may have run the upstream (it ended with no known outcome, or its lease expired): each may have run twice.", "scope")
		metrics.budgetHeld = newGaugeVec("body_budget_held_bytes",
			"Request body bytes held against body_budget (memory and temporary files), by scope.", "scope")
		metrics.budgetRefuse = newCounterVec("body_budget_refused_total",
			"Deliveries answered 503 because their scope's body_budget was spent, their body not read on.", "scope")
		op := metrics.store.WithLabelValues
		metrics.storeTime = storeTimes{
			claim: op("claim"), complete: op("complete"), release: op("release"), hold: op("hold"), heartbeat: op("heartbeat"),
			enqueue: op("enqueue"), settleQueued: op("settle_queued"), heartbeatQueued: op("heartbeat_queued"),
		}
	})
	return register(reg, metrics.deliveries, metrics.store, metrics.upstream,
		metrics.inFlight, metrics.cacheHits, metrics.cacheMiss, metrics.bodyMismatch, metrics.reforwards,
		metrics.budgetHeld, metrics.budgetRefuse, batchSizes, storeRetries)
}

// storeRetries counts store operations run again, by reason (the
// store.Retry* constants): serialization_failure and deadlock (a
// transaction the database rolled back, run again), connection_lost (a
// claim or settle whose connection was lost, tried once more on another). Like batchSizes, it exists
// before any handler.
var storeRetries = newCounterVec("store_retries_total",
	"Store operations run again, by reason: serialization_failure, deadlock (transactions PostgreSQL rolled back), connection_lost (a claim or settle whose connection was lost, tried once more on another).",
	"reason")

// observeRetry is the stores' postgres.Options.Retried.
func observeRetry(reason string) { storeRetries.WithLabelValues(reason).Inc() }

// batchSizes is the store's group commit: operations per batch written,
// by op (claim, complete, release, and transaction: all of a batch of the
// store's; enqueue: the async queue's deliveries per transaction). It
// exists before any handler, since stores are opened (and observe) before
// the handler's metrics are registered.
var batchSizes = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Namespace: ns, Subsystem: sub, Name: "store_batch_size",
	Help:    "Store operations written per batch (one transaction, one commit), by op: claim, complete, release, hold, transaction (a store batch's total), enqueue (async deliveries queued together).",
	Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128},
}, []string{"op"})

// batchObservers are batchSizes' series, resolved once.
var batchObservers = func() map[string]prometheus.Observer {
	m := map[string]prometheus.Observer{}
	for _, op := range []string{"claim", "complete", "release", "hold", "transaction", "enqueue"} {
		m[op] = batchSizes.WithLabelValues(op)
	}
	return m
}()

// observeBatch is the stores' store.BatchOptions.Observe and the queues'
// pgqueue.BatchOptions.Observe.
func observeBatch(op string, n int) {
	if o, ok := batchObservers[op]; ok {
		o.Observe(float64(n))
	}
}

// Every collector is named caddy_webhook_idempotency_<name>.
const ns, sub = "caddy", "webhook_idempotency"

func newCounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, labels)
}

func newGaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, labels)
}

// register registers the collectors on reg (Caddy's registry; nil in some
// tests), accepting those a previous config registered.
func register(reg *prometheus.Registry, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}

// provisionMetrics registers the collectors and resolves every series of
// the handler's scope and provider, so the request path does no label
// lookup.
func (h *Handler) provisionMetrics(ctx caddy.Context) error {
	if err := initMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	h.counters = make(map[string]prometheus.Counter, len(allOutcomes))
	for _, o := range allOutcomes {
		h.counters[o] = metrics.deliveries.WithLabelValues(h.Scope, h.Provider, o)
	}
	h.cacheHit = metrics.cacheHits.WithLabelValues(h.Scope)
	h.cacheMiss = metrics.cacheMiss.WithLabelValues(h.Scope)
	h.bodyMismatch = metrics.bodyMismatch.WithLabelValues(h.Scope)
	h.ambiguousReforwards = metrics.reforwards.WithLabelValues(h.Scope)
	h.claimsInFlight = metrics.inFlight.WithLabelValues(h.Scope)
	h.upstreamTime = metrics.upstream.WithLabelValues(h.Scope, h.Provider)
	return nil
}

// deliveries returns the counter of an outcome, resolved at Provision.
func (h *Handler) deliveries(outcome string) prometheus.Counter {
	if c, ok := h.counters[outcome]; ok {
		return c
	}
	return metrics.deliveries.WithLabelValues(h.Scope, h.Provider, outcome) // an outcome missing from allOutcomes
}

// Queue metrics, on Caddy's registry next to the handler's:
//
//	caddy_webhook_idempotency_queue_depth{scope,state}          queued and delivering events (all instances)
//	caddy_webhook_idempotency_queue_oldest_age_seconds{scope}   age of the oldest event not yet delivered
//	caddy_webhook_idempotency_queue_attempts_total{scope,outcome}  this instance's attempts: delivered, retry, dead, lost, released, lease_lost, settle_failed
//	caddy_webhook_idempotency_queue_dead_letters{scope}         dead events waiting for an operator (all instances)
var queueMetrics = struct {
	once     sync.Once
	depth    *prometheus.GaugeVec
	oldest   *prometheus.GaugeVec
	attempts *prometheus.CounterVec
	dead     *prometheus.GaugeVec
}{}

// initQueueMetrics creates the queue collectors once and registers them.
func initQueueMetrics(reg *prometheus.Registry) error {
	queueMetrics.once.Do(func() {
		queueMetrics.depth = newGaugeVec("queue_depth",
			"Events of the async queue waiting (queued) or in delivery, across all instances.", "scope", "state")
		queueMetrics.oldest = newGaugeVec("queue_oldest_age_seconds",
			"Age of the oldest queued or delivering event, in seconds; 0 when the queue is empty.", "scope")
		queueMetrics.attempts = newCounterVec("queue_attempts_total",
			"Delivery attempts of queued events made by this instance, by outcome.", "scope", "outcome")
		queueMetrics.dead = newGaugeVec("queue_dead_letters",
			"Dead events (out of attempts or max_age) waiting for an operator, across all instances.", "scope")
	})
	return register(reg, queueMetrics.depth, queueMetrics.oldest, queueMetrics.attempts, queueMetrics.dead)
}
