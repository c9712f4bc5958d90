package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/dispatch"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
)

// Async mode (store-and-forward): its config, defaults, checks and
// Caddyfile subdirectives, the route's registration with the dispatcher,
// and its request path: a verified delivery is stored with its claim in
// the queue and answered at once; internal/dispatch delivers it later. The
// queue's admin API is in queueadmin.go.

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

// AsyncConfig is the store-and-forward mode of the handler. Its fields sit
// at the top level of the handler's JSON, spelled like the Caddyfile's
// subdirectives.
type AsyncConfig struct {
	// Mode is "sync" (the default): a verified, claimed delivery is forwarded
	// to the next handler while the provider waits, and the provider gets the
	// upstream's own answer; or "async": the delivery is stored in a durable
	// PostgreSQL queue together with its claim, in one transaction, and the
	// provider gets 200 {"received":true,"queued":true} at once; dispatchers
	// on every instance then deliver it to deliver_to, retrying until it is
	// delivered or dead. Async needs storage postgres.
	Mode string `json:"mode,omitempty"`

	// DeliverTo is the URL async mode delivers to (http or https). With no
	// path (or "/") the delivery's own path and query are appended, as
	// reverse_proxy does; with a path, that URL is used as is. The route's
	// next handler (reverse_proxy) is not used for queued events: the
	// provider's request has ended by the time an event is delivered.
	// Required in async mode. {env.NAME} placeholders are expanded.
	DeliverTo string `json:"deliver_to,omitempty"`

	// MaxAttempts is how many attempts an event gets before it is dead.
	// Default: one more than the entries of retry_schedule (8).
	MaxAttempts int `json:"max_attempts,omitempty"`

	// MaxAge is how long after it was received an event is retried; an
	// attempt that would fall later makes it dead. At most retention.
	// Default: 72h.
	MaxAge caddy.Duration `json:"max_age,omitempty"`

	// RetrySchedule is the delay before each retry: the first entry after
	// the first failed attempt, and so on; the last entry repeats. Each
	// delay gets ±20% random jitter. Default: 5s 1m 5m 30m 2h 8h 24h.
	RetrySchedule []caddy.Duration `json:"retry_schedule,omitempty"`

	// MaxConcurrency caps the deliveries of this scope in flight at once
	// across every gateway instance sharing the database (enforced in the
	// database, not per process). Default 0: no cap (each instance runs up
	// to 16 at once).
	MaxConcurrency int `json:"max_concurrency,omitempty"`

	// Rate caps the delivery attempts of this scope started in any window,
	// across every instance. Default: no cap.
	Rate *RateLimit `json:"rate,omitempty"`

	// OrderKey makes events of the scope that share a key (read from the
	// body with json <path>, or from a header) be delivered one at a time,
	// in the order they were received; an event without the key is
	// delivered unordered. Default: no ordering.
	OrderKey *eventid.Source `json:"order_key,omitempty"`

	// KeepBody drops the body and headers of delivered events this long
	// after delivery, before retention deletes their rows. Default 0: kept
	// until retention.
	KeepBody caddy.Duration `json:"keep_body,omitempty"`

	async *asyncState
}

// RateLimit is a number of delivery attempts per window.
type RateLimit struct {
	// Events is the most attempts started in any window.
	Events int `json:"events,omitempty"`
	// Window is the length of the sliding window.
	Window caddy.Duration `json:"window,omitempty"`
}

// asyncDefaults applies async mode's defaults (part of applyDefaults):
// the retry schedule, max_attempts one more than its entries, max_age the
// providers' retry window or retention when shorter.
func (h *Handler) asyncDefaults() {
	if h.Mode == "" {
		h.Mode = "sync"
	}
	if h.Mode != "async" {
		return
	}
	if len(h.RetrySchedule) == 0 {
		for _, d := range defaultRetrySchedule {
			h.RetrySchedule = append(h.RetrySchedule, caddy.Duration(d))
		}
	}
	if h.MaxAttempts == 0 {
		h.MaxAttempts = len(h.RetrySchedule) + 1
	}
	if h.MaxAge == 0 {
		h.MaxAge = caddy.Duration(min(defaultMaxAge, time.Duration(h.Retention)))
	}
}

