package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net"
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

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
	pgstore "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

func init() {
	caddy.RegisterModule(QueueAdmin{})
}

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
	// outcomeQueued counts deliveries stored for async delivery.
	outcomeQueued = "queued"
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

// asyncState is what a provisioned async handler holds.
type asyncState struct {
	cleanup  sync.Once
	qb       *queueBackend
	key      string
	reg      *registration
	orderKey *eventid.Extractor
}

// unmarshalAsync parses one subdirective of async mode:
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
	case "mode":
		if !d.AllArgs(&h.Mode) {
			return d.ArgErr()
		}
		if h.Mode != "sync" && h.Mode != "async" {
			return d.Errf("mode: want sync or async, got %q", h.Mode)
		}
	case "deliver_to":
		if !d.AllArgs(&h.DeliverTo) {
			return d.ArgErr()
		}
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
	case "max_age", "keep_body":
		dur, err := durationArg(d)
		if err != nil {
			return err
		}
		if name == "max_age" {
			h.MaxAge = dur
		} else {
			h.KeepBody = dur
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
		if kind != string(eventid.JSON) && kind != string(eventid.Header) {
			return d.Errf("order_key: want json <path> or header <name>, got %q", kind)
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

// provisionAsync applies async mode's defaults, checks its config, and
// registers the route with the process's dispatcher of the storage. It runs
// after the store is open; in sync mode it only checks that no async field
// is set.
func (h *Handler) provisionAsync(ctx caddy.Context) error {
	if h.Mode == "" {
		h.Mode = "sync"
	}
	switch h.Mode {
	case "sync":
		for name, set := range map[string]bool{
			"deliver_to": h.DeliverTo != "", "max_attempts": h.MaxAttempts != 0, "max_age": h.MaxAge != 0,
			"retry_schedule": len(h.RetrySchedule) > 0, "max_concurrency": h.MaxConcurrency != 0,
			"rate": h.Rate != nil, "order_key": h.OrderKey != nil, "keep_body": h.KeepBody != 0,
		} {
			if set {
				return fmt.Errorf("%s: only with mode async", name)
			}
		}
		return nil
	case "async":
	default:
		return fmt.Errorf("mode: want sync or async, got %q", h.Mode)
	}
	if h.Storage == nil || h.Storage.Backend != "postgres" {
		return errors.New("mode: async needs storage postgres (the queue is a PostgreSQL table, shared by every instance)")
	}
	target, err := parseDeliverTo(caddy.NewReplacer().ReplaceAll(h.DeliverTo, ""))
	if err != nil {
		return fmt.Errorf("deliver_to: %w", err)
	}
	if len(h.RetrySchedule) == 0 {
		for _, d := range defaultRetrySchedule {
			h.RetrySchedule = append(h.RetrySchedule, caddy.Duration(d))
		}
	}
	schedule := make([]time.Duration, len(h.RetrySchedule))
	for i, d := range h.RetrySchedule {
		if d <= 0 {
			return fmt.Errorf("retry_schedule: delays must be positive, got %s", time.Duration(d))
		}
		schedule[i] = time.Duration(d)
	}
	if h.MaxAttempts == 0 {
		h.MaxAttempts = len(schedule) + 1
	}
	if h.MaxAge == 0 {
		h.MaxAge = caddy.Duration(min(defaultMaxAge, time.Duration(h.Retention)))
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
	st := &asyncState{}
	if h.OrderKey != nil {
		if h.OrderKey.Kind != eventid.JSON && h.OrderKey.Kind != eventid.Header {
			return fmt.Errorf("order_key: want json <path> or header <name>, got %q", h.OrderKey.Kind)
		}
		if st.orderKey, err = eventid.New([][]eventid.Source{{*h.OrderKey}}); err != nil {
			return fmt.Errorf("order_key: %w", err)
		}
	}
	if err := initQueueMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering queue metrics: %w", err)
	}
	table := h.Storage.Table
	if table == "" {
		table = pgstore.DefaultTable
	}
	qb, err := openQueue(h.poolKey, h.backend, table)
	if err != nil {
		return fmt.Errorf("mode async: opening the queue: %w", err)
	}
	st.qb, st.key = qb, h.poolKey

	cfg := &routeConfig{
		scope:          h.Scope,
		target:         target,
		schedule:       schedule,
		maxAttempts:    h.MaxAttempts,
		maxAge:         time.Duration(h.MaxAge),
		maxConcurrency: h.MaxConcurrency,
		lease:          time.Duration(h.Lease),
		timeout:        time.Duration(h.ForwardTimeout),
		retention:      time.Duration(h.Retention),
		keepBody:       time.Duration(h.KeepBody),
		logger:         h.logger,
	}
	if h.Rate != nil {
		cfg.rate, cfg.per = h.Rate.Events, time.Duration(h.Rate.Window)
	}
	st.reg = qb.d.register(qb, cfg)
	h.async = st
	return nil
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

// cleanupAsync unregisters the route and releases the queue; the last
// handler using a queue stops its dispatcher gracefully. It runs before the
// store is released, so the dispatcher never outlives the store's pool.
func (h *Handler) cleanupAsync() {
	st := h.async
	if st == nil || st.reg == nil {
		return
	}
	st.cleanup.Do(func() {
		st.qb.d.unregister(st.reg)
		if _, err := queues.Delete(st.key); err != nil && h.logger != nil {
			h.logger.Warn("stopping the queue dispatcher", zap.Error(err))
		}
	})
}

var queuedBody = []byte(`{"received":true,"queued":true}` + "\n")

// respondQueued answers a delivery that was stored for async delivery.
func respondQueued(w http.ResponseWriter) {
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Content-Length", strconv.Itoa(len(queuedBody)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(queuedBody)
}

// serveAsync stores a verified delivery and its claim in one transaction
// and answers at once: 200 queued, or the edge's duplicate / in-flight /
// held / unavailable answers. The upstream is never called here.
func (h *Handler) serveAsync(w http.ResponseWriter, r *http.Request, raw, signed []byte, id string, d *delivery) error {
	if status, ok := h.completed.Has(h.Scope, id); ok {
		metrics.cacheHits.WithLabelValues(h.Scope).Inc()
		d.outcome, d.status, d.cached = outcomeDuplicate, status, true
		respondDuplicate(w)
		return nil
	}
	if h.completed != nil {
		metrics.cacheMiss.WithLabelValues(h.Scope).Inc()
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
	metrics.store.WithLabelValues("enqueue").Observe(time.Since(t0).Seconds())
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
		h.async.reg.rt.poke()
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

// QueueAdmin is the admin API of async mode, on Caddy's admin endpoint
// (module admin.api.webhook_idempotency_queue):
//
//	GET    /webhook_idempotency/queue/                                 every scope: queued, delivering, dead, oldest age
//	GET    /webhook_idempotency/queue/{scope}/events?state=dead&limit=100&after_id=N
//	GET    /webhook_idempotency/queue/{scope}/events/{id}              one event and its attempts
//	POST   /webhook_idempotency/queue/{scope}/events/{id}/retry        a dead event: due now, a fresh round of attempts
//	POST   /webhook_idempotency/queue/{scope}/retry                    every dead event of the scope, the same
//	DELETE /webhook_idempotency/queue/{scope}/events/{id}              purge one event (not while in delivery)
//	DELETE /webhook_idempotency/queue/{scope}/events?state=dead        purge every event in a state (dead, delivered, queued)
//
// Scope and ID are percent-encoded path segments. Answers and errors are
// JSON. Purging removes the queue row only: the event's claim stays, so the
// provider's redelivery is still answered as a duplicate. Bodies are never
// shown.
type QueueAdmin struct{}

// CaddyModule returns the Caddy module information.
func (QueueAdmin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.webhook_idempotency_queue",
		New: func() caddy.Module { return new(QueueAdmin) },
	}
}

const queueAdminPrefix = "/webhook_idempotency/queue/"

// Routes returns the admin routes.
func (a *QueueAdmin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: queueAdminPrefix, Handler: guardAdmin(queueAdminLogger, a.serve)}}
}

// queueScopes maps each scope of a provisioned async handler to its queue
// backends, so the admin API finds an event's queue.
var queueScopes = struct {
	sync.Mutex
	m map[string]map[*queueBackend]int
}{m: map[string]map[*queueBackend]int{}}

func registerQueueScope(scope string, qb *queueBackend) {
	queueScopes.Lock()
	defer queueScopes.Unlock()
	if queueScopes.m[scope] == nil {
		queueScopes.m[scope] = map[*queueBackend]int{}
	}
	queueScopes.m[scope][qb]++
}

func unregisterQueueScope(scope string, qb *queueBackend) {
	queueScopes.Lock()
	defer queueScopes.Unlock()
	if n := queueScopes.m[scope][qb]; n > 1 {
		queueScopes.m[scope][qb] = n - 1
		return
	}
	delete(queueScopes.m[scope], qb)
	if len(queueScopes.m[scope]) == 0 {
		delete(queueScopes.m, scope)
	}
}

// queuesFor returns the queue backends of a scope; with scope "" every
// scope and its backends.
func queuesFor(scope string) map[string][]*queueBackend {
	queueScopes.Lock()
	defer queueScopes.Unlock()
	out := map[string][]*queueBackend{}
	for s, qbs := range queueScopes.m {
		if scope != "" && s != scope {
			continue
		}
		for qb := range qbs {
			out[s] = append(out[s], qb)
		}
	}
	return out
}

// QueuedEventJSON is a queued event as the admin API shows it.
type QueuedEventJSON struct {
	ID            int64         `json:"id"`
	Scope         string        `json:"scope"`
	EventID       string        `json:"event_id"`
	State         string        `json:"state"`
	OrderKey      string        `json:"order_key,omitempty"`
	Attempts      int           `json:"attempts"`
	RoundAttempts int           `json:"round_attempts"`
	Method        string        `json:"method"`
	URI           string        `json:"uri"`
	BodySize      int           `json:"body_size"`
	BodyKept      bool          `json:"body_kept"`
	ReceivedAt    time.Time     `json:"received_at"`
	UpdatedAt     time.Time     `json:"updated_at"`
	NextAttemptAt *time.Time    `json:"next_attempt_at,omitempty"`
	LeaseUntil    *time.Time    `json:"lease_until,omitempty"`
	DeliveredAt   *time.Time    `json:"delivered_at,omitempty"`
	LastStatus    int           `json:"last_status,omitempty"`
	LastError     string        `json:"last_error,omitempty"`
	History       []AttemptJSON `json:"history,omitempty"`
}

// AttemptJSON is one delivery attempt as the admin API shows it.
type AttemptJSON struct {
	Attempt    int        `json:"attempt"`
	Worker     string     `json:"worker"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	DurationMS float64    `json:"duration_ms"`
	Status     int        `json:"status,omitempty"`
	Error      string     `json:"error,omitempty"`
	Outcome    string     `json:"outcome"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func queuedEventJSON(e queue.Event) QueuedEventJSON {
	out := QueuedEventJSON{ID: e.ID, Scope: e.Scope, EventID: e.EventID, State: string(e.State), OrderKey: e.OrderKey,
		Attempts: e.Attempts, RoundAttempts: e.RoundAttempts, Method: e.Method, URI: e.URI, BodySize: e.BodySize,
		BodyKept: e.BodyKept, ReceivedAt: e.ReceivedAt.UTC(), UpdatedAt: e.UpdatedAt.UTC(),
		LeaseUntil: timePtr(e.LeaseUntil), DeliveredAt: timePtr(e.DeliveredAt), LastStatus: e.LastStatus, LastError: e.LastError}
	if e.State == queue.StateQueued {
		out.NextAttemptAt = timePtr(e.RunAt)
	}
	return out
}

func (a *QueueAdmin) serve(w http.ResponseWriter, r *http.Request) error {
	rest := strings.TrimSuffix(strings.TrimPrefix(r.URL.EscapedPath(), queueAdminPrefix), "/")
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	if rest == "" {
		if r.Method != http.MethodGet {
			return apiErr(http.StatusMethodNotAllowed, "method %s not allowed", r.Method)
		}
		return a.overview(ctx, w)
	}
	parts := strings.Split(rest, "/")
	for i, p := range parts {
		u, err := url.PathUnescape(p)
		if err != nil || u == "" {
			return apiErr(http.StatusBadRequest, "bad path segment %q", p)
		}
		parts[i] = u
	}
	scope := parts[0]
	qbs := queuesFor(scope)[scope]
	if len(qbs) == 0 {
		return apiErr(http.StatusNotFound, "no async handler has scope %q", scope)
	}
	switch {
	case len(parts) == 2 && parts[1] == "retry" && r.Method == http.MethodPost:
		total := 0
		for _, qb := range qbs {
			n, err := qb.q.RetryDead(ctx, scope)
			if err != nil {
				return apiErr(http.StatusServiceUnavailable, "queue unavailable: %v", err)
			}
			total += n
			qb.d.poke(scope)
		}
		return writeJSON(w, map[string]any{"scope": scope, "retried": total})
	case len(parts) == 2 && parts[1] == "events":
		return a.events(ctx, w, r, scope, qbs)
	case len(parts) == 3 && parts[1] == "events":
		return a.event(ctx, w, r, scope, parts[2], qbs)
	case len(parts) == 4 && parts[1] == "events" && parts[3] == "retry":
		if r.Method != http.MethodPost {
			return apiErr(http.StatusMethodNotAllowed, "method %s not allowed", r.Method)
		}
		return eachQueue(qbs, func(qb *queueBackend) error {
			err := qb.q.Retry(ctx, scope, parts[2])
			if err == nil {
				qb.d.poke(scope)
			}
			return err
		}, func() error {
			return writeJSON(w, map[string]any{"scope": scope, "event_id": parts[2], "retried": true})
		})
	}
	return apiErr(http.StatusNotFound, "unknown admin path; see %s{scope}/events", queueAdminPrefix)
}

// eachQueue runs op on each backend until one finds the event, and answers
// with ok, or the error of the refusal.
func eachQueue(qbs []*queueBackend, op func(*queueBackend) error, ok func() error) error {
	for _, qb := range qbs {
		err := op(qb)
		switch {
		case err == nil:
			return ok()
		case errors.Is(err, queue.ErrNotFound):
			continue
		case errors.Is(err, queue.ErrConflict):
			return apiErr(http.StatusConflict, "%v", err)
		default:
			return apiErr(http.StatusServiceUnavailable, "queue unavailable: %v", err)
		}
	}
	return apiErr(http.StatusNotFound, "queued event not found")
}

func (a *QueueAdmin) overview(ctx context.Context, w http.ResponseWriter) error {
	type scopeStats struct {
		Scope      string  `json:"scope"`
		Queued     int     `json:"queued"`
		Delivering int     `json:"delivering"`
		Dead       int     `json:"dead"`
		OldestAge  float64 `json:"oldest_age_seconds"`
	}
	out := []scopeStats{}
	for scope, qbs := range queuesFor("") {
		s := scopeStats{Scope: scope}
		for _, qb := range qbs {
			st, err := qb.q.Stats(ctx, scope)
			if err != nil {
				return apiErr(http.StatusServiceUnavailable, "queue unavailable: %v", err)
			}
			s.Queued += st.Queued
			s.Delivering += st.Delivering
			s.Dead += st.Dead
			s.OldestAge = max(s.OldestAge, st.OldestAge.Seconds())
		}
		out = append(out, s)
	}
	return writeJSON(w, map[string]any{"scopes": out})
}

func (a *QueueAdmin) events(ctx context.Context, w http.ResponseWriter, r *http.Request, scope string, qbs []*queueBackend) error {
	q := r.URL.Query()
	state := queue.State(q.Get("state"))
	if state != "" && !state.Valid() {
		return apiErr(http.StatusBadRequest, "state: want queued, delivering, delivered or dead")
	}
	switch r.Method {
	case http.MethodGet:
	case http.MethodDelete:
		if state == "" || state == queue.StateDelivering {
			return apiErr(http.StatusBadRequest, "state: purge wants state=dead, delivered or queued")
		}
		total := 0
		for _, qb := range qbs {
			n, err := qb.q.PurgeState(ctx, scope, state)
			total += n
			if err != nil {
				return apiErr(http.StatusServiceUnavailable, "queue unavailable after purging %d: %v", total, err)
			}
		}
		return writeJSON(w, map[string]any{"scope": scope, "state": state, "purged": total})
	default:
		return apiErr(http.StatusMethodNotAllowed, "method %s not allowed", r.Method)
	}
	lq := queue.ListQuery{Scope: scope, State: state, Limit: 100}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return apiErr(http.StatusBadRequest, "limit: want 1..1000")
		}
		lq.Limit = n
	}
	if v := q.Get("after_id"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return apiErr(http.StatusBadRequest, "after_id: want the id of the last event of the previous page")
		}
		lq.AfterID = n
	}
	events := []QueuedEventJSON{}
	for _, qb := range qbs {
		evs, err := qb.q.List(ctx, lq)
		if err != nil {
			return apiErr(http.StatusServiceUnavailable, "queue unavailable: %v", err)
		}
		for _, e := range evs {
			events = append(events, queuedEventJSON(e))
		}
	}
	out := map[string]any{"events": events}
	if len(events) >= lq.Limit {
		out["next"] = map[string]int64{"after_id": events[len(events)-1].ID}
	}
	return writeJSON(w, out)
}

