package caddymodule

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/dispatch"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
)

// The async request path: a verified delivery is stored with its claim in
// the queue and answered at once; internal/dispatch delivers it later. The
// config and its subdirectives are in caddyfile.go, the queue's admin API
// in queueadmin.go.

// Defaults of async mode, applied in Provision.
var defaultRetrySchedule = []time.Duration{
	5 * time.Second, time.Minute, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 8 * time.Hour, 24 * time.Hour,
}

const (
	// defaultMaxAge: the retry window of the providers themselves (Stripe
	// retries for about three days).
	defaultMaxAge = 72 * time.Hour
	// queuedStatus is the status recorded on the events row of an event
	// accepted into the queue (202 Accepted: the work is still to be done).
	queuedStatus = http.StatusAccepted
)

// asyncState is what a provisioned async handler holds.
type asyncState struct {
	cleanup  sync.Once
	qb       *queueBackend
	key      string
	reg      *dispatch.Registration
	orderKey *eventid.Extractor
}

// provisionAsync registers an async route with the process's dispatcher of
// the storage; in sync mode it does nothing. It runs after the store is
// open, on a config checkConfig has accepted (defaults in applyDefaults).
func (h *Handler) provisionAsync(ctx caddy.Context) error {
	if h.Mode != "async" {
		return nil
	}
	target, err := parseDeliverTo(caddy.NewReplacer().ReplaceAll(h.DeliverTo, ""))
	if err != nil {
		return fmt.Errorf("deliver_to: %w", err)
	}
	schedule := make([]time.Duration, len(h.RetrySchedule))
	for i, d := range h.RetrySchedule {
		schedule[i] = time.Duration(d)
	}
	st := &asyncState{}
	if h.OrderKey != nil {
		if st.orderKey, err = h.orderKeyExtractor(); err != nil {
			return err
		}
	}
	if err := initQueueMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering queue metrics: %w", err)
	}
	qb, err := openQueue(h.poolKey, h.backend)
	if err != nil {
		return fmt.Errorf("mode async: opening the queue: %w", err)
	}
	st.qb, st.key = qb, h.poolKey

	cfg := &dispatch.Route{
		Scope:          h.Scope,
		Target:         target,
		Schedule:       schedule,
		MaxAttempts:    h.MaxAttempts,
		MaxAge:         time.Duration(h.MaxAge),
		MaxConcurrency: h.MaxConcurrency,
		Lease:          time.Duration(h.Lease),
		Timeout:        time.Duration(h.ForwardTimeout),
		Retention:      time.Duration(h.Retention),
		KeepBody:       time.Duration(h.KeepBody),
		Logger:         h.logger,
	}
	if h.Rate != nil {
		cfg.Rate, cfg.Per = h.Rate.Events, time.Duration(h.Rate.Window)
	}
	st.reg = qb.d.Register(cfg)
	queueScopes.add(h.Scope, qb)
	h.async = st
	return nil
}

// cleanupAsync unregisters the route and releases the queue; the last
// handler using a queue stops its dispatcher gracefully. It runs before the
// store is released, so the dispatcher never outlives the store's pool.
func (h *Handler) cleanupAsync() {
	st := h.async
	if st == nil || st.reg == nil {
		return
	}
	st.cleanup.Do(func() {
		st.qb.d.Unregister(st.reg)
		queueScopes.remove(h.Scope, st.qb)
		if _, err := queues.Delete(st.key); err != nil && h.logger != nil {
			h.logger.Warn("stopping the queue dispatcher", zap.Error(err))
		}
	})
}

var queuedBody = []byte(`{"received":true,"queued":true}` + "\n")

// respondQueued answers a delivery that was stored for async delivery.
func respondQueued(w http.ResponseWriter) {
	writeAnswer(w, http.StatusOK, "application/json", queuedBody, 0)
}

