// Package caddymodule is the Caddy v2 HTTP handler webhook_idempotency: it
// verifies a webhook delivery's signature over the raw body, claims the
// provider's event ID in a store before forwarding, forwards the delivery to
// the next handler (normally reverse_proxy) once, and answers redeliveries of
// completed events at the edge.
package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/cache"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/claim"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
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
	// renews it every third of it while the forward runs (every thirtieth
	// after a failed renewal), so it expires only when the gateway holding
	// it died or could not reach the store for two thirds of the lease (an
	// outage that began just before a renewal was due): another delivery
	// may then forward the event again while the first forward still runs.
	// Keep two thirds of it longer than your longest store outage or
	// failover. Default: 30s.
	Lease caddy.Duration `json:"lease,omitempty"`

	// Retention is how long event rows are kept: at least 72h (providers'
	// retries) and twice a signed timestamp's tolerance. Default: 30 days.
	Retention caddy.Duration `json:"retention,omitempty"`

	// ReplayWindow is how long replay records are kept, counted from the
	// delivery's first arrival. A provider that signs no timestamp (github,
	// shopify, intercom, ...) makes a captured delivery valid forever: every
	// such route claims a replay record next to the event ID (the body's
	// SHA-256 under dedupe_body, else the SHA-256 of the event ID and the
	// body; replayguard.go), and while it is kept a replay is answered as a
	// duplicate even after retention deleted the event's row. A record is a
	// SHA-256 and its times: about 440 bytes in PostgreSQL with its
	// indexes, 330 in SQLite (see docs/operations.md, Retention), so about
	// 440 MB per million deliveries kept. Must be at least
	// retention; only for providers without a signed timestamp or with
	// dedupe_body. Default: 400 days, or retention when that is longer.
	ReplayWindow caddy.Duration `json:"replay_window,omitempty"`

	// MaxBody is the largest accepted body, in bytes, after decoding a gzip
	// body. Larger deliveries get 413. Default: the largest body the
	// provider documents where that is more than 5 MB (github and gitlab
	// 25 MiB, pubsub 16 MiB; docs/providers.md, "max body"), else 5000000
	// (5MB). A body past 1 MiB on a route that verifies a stream (an HMAC
	// over the body or a token, an event ID from headers only, no handshake
	// or batch, sync mode: github, gitlab, shopify, standard, svix,
	// bitbucket, jira, sentry, hmac with a header event_id, ...) is written
	// to a temporary file (mode 0600, in the system's temporary directory,
	// removed when the request ends) while it is read, verified and
	// forwarded from there, so memory does not grow with the body; a gzip
	// body's decoded bytes past 1 MiB go to such a file too (the compressed
	// bytes, forwarded as they arrived, stay in memory). Other routes hold
	// the body, and a gzip body's decoded bytes, in memory.
	MaxBody int64 `json:"max_body,omitempty"`

	// BodyBudget bounds the request body bytes the scope's routes hold at
	// once, in bytes: in memory and in temporary files together, the decoded
	// bytes of a gzip body included (so a gzip delivery holds both its
	// compressed and its decoded bytes), from before a body is read until
	// its request ends (after its answer; a forwarded body is held while
	// the upstream runs). Bodies are read before their signature can be
	// checked: without a bound, every connection anyone opens could hold
	// max_body. A delivery announcing its length reserves it before a byte
	// is read; one of unknown length (chunked) reserves 64 KiB at a time as
	// it arrives. A delivery that finds the budget spent is answered 503
	// with Retry-After: 1 and {"error": "body budget spent; retry later"}
	// (a problem under provider idempotency_key), its body not read any
	// further, nothing claimed nor forwarded, body_budget_refused_total
	// counted and a warning logged (at most one a second per route, with
	// the refusals since the last; the held bytes are the gauge
	// body_budget_held_bytes). Must be at least twice max_body plus 64 KiB
	// (one gzip delivery of max_body holds its compressed and its decoded
	// bytes). Routes of one scope share one budget, kept across config
	// reloads so that the requests of the replaced config count in it;
	// its size is the newest loaded config's, and the routes of one config
	// must give their scope one value (a default counts as given).
	// Default: 1 GiB (1073741824), or twice max_body plus 64 KiB when that
	// is larger.
	BodyBudget int64 `json:"body_budget,omitempty"`

	// Cache is how many completed event IDs are held in memory (about 240
	// bytes each) to answer duplicates without a store round trip; nil means
	// 100000, 0 disables it. Entries live at most 1 minute, the longest another
	// instance can answer an event forgotten through the admin API as a
	// duplicate. Routes of one storage that give the same size share one cache.
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
	// after the request was written and before a status line, Caddy exited
	// past its grace period while it ran, or its gateway died; see
	// forward.go): "reforward" (default) lets the next delivery forward
	// again, once: a second such ending of the same event holds it, so an
	// upstream that keeps ending ambiguously runs at most twice per event;
	// "hold" parks it in the held state at once. A held event is answered
	// 503 without Retry-After until an operator releases or completes it.
	OnAmbiguous string `json:"on_ambiguous,omitempty"`

	// CompleteBy says who completes a claim: "gateway" (default) when the
	// upstream answers 2xx; "upstream" when the upstream calls the SQL
	// function <table>_commit with the forward's Webhook-Claim header in
	// the transaction of its work, and every ending of the forward is then
	// settled by what the database says (docs/exactly-once.md), so no
	// ending is ambiguous. upstream needs storage postgres, on the
	// upstream's own database, and refuses on_ambiguous hold.
	CompleteBy string `json:"complete_by,omitempty"`

	// OnMissingID: a verified delivery without a usable event ID is
	// "reject"ed (default, 400) or "forward"ed, logged, with no deduplication
	// nor replay record (a capture stripped of its ID passes each time).
	OnMissingID string `json:"on_missing_id,omitempty"`

	// DedupeBody also keys deliveries on the SHA-256 of the body (of what
	// the signature covers: Twilio's sorted form parameters) in the scope,
	// so a replayed body under a fresh event ID is answered at the edge.
	// Default: on for providers whose event ID is not covered by the
	// signature and that sign no timestamp (github, shopify, ...), else off.
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

	// intake takes requests in (intake.go); mode serves what it took
	// (forward.go, async.go, batch.go).
	intake intake
	mode   mode

	dedupeBody bool
	// replayRecord: deliveries claim a replay record next to the event ID
	// (replayguard.go), of the body alone under dedupe_body or recordOnBody.
	replayRecord, recordOnBody bool
	singleUse                  *eventid.Extractor
	// singleUseBlock is the JSON object carrying the single-use value
	// ("signature"), left out of its fingerprint.
	singleUseBlock string
	verifier       signature.Verifier
	// budget counts the body bytes held against BodyBudget (budget.go).
	budget *bodyBudget
	// stream verifies spilled bodies; nil: the route keeps its bodies in
	// memory (spill.go).
	stream    signature.StreamVerifier
	preset    signature.Preset
	extractor *eventid.Extractor
	backend   *backend
	completed *cache.Completed // nil when Cache is 0
	poolKey   string
	logger    *zap.Logger
	throttled *sync.Map // warnings a sender can cause, by message (warnThrottled)
	counters  map[string]prometheus.Counter
	cacheHit  prometheus.Counter // cache_hits_total of the scope
	cacheMiss prometheus.Counter // cache_misses_total of the scope
	// bodyMismatch is the scope's body_mismatch_total.
	bodyMismatch prometheus.Counter
	// ambiguousReforwards is the scope's ambiguous_reforwards_total.
	ambiguousReforwards prometheus.Counter
	// claimsInFlight and upstreamTime are the scope's claims_in_flight
	// gauge and upstream_duration_seconds histogram.
	claimsInFlight prometheus.Gauge
	upstreamTime   prometheus.Observer
	ctx            caddy.Context
	// claims runs the sync claims' life (internal/claim); nil until the
	// store is open.
	claims *claim.Keeper
	// sweeper deletes expired rows until stopSweep; sweepDone is closed
	// when it has stopped.
	sweeper   *claim.Sweeper
	stopSweep context.CancelFunc
	sweepDone chan struct{}
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
	// scopeValue is Scope as the placeholder's value, made once: a string
	// put in an interface on every request is an allocation.
	scopeValue any
	// warnedUncommitted latches the route's warning about an upstream
	// answering 2xx without committing its claim (complete_by upstream).
	warnedUncommitted *atomic.Bool
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.webhook_idempotency",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision applies defaults, checks the config before anything is opened,
// builds the intake (verifier and event ID extractor, or the
// Idempotency-Key reader), opens (or shares) the store and picks the mode.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.ctx = ctx
	h.logger, h.throttled = ctx.Logger(), new(sync.Map)
	h.warnedUncommitted = new(atomic.Bool)
	if err := h.prepareConfig(); err != nil {
		return err // before any store, pool or queue is opened
	}
	h.scopeValue = h.Scope
	if err := h.provisionIntake(); err != nil {
		return err
	}

	st := h.storage()
	h.app = httpApp(ctx)
	if err := useScopeStorage(h.app, h.Scope, st, h.trust, h.BodyBudget, h.keepText()); err != nil {
		h.app = nil // nothing recorded to release
		return err
	}
	h.scopeUsed = true
	warnHostOnly(h.app, h.logger)
	if err := checkRoutes(h.app); err != nil {
		return err
	}
	b, err := openBackend(st, caddy.Log().Named("http.handlers.webhook_idempotency.store"))
	if err != nil {
		return fmt.Errorf("storage %s: %w", st.Backend, err)
	}
	h.backend, h.poolKey = b, st.poolKey()
	scopes.add(h.Scope, b)
	scopeTrusts.add(h.Scope, h.trust)
	h.provisionLearned(ctx)
	h.stream = h.spillVerifier()
	if h.cacheEntries() > 0 {
		if h.completed, err = h.takeCache(); err != nil {
			return err
		}
	}
	if err := h.provisionMetrics(ctx); err != nil {
		return err
	}
	h.provisionBudget()
	h.provisionClaims(ctx)
	if err := h.provisionMode(ctx); err != nil {
		return err
	}
	return h.provisionSpool(ctx)
}

