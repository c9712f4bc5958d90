// Package caddymodule is the Caddy v2 HTTP handler webhook_idempotency: it
// verifies a webhook delivery's signature over the raw body, claims the
// provider's event ID in a store before forwarding, forwards the delivery to
// the next handler (normally reverse_proxy) once, and answers redeliveries of
// completed events at the edge.
package caddymodule

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/cache"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/lease"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/sendonce"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Defaults applied in Provision when a field is zero.
const (
	defaultTolerance      = 5 * time.Minute
	defaultLease          = 30 * time.Second
	defaultRetention      = 30 * 24 * time.Hour
	defaultReplayWindow   = 400 * 24 * time.Hour
	defaultMaxBody        = 5_000_000 // 5MB, as humanize parses "5MB"
	defaultCache          = 100_000
	defaultForwardTimeout = 5 * time.Minute
	defaultReadTimeout    = 10 * time.Second
	// storeTimeout bounds every store call on the request path.
	storeTimeout = 5 * time.Second
	// unavailableRetryAfter is the Retry-After of a 503 when the store fails.
	unavailableRetryAfter = 5 * time.Second
	// minRetention: providers retry for days (Stripe about 3 days); a shorter
	// retention would forget an event while its redeliveries still come.
	minRetention = 72 * time.Hour
	// retentionBatch is the most rows one retention statement deletes.
	retentionBatch = 1000
)

// Handler makes a non-idempotent webhook endpoint safe against at-least-once
// delivery. The README's "How it works" and "Guarantees, stated honestly"
// sections state the behaviour.
type Handler struct {
	// Provider names the signature scheme and the default event ID source:
	// stripe, github, shopify, standard, slack, paddle, square, hmac, and the
	// other presets of the signature package. Required.
	Provider string `json:"provider,omitempty"`

	// Secrets are the signing secrets; a delivery is accepted when any one of
	// them verifies it, so a secret can be rotated without downtime. Use
	// {env.NAME} placeholders: they are expanded at provision time and never
	// stored in the config the admin API shows. Never logged. Required.
	Secrets []string `json:"secrets,omitempty"`

	// Tolerance is how far a signed timestamp may be from the gateway's clock,
	// in the past or the future, for schemes that sign one. Default: the
	// provider's own (5m for most).
	Tolerance caddy.Duration `json:"tolerance,omitempty"`

	// URL is the public URL the provider delivers to, for schemes that sign
	// it (square, twilio). The request's Host and X-Forwarded-* headers are
	// never used instead.
	URL string `json:"url,omitempty"`

	// EventID lists where the event ID is read from; several sources form one
	// composite key. Default: the provider's own ID (required for hmac).
	EventID []eventid.Source `json:"event_id,omitempty"`

	// Scope namespaces event IDs, so two routes (or two shops) with the same
	// IDs don't collide. Default: the provider name.
	Scope string `json:"scope,omitempty"`

	// Storage says where claims are recorded. Default: an SQLite file in
	// Caddy's data directory (single instance only); use postgres to run
	// several instances.
	Storage *Storage `json:"storage,omitempty"`

	// Lease is how long a claim stays live without a heartbeat; the gateway
	// renews it while the forward runs, so it expires only when the gateway
	// holding it died. Default: 30s.
	Lease caddy.Duration `json:"lease,omitempty"`

	// Retention is how long event rows are kept. Must be at least 72h, the
	// retry window of the providers. Default: 30 days.
	Retention caddy.Duration `json:"retention,omitempty"`

	// ReplayWindow is how long the body hashes of dedupe_body are kept,
	// counted from the delivery's first arrival. A provider that signs no
	// timestamp (github, shopify, gitlab, ...) makes a captured delivery
	// valid forever: while its body hash is kept, a replay is answered as
	// a duplicate even after retention deleted the event's row. A body-hash
	// row is a SHA-256 and its times: about 470 bytes in PostgreSQL with its
	// indexes, 330 in SQLite (measured; see docs/operations.md, Retention), so about 470 MB
	// per million deliveries kept. Must be at least retention; only with
	// dedupe_body. Default: 400 days, or retention when that is longer.
	ReplayWindow caddy.Duration `json:"replay_window,omitempty"`

	// MaxBody is the largest accepted body, in bytes, after decoding a gzip
	// body. Larger deliveries get 413. Default: 5000000 (5MB).
	MaxBody int64 `json:"max_body,omitempty"`

	// Cache is how many completed event IDs are held in memory to answer
	// duplicates without a store round trip; nil means 100000, 0 disables
	// the cache. Entries live at most 1 minute, the longest another instance can
	// answer an event forgotten through the admin API as a duplicate.
	Cache *int `json:"cache,omitempty"`

	// ForwardTimeout bounds one forward to the upstream; the forward is not
	// cancelled when the provider disconnects. Default: 5m.
	ForwardTimeout caddy.Duration `json:"forward_timeout,omitempty"`

	// ReadTimeout bounds how long the body may take to arrive, from the
	// moment the handler starts reading it: a client trickling bytes is cut
	// off with 408 and nothing is recorded. It is set on the connection
	// (http.ResponseController.SetReadDeadline) and cleared once the body is
	// read. Default: 10s. Caddy's server read_body/read_timeout bound the
	// whole request too; see docs/security.md, Server timeouts.
	ReadTimeout caddy.Duration `json:"read_timeout,omitempty"`

	// OnAmbiguous is what happens to an event whose forward had no known
	// outcome (forward_timeout ended it, the upstream's connection failed
	// after the request was written and before a status line, or its
	// gateway died; see forwardend.go): "reforward" (default) lets the next
	// delivery forward again; "hold" parks it in the held state at once,
	// answered 503, until an operator releases or completes it.
	OnAmbiguous string `json:"on_ambiguous,omitempty"`

	// OnMissingID is what happens to a verified delivery without a usable
	// event ID: "reject" (default, 400) or "forward" (forwarded without
	// deduplication, and logged).
	OnMissingID string `json:"on_missing_id,omitempty"`

	// DedupeBody also keys deliveries on the SHA-256 of the body, within the
	// scope, so a replayed body under a fresh event ID is answered at the edge
	// instead of forwarded. Default: on for providers whose event ID is not
	// covered by the signature and that sign no timestamp (github, shopify,
	// ...), off for the others.
	DedupeBody *bool `json:"dedupe_body,omitempty"`

	// RefuseStatus is the HTTP status of a delivery refused because it
	// fails verification (missing, malformed or unmatched signature, a
	// timestamp outside tolerance, a body the provider never sends). It
	// must be a 4xx status: providers retry 5xx. Default: the status the
	// provider documents, 400 for all but discord (401). Other refusals
	// (no usable event ID, unreadable body) stay 400.
	RefuseStatus int `json:"refuse_status,omitempty"`

	// HMAC describes the scheme of provider hmac.
	HMAC *HMACConfig `json:"hmac,omitempty"`

	// AllowSHA1 lets provider github accept the legacy X-Hub-Signature
	// (HMAC-SHA1) header when X-Hub-Signature-256 is absent. Default false.
	AllowSHA1 bool `json:"allow_sha1,omitempty"`

	// AsyncConfig holds mode (sync or async) and the store-and-forward
	// fields of async mode (async.go).
	AsyncConfig

	// ProtocolConfig holds handshake, verify_token, learned_secret and
	// batch (handshake.go, batch.go).
	ProtocolConfig
	// ReplayConfig holds replay, replay_max, replay_headers and the
	// Idempotency-Key mode's fields (replay.go, idemkey.go).
	ReplayConfig
	// SpoolConfig holds spool and spool_max: where deliveries go while
	// the store is unreachable (spool.go).
	SpoolConfig

	// replayWindowSet: replay_window was configured, not defaulted
	// (checkConfig: it applies only with dedupe_body on).
	replayWindowSet bool

	dedupeBody bool
	verifier   signature.Verifier
	preset     signature.Preset
	extractor  *eventid.Extractor
	backend    *backend
	completed  *cache.Completed // nil when Cache is 0
	poolKey    string
	logger     *zap.Logger
	counters   map[string]prometheus.Counter
	cacheHit   prometheus.Counter // cache_hits_total of the scope
	cacheMiss  prometheus.Counter // cache_misses_total of the scope
	// bodyMismatch is the scope's body_mismatch_total.
	bodyMismatch prometheus.Counter
	// claimsInFlight and upstreamTime are the scope's claims_in_flight
	// gauge and upstream_duration_seconds histogram.
	claimsInFlight prometheus.Gauge
	upstreamTime   prometheus.Observer
	ctx            caddy.Context
	wg             *sync.WaitGroup
	busy           *tracker        // forwards and settles in flight
	pending        *pendingSettles // completions written after their answers (settle.go)
	stopSweep      context.CancelFunc
	// now is the verifier's clock for signed timestamps; nil means
	// time.Now. Tests set it before Provision.
	now func() time.Time
	// signedURL is the configured URL of a URL-signed scheme, password
	// redacted, for the log line of a failed verification.
	signedURL string
	// app is the http app of the config this handler belongs to (nil on a
	// bare context); scopeUsed: its scope's storage is recorded there
	// (configcheck.go).
	app       any
	scopeUsed bool
	// trust describes how a request becomes a claim here (trust.go).
	trust string
}