// serveAsync stores a verified delivery and its claim in one transaction
// and answers at once: 200 queued, or the edge's duplicate / in-flight /
// held / unavailable answers. The upstream is never called here.
func (h *Handler) serveAsync(w http.ResponseWriter, r *http.Request, raw, signed []byte, id string, d *delivery) error {
	if status, ok := h.completed.Has(h.Scope, id); ok {
		h.cacheHit.Inc()
		d.outcome, d.status, d.cached = outcomeDuplicate, status, true
		respondDuplicate(w)
		return nil
	}
	if h.completed != nil {
		h.cacheMiss.Inc()
	}
	e := queue.Entry{
		Scope:   h.Scope,
		EventID: id,
		Request: queue.Request{
			Method: r.Method,
			URI:    r.URL.RequestURI(),
			Header: upstreamHeader(r),
			Body:   raw,
		},
		Claims:       []queue.Key{{Scope: h.Scope, EventID: id}},
		ClaimStatus:  queuedStatus,
		HoldOnExpiry: h.OnAmbiguous == "hold",
	}
	if h.dedupeBody {
		e.Claims = append(e.Claims, queue.Key{Scope: h.bodyScope(), EventID: bodyKey(signed)})
	}
	if h.async.orderKey != nil {
		k, err := h.async.orderKey.Extract(signed, r.Header)
		if err == nil {
			e.OrderKey = k
		} else if c := h.logger.Check(zap.DebugLevel, "delivery has no order key; queued unordered"); c != nil {
			c.Write(zap.String("scope", h.Scope), zap.String("event_id", id), zap.String("reason", eventIDReason(err)))
		}
	}

	ctx, cancel := context.WithTimeout(r.Context(), storeTimeout)
	t0 := time.Now()
	out, err := h.async.qb.q.Enqueue(ctx, e)
	observe(metrics.storeTime.enqueue, t0)
	cancel()
	if err != nil {
		d.outcome = outcomeStoreError
		h.logger.Warn("enqueueing event failed; answered 503, nothing stored",
			zap.String("scope", h.Scope), zap.String("event_id", id), zap.Error(err))
		respondError(w, http.StatusServiceUnavailable, "event store unavailable", unavailableRetryAfter)
		return nil
	}
	switch out.Outcome {
	case queue.Queued:
		d.outcome, d.status = outcomeQueued, queuedStatus
		h.completed.Add(h.Scope, id, queuedStatus)
		h.async.reg.Poke()
		respondQueued(w)
	case queue.Duplicate:
		d.outcome, d.status = outcomeDuplicate, queuedStatus
		if out.Refused == 1 {
			d.outcome = outcomeBodyReplay
			h.logger.Warn("body already accepted under another event id; answered as a duplicate, not queued (dedupe_body)",
				zap.String("scope", h.Scope), zap.String("event_id", id))
		} else {
			h.completed.Add(h.Scope, id, queuedStatus)
		}
		respondDuplicate(w)
	case queue.InFlight:
		d.outcome = outcomeInFlight
		respondError(w, http.StatusConflict, "event is being processed by another delivery; retry later", out.RetryAfter)
	case queue.Held:
		d.outcome = outcomeHeld
		respondError(w, http.StatusServiceUnavailable, "event is held after an ambiguous forward; an operator must release it", unavailableRetryAfter)
	default:
		return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("unexpected enqueue outcome %v", out.Outcome))
	}
	return nil
}

// hopHeaders are not stored: they describe the provider's connection, not
// the delivery (the same list reverse_proxy drops).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// upstreamHeader is what the upstream will get: the delivery's headers
// without hop-by-hop ones and Content-Length (set from the body), plus
// X-Forwarded-For, -Proto and -Host as reverse_proxy sets them.
func upstreamHeader(r *http.Request) http.Header {
	h := r.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
	h.Del("Content-Length")
	clientIP, _ := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
	if clientIP == "" {
		clientIP, _, _ = net.SplitHostPort(r.RemoteAddr)
	}
	if clientIP != "" {
		h.Set("X-Forwarded-For", clientIP)
	}
	proto := "http"
	if r.TLS != nil {
		proto = "https"
	}
	h.Set("X-Forwarded-Proto", proto)
	h.Set("X-Forwarded-Host", r.Host)
	return h
}