// provisionClaims sets up the route's claims (internal/claim) on the open
// store and starts its retention sweep.
func (h *Handler) provisionClaims(ctx caddy.Context) {
	h.claims = claim.New(claim.Options{
		Store: h.backend.Store, Completions: h.backend.completing, Lease: time.Duration(h.Lease),
		HoldOnExpiry: h.OnAmbiguous == "hold", StoreTimeout: storeTimeout, Background: ctx.Context,
		Logger: h.logger, Scope: h.Scope, Timers: metrics.storeTime.claimTimers(),
	})
	h.sweeper = &claim.Sweeper{
		Store: h.backend.Store, Every: h.sweepEvery(), Batch: retentionBatch, StoreTimeout: storeTimeout, Logger: h.logger,
		Expiries: func(now time.Time) []store.Expiry {
			return []store.Expiry{
				{Scopes: []string{h.Scope}, Cutoff: now.Add(-time.Duration(h.Retention))},
				{Scopes: []string{h.bodyScope()}, Cutoff: now.Add(-time.Duration(h.ReplayWindow))},
				{Scopes: []string{h.onceScope()}, Cutoff: now.Add(-h.onceKeep())},
			}
		},
	}
	sweepCtx, stopSweep := context.WithCancel(ctx)
	h.stopSweep, h.sweepDone = stopSweep, make(chan struct{})
	go func() {
		defer close(h.sweepDone)
		h.sweeper.Run(sweepCtx)
	}()
}