// Storage selects the store backend.
type Storage struct {
	// Backend is "postgres" or "sqlite".
	Backend string `json:"backend,omitempty"`
	// DSN is the PostgreSQL connection string (postgres). {env.NAME}
	// placeholders are expanded; its password is never logged.
	DSN string `json:"dsn,omitempty"`
	// Path is the SQLite database file (sqlite).
	Path string `json:"path,omitempty"`
	// Table is the name of the events table, so the gateway can share a
	// database with the application. Default: webhook_events.
	Table string `json:"table,omitempty"`
}

// HMACConfig is the custom scheme of provider hmac: an HMAC of the raw body.
type HMACConfig struct {
	// Header carries the signature, e.g. X-Webhook-Signature. Required.
	Header string `json:"header,omitempty"`
	// Algorithm is sha1, sha256 (default) or sha512.
	Algorithm string `json:"algorithm,omitempty"`
	// Encoding is hex (default) or base64.
	Encoding string `json:"encoding,omitempty"`
	// Prefix precedes the encoded signature, e.g. "sha256=".
	Prefix string `json:"prefix,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.webhook_idempotency",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision applies defaults, builds the verifier and event ID extractor, and
// opens (or shares) the store.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.ctx = ctx
	h.logger = ctx.Logger()
	h.busy = new(tracker)
	h.pending = new(pendingSettles)
	repl := caddy.NewReplacer()

	if err := h.prepareConfig(); err != nil {
		return err // before any store, pool or queue is opened
	}
	build := h.provisionVerifier
	if h.Provider == providerIdempotencyKey {
		build = h.provisionIdempotencyKey
	}
	if err := build(repl); err != nil {
		return err
	}

	st := h.storage()
	h.app = httpApp(ctx)
	if err := useScopeStorage(h.app, h.Scope, st, h.trust); err != nil {
		h.app = nil // nothing recorded to release
		return err
	}
	h.scopeUsed = true
	warnHostOnly(h.app, h.logger)
	if err := checkProxyRetries(h.app); err != nil {
		return err
	}
	entries := defaultCache
	if h.Cache != nil {
		entries = *h.Cache
	}
	b, _, err := openBackend(st, entries)
	if err != nil {
		return fmt.Errorf("storage %s: %w", st.Backend, err)
	}
	h.backend, h.poolKey = b, st.poolKey()
	h.pending.m = b.completing
	scopes.add(h.Scope, b)
	scopeTrusts.add(h.Scope, h.trust)
	if entries > 0 {
		h.completed = b.completed
	}

	if err := h.provisionMetrics(ctx); err != nil {
		return err
	}
	if err := h.provisionAsync(ctx); err != nil {
		return err
	}
	if err := h.provisionSpool(ctx); err != nil {
		return err
	}

	sweepCtx, stopSweep := context.WithCancel(ctx)
	h.stopSweep = stopSweep
	h.wg = new(sync.WaitGroup)
	h.wg.Add(1)
	go h.sweepRetention(sweepCtx)
	return nil
}

// provisionVerifier builds the verifier and the event ID extractor of a
// signature provider's preset (checkConfig has judged the config).
func (h *Handler) provisionVerifier(repl *caddy.Replacer) error {
	secrets, err := h.expandedSecrets()
	if err != nil {
		return err
	}
	if err := h.provisionProtocol(); err != nil {
		return err
	}
	opts := signature.Options{
		Secrets:   secrets,
		Tolerance: time.Duration(h.Tolerance),
		URL:       repl.ReplaceAll(h.URL, ""),
		AllowSHA1: h.AllowSHA1,
		Now:       h.now,
	}
	if h.HMAC != nil {
		opts.HMAC = signature.HMACOptions{
			Header:    h.HMAC.Header,
			Algorithm: h.HMAC.Algorithm,
			Encoding:  h.HMAC.Encoding,
			Prefix:    h.HMAC.Prefix,
		}
	}
	v, err := h.newVerifier(opts)
	if err != nil {
		return err // the signature package's errors name the provider
	}
	h.verifier = v
	h.trust = h.trustOf(secrets)
	if u, err := url.Parse(opts.URL); err == nil && opts.URL != "" {
		h.signedURL = u.Redacted()
	}

	var parts [][]eventid.Source
	if len(h.EventID) > 0 {
		for _, s := range h.EventID {
			parts = append(parts, []eventid.Source{s})
		}
	} else {
		var alts []eventid.Source
		for _, spec := range h.preset.EventID {
			kind, name, _ := strings.Cut(spec, " ")
			s, err := eventid.ParseSource(kind, name)
			if err != nil {
				return fmt.Errorf("provider %s: default event_id: %w", h.Provider, err)
			}
			alts = append(alts, s)
		}
		parts = [][]eventid.Source{alts}
	}
	if len(parts[0]) > 0 { // else a batch without a delivery ID, keyed on its items (batch.go)
		if h.extractor, err = eventid.New(parts); err != nil {
			return fmt.Errorf("event_id: %w", err)
		}
	}
	if h.preset.JSONBody && h.extractor != nil {
		// The verifier refuses every body that is not a valid JSON object
		// before the ID is read (the same bytes, the same validator), so
		// the extractor need not validate it a second time.
		h.extractor.AssumeValidJSON()
	}
	return nil
}

// Validate checks the configuration (checkConfig, which Provision has
// already run before opening anything).
func (h *Handler) Validate() error {
	return h.checkConfig()
}

// Cleanup releases this handler's use of the shared store.
func (h *Handler) Cleanup() error {
	h.drainCompletions()
	if h.scopeUsed {
		releaseScopeStorage(h.app, h.Scope)
		forgetHostWarnings(h.app)
		h.scopeUsed = false
	}
	h.cleanupAsync() // before the store: the dispatcher uses its pool
	h.cleanupSpool()
	if h.wg != nil {
		h.stopSweep()
		h.wg.Wait()
	}
	release := func() error {
		if h.backend != nil {
			scopes.remove(h.Scope, h.backend)
			scopeTrusts.remove(h.Scope, h.trust)
		}
		if h.poolKey != "" {
			_, err := backends.Delete(h.poolKey)
			return err
		}
		return nil
	}
	// A forward that outlives the config (a reload, or a route removed while
	// it runs) must still settle its claim in this store: if the reload
	// changed the storage, the store would otherwise close under it and the
	// event, left processing, would be forwarded again after its lease.
	if h.busy.active() {
		go func() {
			h.busy.wait()
			if err := release(); err != nil {
				h.logger.Warn("releasing the store after the last forward", zap.Error(err))
			}
		}()
		return nil
	}
	return release()
}

// tracker counts a handler's forwards and background settles still running.
type tracker struct {
	wg sync.WaitGroup
	n  atomic.Int64
}

func (t *tracker) add()         { t.n.Add(1); t.wg.Add(1) }
func (t *tracker) done()        { t.wg.Done(); t.n.Add(-1) }
func (t *tracker) active() bool { return t.n.Load() > 0 }
func (t *tracker) wait()        { t.wg.Wait() }

// ServeHTTP verifies, claims, forwards once and settles: the steps of the
// README's "How it works" table.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if rp := replayOf(r); rp != nil {
		return h.serveReplay(w, r, rp, next)
	}
	if h.idem != nil {
		return h.serveIdempotencyKey(w, r, next)
	}
	start := time.Now()
	d := delivery{h: h, start: start}
	defer d.log()

	buf := getBodyBuf()
	defer buf.release()

	raw, signed, status, reason := h.readBody(w, r, buf.Buffer)
	if status != 0 {
		d.outcome, d.reason = outcomeFor(status), reason
		respondError(w, status, reason, 0)
		return nil
	}
	// The upstream gets the bytes exactly as they arrived.
	forwardable := func() *http.Request {
		buf.forwarded = true
		sendonce.SetBody(r, raw)
		return r
	}
	hs, handshake := h.matchHandshake(r, signed)
	if handshake && hs.Challenge.Auth != signature.AuthSignature {
		return h.serveHandshake(w, r, hs, forwardable, next, &d)
	}
	if err := h.verifyDelivery(r.Context(), signed, r.Header); err != nil {
		if errors.Is(err, errSecretStore) {
			d.outcome = outcomeStoreError
			h.logger.Warn("reading the learned secret failed; answered 503, nothing forwarded", zap.String("scope", h.Scope), zap.Error(err))
			respondError(w, http.StatusServiceUnavailable, "event store unavailable", unavailableRetryAfter)
			return nil
		}
		d.outcome, d.reason = outcomeInvalidSignature, err.Error()
		if isBodyRefusal(err) {
			d.outcome = outcomeBadRequest
		}
		if h.preset.NeedsURL {
			d.signedURL = h.signedURL // a wrong configured url is the usual cause
		}
		respondError(w, h.RefuseStatus, signatureReason(err), 0)
		return nil
	}
	if handshake {
		return h.serveHandshake(w, r, hs, forwardable, next, &d)
	}

	if h.splitting(signed) {
		return h.serveSplit(w, r, signed, next, &d)
	}
	id, err := h.eventID(signed, r.Header)
	if err != nil {
		// An ambiguous ID is not a missing one: the delivery names two
		// events, and the upstream may act on the other. Always refused.
		if h.OnMissingID == "forward" && !errors.Is(err, eventid.ErrAmbiguous) {
			d.outcome = outcomeForwardedNoID
			h.logger.Warn("delivery has no usable event id; forwarded without deduplication (on_missing_id forward)",
				zap.String("scope", h.Scope), zap.String("reason", eventIDReason(err)))
			return h.passOn(w, forwardable(), next, &d)
		}
		d.outcome, d.reason = outcomeBadRequest, eventIDReason(err)
		respondError(w, http.StatusBadRequest, d.reason, 0)
		return nil
	}
	d.eventID = id
	if h.Mode == "async" {
		return h.serveAsync(w, r, raw, signed, id, &d)
	}

	if h.replayOn && h.completed != nil {
		if h.replayCached(w, r, id, signed, &d) {
			return nil
		}
	} else if h.completed != nil {
		if status, ok := h.completed.Has(h.Scope, id); ok {
			h.cacheHit.Inc()
			d.outcome, d.status, d.cached = outcomeDuplicate, status, true
			if h.dedupeBody {
				h.checkSameBody(r.Context(), id, signed)
			}
			respondDuplicate(w)
			return nil
		}
		h.cacheMiss.Inc()
	}

	claim, err := h.claim(r.Context(), h.Scope, id)
	if err != nil {
		h.claimFailed(w, r, raw, id, h.bodyKeyOf(signed), err, &d)
		return nil
	}
	h.storeAnswered()
	d.attempt = claim.Attempts
	switch claim.Outcome {
	case store.Duplicate:
		if h.replayOn {
			h.replayStored(w, r, id, signed, claim, &d)
			return nil
		}
		d.outcome, d.status = outcomeDuplicate, claim.Status
		h.completed.Add(h.Scope, id, claim.Status)
		if h.dedupeBody {
			h.checkSameBody(r.Context(), id, signed)
		}
		respondDuplicate(w)
		return nil
	case store.InFlight:
		d.outcome = outcomeInFlight
		respondError(w, http.StatusConflict, "event is being processed by another delivery; retry later", claim.RetryAfter)
		return nil
	case store.Held:
		d.outcome = outcomeHeld
		respondError(w, http.StatusServiceUnavailable, "event is held after an ambiguous forward; an operator must release it", unavailableRetryAfter)
		return nil
	case store.Claimed:
	default:
		return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("unexpected claim outcome %v", claim.Outcome))
	}

	claims := []claimRef{{scope: h.Scope, id: id, token: claim.Token}}
	if h.dedupeBody {
		bc, ok := h.claimBody(w, r, raw, signed, claims[0], &d)
		if !ok {
			return nil
		}
		claims = append(claims, bc)
	}
	return h.forward(w, forwardable(), next, claims, &d)
}

// claim claims (scope, key) in the store with the route's lease and
// on_ambiguous policy, bounded by storeTimeout, and times it.
func (h *Handler) claim(parent context.Context, scope, key string) (store.Claim, error) {
	return h.claimWith(parent, store.ClaimParams{
		Scope: scope, EventID: key, Lease: time.Duration(h.Lease), HoldOnExpiry: h.OnAmbiguous == "hold",
	})
}

// claimWith claims p in the store, bounded by storeTimeout, and times it.
// A claim this handler is completing after its answer (completeAfterAnswer)
// is waited for first, so a duplicate sent once the provider has its answer
// finds the event completed, not in flight; one that finds the event in
// flight and then a completion under way waits for it and claims again.
func (h *Handler) claimWith(parent context.Context, p store.ClaimParams) (store.Claim, error) {
	ctx, cancel := context.WithTimeout(parent, storeTimeout)
	defer cancel()
	t0 := time.Now()
	h.awaitCompletion(ctx, p.Scope, p.EventID)
	c, err := h.backend.Claim(ctx, p)
	if err == nil && c.Outcome == store.InFlight && h.awaitCompletion(ctx, p.Scope, p.EventID) {
		c, err = h.backend.Claim(ctx, p)
	}
	observe(metrics.storeTime.claim, t0)
	return c, err
}

// passOn runs the next handler for a delivery forwarded without a claim
// (handshakes, on_missing_id forward) and answers its error itself. A panic
// of the next handler is raised again once the delivery's status is noted.
func (h *Handler) passOn(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, d *delivery) error {
	rec := caddyhttp.NewResponseRecorder(w, nil, nil)
	upstart := time.Now()
	panicked, err := runNext(next, rec, r)
	d.upstream = time.Since(upstart)
	d.status = finalStatus(rec)
	if panicked != nil {
		panic(panicked) // the delivery's line is logged on the way out
	}
	return h.answerProxyError(rec, err, d)
}

// answerProxyError answers an error of the next handler (the upstream
// refused the connection, timed out, the provider hung up) here instead of
// returning it to Caddy: Caddy's error log line prints the request's headers,
// and with them the signature or, for GitLab, the secret token itself.
// The answer is the error's status (502 when it has none) with a JSON body;
// the log line names the error, never a header. Routes' handle_errors blocks
// therefore do not see upstream errors of this handler.
func (h *Handler) answerProxyError(rec caddyhttp.ResponseRecorder, err error, d *delivery) error {
	if err == nil {
		return nil
	}
	status := http.StatusBadGateway
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode >= 400 {
		status = he.StatusCode
	}
	if finalStatus(rec) == 0 {
		respondError(rec, status, "upstream unavailable", 0)
		d.status = status
	}
	if c := h.logger.Check(zapcore.WarnLevel, "upstream error"); c != nil {
		c.Write(zap.String("scope", h.Scope), zap.String("event_id", d.eventID), zap.Int("status", status), zap.Error(err))
	}
	return nil
}

// claimRef is one claim this delivery holds: the event ID's, and with
// dedupe_body the body hash's.
type claimRef struct {
	scope, id, token string
	// resp is the upstream's answer stored when the claim completes
	// (replay response); nil stores none.
	resp *store.Response
	// holdReason is why the claim is held (on_ambiguous hold), stored for
	// the admin API.
	holdReason string
}

// forward runs the next handler with the claims held, renewing their leases,
// and settles them on the upstream's answer. The forward is detached from the
// provider's connection and bounded by ForwardTimeout instead. Every exit of
// the next handler (a return, an error, a panic: reverse_proxy raises
// http.ErrAbortHandler when the upstream's body is cut or the provider's
// connection fails mid-answer) settles the claims exactly once, balances the
// in-flight gauge and sets the delivery's outcome; a panic is then raised
// again with its own value, as net/http expects.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, claims []claimRef, d *delivery) error {
	// Keep the store open until this claim is settled, even if a config
	// reload drops the handler meanwhile (see Cleanup).
	h.busy.add()
	defer h.busy.done()
	wire := new(wireTrace)
	fctx, cancel := context.WithTimeout(wire.with(context.WithoutCancel(r.Context())), time.Duration(h.ForwardTimeout))
	defer cancel()

	hbDone := make(chan struct{})
	hbStopped := make(chan struct{})
	go h.heartbeat(fctx, claims, hbDone, hbStopped)

	h.claimsInFlight.Inc()
	var tee *capture // the answer stored for replay
	if h.replayOn {
		tee = h.newCapture(w)
		w = tee
	}
	rec := caddyhttp.NewResponseRecorder(w, nil, nil)
	upstart := time.Now()
	panicked, err := runNext(next, rec, r.WithContext(fctx))
	d.upstream = time.Since(upstart)
	close(hbDone)
	<-hbStopped
	h.claimsInFlight.Dec()
	h.upstreamTime.Observe(d.upstream.Seconds())

	end := forwardEnd{
		status:   finalStatus(rec),
		err:      err,
		panicked: panicked != nil,
		wire:     wire,
	}
	end.timedOut = errors.Is(fctx.Err(), context.DeadlineExceeded) && end.status == 0
	d.status = end.status

	switch v := h.verdict(end); {
	case v == verdictComplete:
		d.outcome = outcomeCompleted
		if tee != nil {
			claims[0].resp = h.storedResponse(tee, end, d)
		}
		// Cached first: from now on a duplicate on this instance is
		// answered from the cache, or waits for the completion (claimWith).
		h.remember(claims[0], end.status)
		h.completeAfterAnswer(r.Context(), claims, end.status)
	case v == verdictAmbiguous && h.OnAmbiguous == "hold":
		// The upstream may or may not have done the work: park the event
		// as held now, so its retries get 503 and an operator can decide
		// at once.
		d.outcome, d.reason = outcomeAmbiguous, end.describe()
		h.logger.Warn("forward ended with no known outcome; the event is held (on_ambiguous hold)",
			zap.String("scope", h.Scope), zap.String("event_id", claims[0].id), zap.String("reason", d.reason))
		for i := range claims {
			claims[i].holdReason = d.reason
		}
		h.settle(r.Context(), claims, 0, "hold")
	default:
		d.outcome = outcomeReleased
		if v == verdictAmbiguous {
			d.reason = end.describe()
		}
		h.settle(r.Context(), claims, end.status, "release")
	}
	if panicked != nil {
		panic(panicked)
	}
	return h.answerProxyError(rec, err, d)
}

// settle completes, releases or holds (op "complete", "release", "hold")
// every claim, with a context detached from the provider's connection; a
// store error is retried in the background (settleLater).
func (h *Handler) settle(parent context.Context, claims []claimRef, status int, op string) {
	for _, c := range claims {
		err := h.settleOnce(context.WithoutCancel(parent), c, status, op)
		switch {
		case errors.Is(err, store.ErrLeaseLost):
			h.logger.Warn("claim lease lost before settling; another delivery may have been forwarded",
				zap.String("scope", c.scope), zap.String("event_id", c.id), zap.String("settle", op))
		case err != nil:
			h.logger.Warn("settling event failed; retrying in the background",
				zap.String("scope", c.scope), zap.String("event_id", c.id), zap.String("settle", op), zap.Error(err))
			if h.ctx.Context != nil {
				h.busy.add()
				go func() {
					defer h.busy.done()
					h.settleLater(c, status, op)
				}()
			}
		}
	}
}

// settleRetryFor bounds how long a settle that failed on a store error is
// retried in the background.
const settleRetryFor = 10 * time.Minute

// settleLater retries a settle the store failed (a PostgreSQL restart, a
// network cut), with backoff, until it succeeds, the claim is lost to
// another delivery, settleRetryFor has passed, or the config is unloaded.
// Without it an event whose upstream answered 2xx stays processing and, once
// its lease runs out, is forwarded again. Complete needs the claim's token,
// not a live lease, so it still succeeds after the lease expired as long as
// no other delivery has claimed the event.
func (h *Handler) settleLater(c claimRef, status int, op string) {
	delay, deadline := 100*time.Millisecond, time.Now().Add(settleRetryFor)
	// It outlives a config reload on purpose: the store stays open until it
	// ends (see Cleanup), and giving up would let the event be forwarded again.
	ctx := context.WithoutCancel(h.ctx)
	for time.Now().Before(deadline) {
		time.Sleep(delay)
		err := h.settleOnce(ctx, c, status, op)
		switch {
		case err == nil:
			h.logger.Info("settled event after a store error", zap.String("scope", c.scope),
				zap.String("event_id", c.id), zap.String("settle", op))
			return
		case errors.Is(err, store.ErrLeaseLost):
			h.logger.Warn("claim lease lost before settling; another delivery may have been forwarded",
				zap.String("scope", c.scope), zap.String("event_id", c.id), zap.String("settle", op))
			return
		}
		// Every 100 ms while the outage is young, so the settle lands within
		// moments of the store's return, before a redelivery to another
		// instance can take the expired lease; then back off to 2 s.
		if time.Since(deadline.Add(-settleRetryFor)) > 30*time.Second {
			delay = min(2*delay, 2*time.Second)
		}
	}
	h.logger.Error("gave up settling event; its lease will expire", zap.String("scope", c.scope),
		zap.String("event_id", c.id), zap.String("settle", op))
}

// settleOnce completes, releases or holds one claim, bounded by storeTimeout.
func (h *Handler) settleOnce(parent context.Context, c claimRef, status int, op string) error {
	ctx, cancel := context.WithTimeout(parent, storeTimeout)
	defer cancel()
	t0 := time.Now()
	switch op {
	case "complete":
		defer observe(metrics.storeTime.complete, t0)
		if c.resp != nil {
			return h.backend.CompleteResponse(ctx, c.scope, c.id, c.token, *c.resp)
		}
		return h.backend.Complete(ctx, c.scope, c.id, c.token, status)
	case "hold":
		defer observe(metrics.storeTime.hold, t0)
		return h.backend.Hold(ctx, c.scope, c.id, c.token, c.holdReason)
	}
	defer observe(metrics.storeTime.release, t0)
	return h.backend.Release(ctx, c.scope, c.id, c.token)
}

// heartbeat renews the claims' leases every third of the lease until done is
// closed or the forward's context ends; a claim whose lease is lost is
// logged and renewed no more.
func (h *Handler) heartbeat(ctx context.Context, claims []claimRef, done <-chan struct{}, stopped chan<- struct{}) {
	defer close(stopped)
	d := time.Duration(h.Lease)
	var wg sync.WaitGroup
	for _, c := range claims {
		wg.Go(func() {
			err := lease.Keep(ctx, done, lease.Renewal{
				Lease: d,
				Renew: func(ctx context.Context) error {
					defer observe(metrics.storeTime.heartbeat, time.Now())
					return h.backend.Heartbeat(ctx, c.scope, c.id, c.token, d)
				},
				Lost:   store.ErrLeaseLost,
				Logger: h.logger, Name: "claim lease",
				Fields: []zap.Field{zap.String("scope", c.scope), zap.String("event_id", c.id)},
			})
			if err != nil {
				h.logger.Warn("claim lease lost while forwarding", zap.String("scope", c.scope), zap.String("event_id", c.id))
			}
		})
	}
	wg.Wait()
}

// bodyScope is the scope of body-hash keys (dedupe_body): a scope of its
// own, so no event ID a sender chooses can collide with a body hash.
func (h *Handler) bodyScope() string { return h.Scope + "#body" }

func bodyKey(body []byte) string {
	sum := sha256.Sum256(body)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// claimBody claims the SHA-256 of the body next to the event ID (dedupe_body),
// so a replayed body under a fresh, unsigned ID is not forwarded again. When
// it returns false it has answered the delivery and released idClaim.
func (h *Handler) claimBody(w http.ResponseWriter, r *http.Request, raw, body []byte, idClaim claimRef, d *delivery) (claimRef, bool) {
	key := bodyKey(body)
	bc, err := h.claim(r.Context(), h.bodyScope(), key)
	if err == nil && bc.Outcome == store.Claimed {
		return claimRef{scope: h.bodyScope(), id: key, token: bc.Token}, true
	}
	h.settle(r.Context(), []claimRef{idClaim}, 0, "release")
	switch {
	case err != nil:
		h.claimFailed(w, r, raw, idClaim.id, key, err, d)
	case bc.Outcome == store.Duplicate:
		d.outcome = outcomeBodyReplay
		h.logger.Warn("body already delivered under another event id; answered as a duplicate, not forwarded (dedupe_body)",
			zap.String("scope", h.Scope), zap.String("event_id", idClaim.id))
		respondDuplicate(w)
	case bc.Outcome == store.InFlight:
		d.outcome = outcomeInFlight
		respondError(w, http.StatusConflict, "the same body is being processed under another event id; retry later", bc.RetryAfter)
	default:
		d.outcome = outcomeHeld
		respondError(w, http.StatusServiceUnavailable, "event is held after an ambiguous forward; an operator must release it", unavailableRetryAfter)
	}
	return claimRef{}, false
}

// checkSameBody warns when a completed event ID comes again with a body that
// was never delivered: the provider changed the payload, or someone reuses
// IDs. The delivery is still answered as a duplicate.
func (h *Handler) checkSameBody(parent context.Context, id string, body []byte) {
	ctx, cancel := context.WithTimeout(parent, storeTimeout)
	defer cancel()
	_, err := h.backend.Get(ctx, h.bodyScope(), bodyKey(body))
	if errors.Is(err, store.ErrNotFound) {
		h.bodyMismatch.Inc()
		h.logger.Warn("completed event id arrived with a different body; answered as a duplicate",
			zap.String("scope", h.Scope), zap.String("event_id", id))
	}
}

// readBody reads the raw body, at most MaxBody bytes, into buf. It returns
// the raw bytes (what the upstream gets) and the bytes the provider signed
// (the decoded body when Content-Encoding is gzip). A non-zero status means
// the delivery is refused with that status and reason.
func (h *Handler) readBody(w http.ResponseWriter, r *http.Request, buf *bytes.Buffer) (raw, signed []byte, status int, reason string) {
	encs := r.Header.Values("Content-Encoding")
	if len(encs) > 1 {
		// The upstream would undo every line; only one is ever verified.
		return nil, nil, http.StatusUnsupportedMediaType, "unsupported Content-Encoding (sent on several lines)"
	}
	enc := ""
	if len(encs) == 1 {
		enc = strings.ToLower(strings.TrimSpace(encs[0]))
	}
	if enc != "" && enc != "identity" && enc != "gzip" {
		return nil, nil, http.StatusUnsupportedMediaType, "unsupported Content-Encoding (only gzip and identity)"
	}
	if r.ContentLength > h.MaxBody {
		return nil, nil, http.StatusRequestEntityTooLarge, "body exceeds max_body"
	}
	n, err := h.readWithDeadline(w, buf, r.Body)
	if isTimeout(err) {
		return nil, nil, http.StatusRequestTimeout, "body not received within read_timeout"
	}
	if err != nil {
		return nil, nil, http.StatusBadRequest, "reading body failed"
	}
	if n > h.MaxBody {
		return nil, nil, http.StatusRequestEntityTooLarge, "body exceeds max_body"
	}
	raw = buf.Bytes()
	if enc != "gzip" {
		return raw, raw, 0, ""
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, nil, http.StatusBadRequest, "gzip body is malformed"
	}
	var dec bytes.Buffer
	m, err := dec.ReadFrom(io.LimitReader(zr, h.MaxBody+1))
	if m > h.MaxBody {
		return nil, nil, http.StatusRequestEntityTooLarge, "decoded body exceeds max_body"
	}
	if err != nil {
		return nil, nil, http.StatusBadRequest, "gzip body is malformed"
	}
	return raw, dec.Bytes(), 0, ""
}

// readWithDeadline reads the body (readAtMost, at most MaxBody+1 bytes)
// with the connection's read deadline set ReadTimeout from now, then clears
// it, so the next request on a kept-alive connection is not cut short.
// When the deadline passed it stays, and the connection is closed after the
// answer: net/http would otherwise wait for the rest of the trickled body
// before writing the 408. Where the writer cannot set a deadline
// (http.ErrNotSupported) the body is read without one.
func (h *Handler) readWithDeadline(w http.ResponseWriter, buf *bytes.Buffer, body io.Reader) (int64, error) {
	rc := http.NewResponseController(w)
	set := rc.SetReadDeadline(time.Now().Add(time.Duration(h.ReadTimeout))) == nil
	n, err := readAtMost(buf, body, h.MaxBody)
	switch {
	case isTimeout(err):
		w.Header().Set("Connection", "close")
	case set:
		_ = rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// isTimeout reports a read that ended on a deadline.
func isTimeout(err error) bool {
	if err == nil {
		return false // the common case, without errors.As's allocation
	}
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// sweepRetention deletes event rows older than Retention and body-hash rows
// older than ReplayWindow, in bounded batches, until the config is unloaded.
// Any instance may run it; batches don't conflict.
func (h *Handler) sweepRetention(ctx context.Context) {
	defer h.wg.Done()
	t := time.NewTicker(h.sweepEvery())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := h.sweepOnce(ctx, time.Now()); err != nil {
			h.logger.Warn("retention sweep failed", zap.Error(err))
		}
	}
}

// sweepOnce runs one retention sweep as of now, at most 100 batches per
// kind of row, and returns how many rows it deleted.
func (h *Handler) sweepOnce(ctx context.Context, now time.Time) (int, error) {
	return store.Sweep(ctx, h.backend, []store.Expiry{
		{Scopes: []string{h.Scope}, Cutoff: now.Add(-time.Duration(h.Retention))},
		{Scopes: []string{h.bodyScope()}, Cutoff: now.Add(-time.Duration(h.ReplayWindow))},
	}, retentionBatch, 100, storeTimeout)
}

// retentionInterval is how often the retention sweep runs.
var retentionInterval = 10 * time.Minute

const maxPooledBuf = 1 << 20

// bodyBuf is a pooled buffer for a request body. The body buffer is pooled
// for deliveries answered at the edge. Once a request is forwarded the
// transport may still read its body after the next handler returns, so
// that buffer is left to the garbage collector.
type bodyBuf struct {
	*bytes.Buffer
	forwarded bool // set when the body is handed to the next handler
}

// getBodyBuf takes a buffer from the pool. It returns a value, not a
// pointer, so a delivery costs no allocation for it.
func getBodyBuf() bodyBuf {
	b := bufPool.Get().(*bytes.Buffer)
	b.Reset()
	return bodyBuf{Buffer: b}
}

// release returns the buffer to the pool unless it was forwarded or grew
// past maxPooledBuf.
func (b *bodyBuf) release() {
	if !b.forwarded && b.Cap() <= maxPooledBuf {
		bufPool.Put(b.Buffer)
	}
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// readAtMost reads r into buf until EOF or until more than limit bytes were
// read, as buf.ReadFrom(io.LimitReader(r, limit+1)) does, but reading
// straight into buf's spare capacity, without a reader allocated per
// delivery.
func readAtMost(buf *bytes.Buffer, r io.Reader, limit int64) (int64, error) {
	var n int64
	for n <= limit {
		if buf.Available() < bytes.MinRead {
			buf.Grow(bytes.MinRead)
		}
		b := buf.AvailableBuffer()
		b = b[:min(int64(cap(b)), limit+1-n)]
		m, err := r.Read(b)
		buf.Write(b[:m]) // b is buf's own spare capacity: no copy beyond itself
		n += int64(m)
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// delivery collects what the per-delivery log line reports.
type delivery struct {
	h        *Handler
	start    time.Time
	eventID  string
	outcome  string
	attempt  int
	status   int
	cached   bool
	upstream time.Duration
	// reason is why the gateway refused the delivery (the reason its
	// answer gives; never a secret, signature or body).
	reason string
	// signedURL is the configured URL a URL-signed scheme checked, when
	// that check failed.
	signedURL string
	// fingerprint is the request's (provider idempotency_key), stored with
	// its answer; never logged.
	fingerprint string
}

func outcomeFor(status int) string {
	switch status {
	case http.StatusRequestEntityTooLarge:
		return outcomeTooLarge
	case http.StatusUnsupportedMediaType:
		return outcomeUnsupported
	case http.StatusRequestTimeout:
		return outcomeReadTimeout
	}
	return outcomeBadRequest
}

// log counts the delivery's outcome and writes one info line per delivery:
// never a body, header, signature or secret.
func (d *delivery) log() {
	d.h.deliveries(d.outcome).Inc()
	if c := d.h.logger.Check(zapcore.InfoLevel, "delivery"); c != nil {
		// The fields' slice escapes into the core; pooled, the line costs
		// no allocation (cores serialize the fields before Write returns).
		fp := logFields.Get().(*[]zap.Field)
		fields := append((*fp)[:0],
			zap.String("scope", d.h.Scope),
			zap.String("provider", d.h.Provider),
			zap.String("event_id", d.eventID),
			zap.String("outcome", d.outcome),
			zap.Int("attempt", d.attempt),
			zap.Int("status", d.status),
			zap.Bool("cached", d.cached),
			zap.Duration("duration", time.Since(d.start)),
			zap.Duration("upstream", d.upstream),
		)
		if d.reason != "" {
			fields = append(fields, zap.String("reason", d.reason))
		}
		if d.signedURL != "" {
			fields = append(fields, zap.String("signed_url", d.signedURL))
		}
		c.Write(fields...)
		clear(fields) // keep no event ID alive in the pool
		*fp = fields[:0]
		logFields.Put(fp)
	}
}

// logFields pools the field slices of the per-delivery log line.
var logFields = sync.Pool{New: func() any {
	s := make([]zap.Field, 0, 16)
	return &s
}}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