// checkAsync checks mode and the fields of async mode: in sync mode none
// may be set.
func (h *Handler) checkAsync() error {
	if h.OrderKey != nil {
		if _, err := h.orderKeyExtractor(); err != nil {
			return err
		}
	}
	switch h.Mode {
	case "sync":
		for _, f := range []struct {
			name string
			set  bool
		}{
			{"deliver_to", h.DeliverTo != ""}, {"max_attempts", h.MaxAttempts != 0}, {"max_age", h.MaxAge != 0},
			{"retry_schedule", len(h.RetrySchedule) > 0}, {"max_concurrency", h.MaxConcurrency != 0},
			{"rate", h.Rate != nil}, {"order_key", h.OrderKey != nil}, {"keep_body", h.KeepBody != 0},
		} {
			if f.set {
				return fmt.Errorf("%s: only with mode async", f.name)
			}
		}
		return nil
	case "async":
	default:
		return fmt.Errorf("mode: want sync or async, got %q", h.Mode)
	}
	if !h.hasQueue() {
		return errors.New("mode: async needs storage postgres (the queue is a PostgreSQL table, shared by every instance)")
	}
	if _, err := parseDeliverTo(caddy.NewReplacer().ReplaceAll(h.DeliverTo, "")); err != nil {
		return fmt.Errorf("deliver_to: %w", err)
	}
	for _, d := range h.RetrySchedule {
		if d <= 0 {
			return fmt.Errorf("retry_schedule: delays must be positive, got %s", time.Duration(d))
		}
	}
	switch {
	case h.MaxAttempts < 1:
		return fmt.Errorf("max_attempts: must be at least 1, got %d", h.MaxAttempts)
	case h.MaxAge < 0 || h.MaxAge > h.Retention:
		return fmt.Errorf("max_age: must be positive and at most retention (%s), got %s",
			time.Duration(h.Retention), time.Duration(h.MaxAge))
	case h.MaxConcurrency < 0:
		return fmt.Errorf("max_concurrency: must be positive, got %d", h.MaxConcurrency)
	case h.KeepBody < 0:
		return fmt.Errorf("keep_body: must be positive, got %s", time.Duration(h.KeepBody))
	case h.Rate != nil && (h.Rate.Events < 1 || h.Rate.Window <= 0):
		return errors.New("rate: want a positive number of events per positive window")
	}
	return nil
}

// orderKeyExtractor builds the extractor of order_key.
func (h *Handler) orderKeyExtractor() (*eventid.Extractor, error) {
	if h.OrderKey.Kind != eventid.JSON && h.OrderKey.Kind != eventid.Header {
		return nil, fmt.Errorf("order_key: want json <path> or header <name>, got %q", h.OrderKey.Kind)
	}
	x, err := eventid.New([][]eventid.Source{{*h.OrderKey}})
	if err != nil {
		return nil, fmt.Errorf("order_key: %w", err)
	}
	return x, nil
}

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
	if validateOnly() {
		// A registered route starts delivering the queue at once: a
		// config being validated (perhaps with another deliver_to) must
		// not send the running gateway's events.
		return nil
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
		// complete_by upstream: each attempt carries its queue claim and
		// is settled by the queue row (internal/dispatch).
		CompleteByUpstream: h.byUpstream(),
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

// clientIP is the provider's address as Caddy determined it (trusted
// proxies applied), for X-Forwarded-For.
func clientIP(r *http.Request) string {
	ip, _ := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
	return ip
}

// asyncMode is mode async: a verified delivery is stored with its claim
// in one transaction and answered at once: 200 queued, or the edge's
// duplicate / in-flight / held / unavailable answers. The upstream is
// never called here.
type asyncMode struct{ h *Handler }

func (m asyncMode) serve(w http.ResponseWriter, _ caddyhttp.Handler, d *delivery) error {
	h, r, id := m.h, d.r, d.eventID
	if h.answerCached(w, d, false) {
		return nil
	}
	e := queue.Entry{
		Scope:   h.Scope,
		EventID: id,
		Request: queue.Request{
			Method: r.Method,
			URI:    r.URL.RequestURI(),
			Header: dispatch.Header(r, clientIP(r)),
			Body:   d.raw,
		},
		Claims:       []queue.Key{{Scope: h.Scope, EventID: id}},
		ClaimStatus:  queuedStatus,
		HoldOnExpiry: h.OnAmbiguous == "hold",
	}
	if h.replayRecord { // replayguard.go
		e.Claims = append(e.Claims, queue.Key{Scope: h.bodyScope(), EventID: h.replayKey(id, d.covered())})
	}
	if h.async.orderKey != nil {
		k, err := h.async.orderKey.Extract(d.signed, r.Header)
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
		if h.providerGone(d, false) {
			return nil
		}
		h.warnThrottled("enqueueing event failed; answered 503, nothing stored",
			zap.String("scope", h.Scope), zap.String("event_id", id), zap.Error(err))
		h.answer(w, d, ansStoreUnavailable, say{})
		return nil
	}
	switch out.Outcome {
	case queue.Queued:
		d.status = queuedStatus
		h.completed.Add(h.Scope, id, queuedStatus)
		h.async.reg.Poke()
		h.answer(w, d, ansQueued, say{})
	case queue.Duplicate:
		d.status = queuedStatus
		if out.Refused == 1 {
			h.logger.Warn(replayedMessage(h.dedupeBody, "queued"), zap.String("scope", h.Scope), zap.String("event_id", id))
			h.answer(w, d, ansBodyReplay, say{})
			return nil
		}
		h.completed.Add(h.Scope, id, queuedStatus)
		h.answer(w, d, ansDuplicate, say{})
	case queue.InFlight:
		h.answer(w, d, ansInFlight, say{retryAfter: out.RetryAfter})
	case queue.Held:
		h.answer(w, d, ansHeld, say{})
	default:
		return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("unexpected enqueue outcome %v", out.Outcome))
	}
	return nil
}