// provisionMode picks the route's mode: async (registered with the
// dispatcher), sync under batch split, or sync.
func (h *Handler) provisionMode(ctx caddy.Context) error {
	switch {
	case h.Mode == "async":
		h.mode = asyncMode{h}
		return h.provisionAsync(ctx)
	case h.batch != nil && h.batch.Policy == signature.BatchSplit:
		h.mode = splitMode{syncMode{h}}
	default:
		h.mode = syncMode{h}
	}
	return nil
}

// Validate checks the configuration (checkConfig, which Provision has
// already run before opening anything).
func (h *Handler) Validate() error {
	return h.checkConfig()
}

// Cleanup releases this handler's use of the shared store. When Caddy is
// exiting, the forwards still running (past the grace period) are cut and
// settled first (shutdownForwards).
func (h *Handler) Cleanup() error {
	if caddy.Exiting() {
		shutdownForwards(h.logger)
	}
	if h.claims != nil {
		h.claims.Drain()
	}
	if h.scopeUsed {
		releaseScopeStorage(h.app, h.Scope)
		forgetHostWarnings(h.app)
		h.scopeUsed = false
	}
	h.cleanupAsync() // before the store: the dispatcher uses its pool
	h.cleanupSpool()
	h.cleanupBudget()
	if h.sweepDone != nil {
		h.stopSweep()
		<-h.sweepDone
	}
	release := func() error {
		if h.backend != nil {
			scopes.remove(h.Scope, h.backend)
			scopeTrusts.remove(h.Scope, h.trust)
			if h.learned != nil && h.backend.secrets != nil {
				learningScopes.remove(h.Scope, h.backend)
			}
		}
		if h.completed != nil {
			_, _ = caches.Delete(h.cacheKey())
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
	if h.claims != nil && h.claims.Active() {
		go func() {
			h.claims.Wait()
			if err := release(); err != nil {
				h.logger.Warn("releasing the store after the last forward", zap.Error(err))
			}
		}()
		return nil
	}
	return release()
}

// ServeHTTP takes the request in (intake.go: body, signature, event ID) and
// hands it to the route's mode (forward.go: claim, forward once, settle;
// async.go: queue; batch.go: split), the README's "How it works" steps;
// edge answers come from the one outcome table (answer.go).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if h.enter(r) { // nested in a handler of its scope, which has it
		return next.ServeHTTP(w, r)
	}
	if rp := replayOf(r); rp != nil {
		return h.serveReplay(w, r, rp, next)
	}
	d := takeDelivery(h, r)
	defer d.done()
	ok, err := h.intake.take(w, next, d)
	if !ok {
		return err
	}
	if d.eventID != "" {
		setPlaceholderValue(r, placeholderEventID, d.eventIDValue())
	}
	return h.mode.serve(w, next, d)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