func (a *QueueAdmin) event(ctx context.Context, w http.ResponseWriter, r *http.Request, scope, id string, qbs []*queueBackend) error {
	switch r.Method {
	case http.MethodGet:
		var ev queue.Event
		var found *queueBackend
		err := eachQueue(qbs, func(qb *queueBackend) error {
			e, err := qb.q.Get(ctx, scope, id)
			ev, found = e, qb
			return err
		}, func() error { return nil })
		if err != nil {
			return err
		}
		out := queuedEventJSON(ev)
		as, err := found.q.Attempts(ctx, ev.ID)
		if err != nil {
			return apiErr(http.StatusServiceUnavailable, "queue unavailable: %v", err)
		}
		for _, a := range as {
			out.History = append(out.History, AttemptJSON{Attempt: a.Attempt, Worker: a.Worker, StartedAt: a.StartedAt.UTC(),
				FinishedAt: timePtr(a.FinishedAt), DurationMS: float64(a.Duration.Microseconds()) / 1000,
				Status: a.Status, Error: a.Error, Outcome: a.Outcome})
		}
		return writeJSON(w, out)
	case http.MethodDelete:
		return eachQueue(qbs, func(qb *queueBackend) error { return qb.q.Purge(ctx, scope, id) }, func() error {
			return writeJSON(w, map[string]any{"scope": scope, "event_id": id, "purged": true})
		})
	}
	return apiErr(http.StatusMethodNotAllowed, "method %s not allowed", r.Method)
}

// Interface guards
var (
	_ caddy.AdminRouter = (*QueueAdmin)(nil)
)