// asyncValues are the subdirectives of async mode that take one string or
// duration (oneValue).
func (h *Handler) asyncValues() map[string]any {
	return map[string]any{"mode": &h.Mode, "deliver_to": &h.DeliverTo, "max_age": &h.MaxAge, "keep_body": &h.KeepBody}
}

// unmarshalAsync parses the other subdirectives of async mode:
//
//	mode            sync | async
//	deliver_to      <url>
//	max_attempts    <n>
//	max_age         <duration>
//	retry_schedule  <duration>...
//	max_concurrency <n>
//	rate            <n>/<duration>
//	order_key       json <path> | header <name>
//	keep_body       <duration>
func (h *Handler) unmarshalAsync(d *caddyfile.Dispenser, name string) error {
	switch name {
	case "max_attempts", "max_concurrency":
		var s string
		if !d.AllArgs(&s) {
			return d.ArgErr()
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return d.Errf("%s: want a positive number, got %q", name, s)
		}
		if name == "max_attempts" {
			h.MaxAttempts = n
		} else {
			h.MaxConcurrency = n
		}
	case "retry_schedule":
		args := d.RemainingArgs()
		if len(args) == 0 {
			return d.Errf("retry_schedule: want one or more durations")
		}
		for _, a := range args {
			dur, err := caddy.ParseDuration(a)
			if err != nil || dur <= 0 {
				return d.Errf("retry_schedule: invalid duration %q", a)
			}
			h.RetrySchedule = append(h.RetrySchedule, caddy.Duration(dur))
		}
	case "rate":
		var s string
		if !d.AllArgs(&s) {
			return d.ArgErr()
		}
		r, err := parseRate(s)
		if err != nil {
			return d.Errf("rate: %v", err)
		}
		h.Rate = r
	case "order_key":
		var kind, arg string
		if !d.AllArgs(&kind, &arg) {
			return d.Errf("order_key: want json <path> or header <name>")
		}
		s, err := eventid.ParseSource(kind, arg)
		if err != nil {
			return d.Errf("order_key: %v", err)
		}
		h.OrderKey = &s
	default:
		return d.Errf("unknown subdirective %q", name)
	}
	return nil
}

// parseRate parses "<n>/<duration>", e.g. 10/1s, 600/1m or 10/s.
func parseRate(s string) (*RateLimit, error) {
	ns, ws, ok := strings.Cut(s, "/")
	if !ok {
		return nil, fmt.Errorf("want <n>/<duration>, e.g. 10/1s, got %q", s)
	}
	n, err := strconv.Atoi(ns)
	if err != nil || n < 1 {
		return nil, fmt.Errorf("want a positive number of events, got %q", ns)
	}
	if ws != "" && (ws[0] < '0' || ws[0] > '9') {
		ws = "1" + ws // 10/s
	}
	w, err := caddy.ParseDuration(ws)
	if err != nil || w <= 0 {
		return nil, fmt.Errorf("invalid window %q", ws)
	}
	return &RateLimit{Events: n, Window: caddy.Duration(w)}, nil
}

// parseDeliverTo checks deliver_to: an absolute http(s) URL with a host.
func parseDeliverTo(s string) (*url.URL, error) {
	if s == "" {
		return nil, errors.New("required in async mode: the URL queued events are delivered to")
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("want an absolute http or https URL, got %q", s)
	}
	if u.Fragment != "" {
		return nil, errors.New("a URL without a #fragment")
	}
	return u, nil
}
