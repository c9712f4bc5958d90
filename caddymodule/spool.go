package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/spool"
)

// The spool of sync routes: a verified delivery whose event cannot be
// claimed because the store is unreachable is written to a local durable
// spool (internal/spool) and answered 200 once it is fsynced; when the store
// answers again, the spool hands each record back to the route (replayed
// through the Caddy server, so it reaches this handler with the same
// matchers, and its next handler, normally reverse_proxy), where it is
// claimed, forwarded and settled like a live delivery. docs/spool.md is the
// user's page.

// SpoolConfig is the spool of a sync route. Its fields sit at the top level
// of the handler's JSON, spelled like the Caddyfile's subdirectives.
type SpoolConfig struct {
	// Spool says what happens to a verified delivery whose event cannot be
	// claimed because the store is unreachable: "off" answers 503 and
	// relies on the provider to deliver it again; a directory (or "on",
	// for <caddy data dir>/webhook_idempotency/spool/<scope>) keeps it in a
	// local durable spool, answers 200 once it is on disk, and forwards it
	// once the store is back, exactly once per event. Default: on for
	// providers that do not redeliver a failed delivery on their own
	// (github, twilio, ... : the preset's delivery facts), off for those
	// that do. A directory is used by one gateway process at a time: give
	// each process its own. It holds delivery bodies and signature headers,
	// so it must not be readable by others (mode 0700, files 0600). Sync
	// mode only; not with batch split.
	Spool string `json:"spool,omitempty"`

	// SpoolMax bounds the bytes of the deliveries waiting in the spool;
	// past it a delivery that cannot be claimed is answered 503. Routes
	// sharing a spool directory must agree on it. Default: 1GB.
	SpoolMax int64 `json:"spool_max,omitempty"`

	// spoolDir is the resolved directory, "" when the spool is off.
	spoolDir string
	spooler  *spoolState
}

// defaultSpoolMax is spool_max's default (1GB, as humanize parses it).
const defaultSpoolMax = spool.DefaultMaxBytes

// spoolDefaults resolves spool to a directory or off (part of
// applyDefaults).
func (h *Handler) spoolDefaults() {
	if h.SpoolMax == 0 {
		h.SpoolMax = defaultSpoolMax
	}
	switch {
	case h.Spool == "off":
		h.spoolDir = ""
	case h.Spool == "on" || (h.Spool == "" && h.spoolByDefault()):
		h.spoolDir = filepath.Join(caddy.AppDataDir(), "webhook_idempotency", "spool", url.PathEscape(h.Scope))
	case h.Spool != "":
		h.spoolDir = caddy.NewReplacer().ReplaceAll(h.Spool, "")
	}
}

// spoolByDefault: the provider does not redeliver a failed delivery on its
// own long enough to outlast a store outage (signature.Retry.OutlastsOutage;
// or its documentation does not say), on a route the spool applies to.
func (h *Handler) spoolByDefault() bool {
	return h.spoolApplies() && !h.preset.Delivery.Retry.OutlastsOutage()
}

// spoolApplies: a sync route of a signing provider keyed one event per
// claim (batch split claims each item on its own; async mode has its own
// queue; Idempotency-Key callers expect the upstream's answer).
func (h *Handler) spoolApplies() bool {
	return h.Mode != "async" && h.Provider != providerIdempotencyKey && h.Batch != "split"
}

// checkSpool checks spool and spool_max (part of checkConfig).
func (h *Handler) checkSpool() error {
	if h.SpoolMax < 0 {
		return errors.New("spool_max: must be positive")
	}
	if h.Spool == "" || h.Spool == "off" {
		return nil
	}
	switch {
	case h.Mode == "async":
		return errors.New("spool: only with mode sync (async mode keeps deliveries in its queue); write spool off or remove it")
	case h.Provider == providerIdempotencyKey:
		return errors.New("spool: not with provider idempotency_key (callers wait for the upstream's answer)")
	case h.Batch == "split":
		return errors.New("spool: not with batch split (each item is claimed on its own); remove it")
	}
	if dir := caddy.NewReplacer().ReplaceAll(h.Spool, ""); h.Spool != "on" && !filepath.IsAbs(dir) {
		return fmt.Errorf("spool: want on, off or an absolute directory, got %q", h.Spool)
	}
	return nil
}

// unmarshalSpool parses spool and spool_max.
func (h *Handler) unmarshalSpool(d *caddyfile.Dispenser, name string) error {
	var s string
	if !d.AllArgs(&s) {
		return d.ArgErr()
	}
	switch name {
	case "spool":
		h.Spool = s
	case "spool_max":
		n, err := humanize.ParseBytes(s)
		if err != nil || n == 0 || n > 1<<50 {
			return d.Errf("spool_max: invalid size %q", s)
		}
		h.SpoolMax = int64(n)
	}
	return nil
}

// spools holds one open spool per directory for the whole process: routes
// naming the same directory share it, and it survives config reloads (a
// reload provisions the new handlers before it cleans up the old ones, and
// a second Open of the directory would find it locked).
var spools = caddy.NewUsagePool()

// pooledSpool is the pooled value.
type pooledSpool struct {
	*spool.Spool
	max int64
}

// Destruct closes the spool: the last route using it is gone. Records not
// yet delivered stay on disk for the next process.
func (p *pooledSpool) Destruct() error {
	openSpools.Delete(p.Dir())
	return p.Close()
}

// openSpools lists the open spools by directory, for metrics and the admin
// API.
var openSpools sync.Map // dir → *pooledSpool

// spoolState is what a provisioned route with a spool holds.
type spoolState struct {
	sp     *pooledSpool
	detach func()
	// srv is the Caddy server whose routes hold this handler, found on
	// the first replay (serverOf).
	srv atomic.Pointer[caddyhttp.Server]
}

// provisionSpool opens (or shares) the route's spool and attaches this
// handler as its deliverer. It runs after the store is open.
func (h *Handler) provisionSpool(ctx caddy.Context) error {
	if h.spoolDir == "" {
		return nil
	}
	if err := initSpoolMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering spool metrics: %w", err)
	}
	dir, err := filepath.Abs(h.spoolDir)
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	if validateOnly() {
		return spool.CheckDir(dir)
	}
	logger := h.logger.With(zap.String("spool", dir))
	val, _, err := spools.LoadOrNew(dir, func() (caddy.Destructor, error) {
		sp, err := spool.Open(spool.Options{Dir: dir, MaxBytes: h.SpoolMax, Logger: logger})
		if err != nil {
			return nil, err
		}
		p := &pooledSpool{Spool: sp, max: h.SpoolMax}
		openSpools.Store(dir, p)
		return p, nil
	})
	if err != nil {
		if errors.Is(err, spool.ErrLocked) {
			return fmt.Errorf("spool: %w: give each gateway process a directory of its own (spool <dir>), or write spool off", err)
		}
		return fmt.Errorf("spool: %w", err)
	}
	p := val.(*pooledSpool)
	if p.max != h.SpoolMax {
		_, _ = spools.Delete(dir)
		return fmt.Errorf("spool_max: routes sharing spool directory %s must agree (%d and %d bytes)", dir, p.max, h.SpoolMax)
	}
	st := &spoolState{sp: p}
	st.detach = p.Attach(h.deliverSpooled)
	h.spooler = st
	return nil
}

// cleanupSpool detaches this handler and releases its use of the spool.
func (h *Handler) cleanupSpool() {
	st := h.spooler
	if st == nil {
		return
	}
	h.spooler = nil
	st.detach()
	if _, err := spools.Delete(st.sp.Dir()); err != nil {
		h.logger.Warn("closing the spool", zap.Error(err))
	}
}

// spoolTimeout bounds the wait for a record to be on disk.
const spoolTimeout = 10 * time.Second

// claimFailed answers a verified delivery whose claim (the event's, or
// its body's under dedupe_body) returned an error. A provider that hung up
// while the claim waited is not a store failure (providerGone). Otherwise
// the store failed: with a spool the delivery is kept and answered 200,
// without one it is answered 503.
//
// The warnings are throttled (warnThrottled): during an outage every
// delivery of a retry storm fails alike, and a line each would bury the
// first one. Each delivery keeps its own line (outcome and event ID) and
// its count in the metrics.
func (h *Handler) claimFailed(w http.ResponseWriter, d *delivery, err error) {
	if h.providerGone(d, true) {
		return
	}
	if h.spooler == nil {
		h.warnThrottled("claiming event failed; answered 503, nothing forwarded",
			zap.String("scope", h.Scope), zap.String("event_id", d.eventID), zap.Error(err))
		h.answer(w, d, ansStoreUnavailable, say{})
		return
	}
	switch err := h.spoolRecord(d); {
	case err == nil:
		h.answerSpooled(w, d)
	case errors.Is(err, spool.ErrFull):
		h.warnThrottled("the store is unreachable and the spool is full; answered 503, nothing kept",
			zap.String("scope", h.Scope), zap.String("event_id", d.eventID), zap.String("spool", h.spooler.sp.Dir()))
		h.answer(w, d, ansSpoolFull, say{})
	default:
		h.logThrottled(zapcore.ErrorLevel, "the store is unreachable and writing the spool failed; answered 503, nothing kept",
			zap.String("scope", h.Scope), zap.String("event_id", d.eventID), zap.Error(err))
		h.answer(w, d, ansSpoolError, say{})
	}
}

// providerGone reports whether the provider hung up while the delivery's
// store call waited (its own timeout, usually). That is not a store
// failure: the outcome is provider_gone, logged at debug, and no answer is
// written (nobody reads it); a claim the store committed for it meanwhile
// is given back by the store (store.Rules). keep (a verified delivery
// whose claim failed): with a spool the delivery is kept, since the
// provider counts it as failed and one that never redelivers would lose
// it.
func (h *Handler) providerGone(d *delivery, keep bool) bool {
	if d.r.Context().Err() == nil {
		return false
	}
	d.outcome = outcomeProviderGone
	kept := false
	if keep && h.spooler != nil {
		kept = h.spoolRecord(d) == nil
	}
	if c := h.logger.Check(zapcore.DebugLevel, "the provider hung up while the store was asked; nothing forwarded"); c != nil {
		c.Write(zap.String("scope", h.Scope), zap.String("event_id", d.eventID), zap.Bool("spooled", kept))
	}
	return true
}

// answerSpooled answers a delivery kept in the spool: 200, with the
// literal answer the provider requires where it has one (Adyen's
// "[accepted]").
func (h *Handler) answerSpooled(w http.ResponseWriter, d *delivery) {
	if body := h.preset.Delivery.Answer.Body; body != "" {
		h.answer(w, d, ansSpooledAccepted, say{body: []byte(body), status: h.preset.Delivery.Answer.Status})
		return
	}
	h.answer(w, d, ansSpooled, say{})
}

// spoolRecord writes a verified delivery to the spool and returns once it
// is durable (fsynced, with its directory entry).
func (h *Handler) spoolRecord(d *delivery) error {
	r := d.r
	rec := &spool.Record{
		Scope: h.Scope, EventID: d.eventID, BodyKey: h.bodyKeyOf(d),
		Method: r.Method, Host: r.Host, URI: r.RequestURI, Proto: r.Proto, RemoteAddr: r.RemoteAddr,
		Scheme: "http", Header: r.Header.Clone(), Body: d.raw,
	}
	if d.spill != nil {
		// The spool writes records from memory: a spilled body is read
		// back whole (only while the store is unreachable).
		b, err := d.spill.bytes()
		if err != nil {
			return err
		}
		rec.Body = b
	}
	if r.TLS != nil {
		rec.Scheme = "https"
	}
	if rec.URI == "" {
		rec.URI = r.URL.RequestURI()
	}
	// Detached: a provider hanging up now must not leave a record half
	// decided; once on disk it is delivered whatever the provider does.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), spoolTimeout)
	defer cancel()
	return h.spooler.sp.Append(ctx, rec)
}

// bodyKeyOf is the key of the body's own claim under dedupe_body, else "".
func (h *Handler) bodyKeyOf(d *delivery) string {
	if !h.dedupeBody {
		return ""
	}
	return d.bodyKey()
}

// storeAnswered tells the spool that the store answered a claim, so the
// deliveries waiting after an outage go now.
func (h *Handler) storeAnswered() {
	if h.spooler != nil {
		h.spooler.sp.Poke()
	}
}

// SpoolJSON is one spool as GET /webhook_idempotency/spool shows it: its
// counts and its oldest waiting deliveries (never a header or body).
type SpoolJSON struct {
	Dir              string           `json:"dir"`
	Records          int              `json:"records"`
	Bytes            int64            `json:"bytes"`
	MaxBytes         int64            `json:"max_bytes"`
	DiskBytes        int64            `json:"disk_bytes"`
	Oldest           *time.Time       `json:"oldest,omitempty"`
	OldestAgeSeconds float64          `json:"oldest_age_seconds"`
	Waiting          int              `json:"waiting"`
	Dead             int              `json:"dead"`
	StoreDown        bool             `json:"store_down"`
	Counts           spool.Counts     `json:"counts"`
	Deliveries       []SpoolEntryJSON `json:"deliveries"`
}

// SpoolEntryJSON is a waiting delivery of a spool.
type SpoolEntryJSON struct {
	Seq       uint64     `json:"seq"`
	Scope     string     `json:"scope"`
	EventID   string     `json:"event_id"`
	Arrived   time.Time  `json:"arrived"`
	Attempts  int        `json:"attempts"`
	Last      string     `json:"last,omitempty"` // the last try's outcome: wait, refused, unavailable
	NotBefore *time.Time `json:"not_before,omitempty"`
	Dead      bool       `json:"dead,omitempty"` // set aside after refusals: retry or drop it
}

// spoolListLimit is how many waiting deliveries of a spool the admin API
// lists, oldest first.
const spoolListLimit = 100

// listSpools answers GET /webhook_idempotency/spool.
func listSpools(w http.ResponseWriter) error {
	out := []SpoolJSON{}
	openSpools.Range(func(_, v any) bool {
		p := v.(*pooledSpool)
		st := p.Stats()
		j := SpoolJSON{Dir: st.Dir, Records: st.Records, Bytes: st.Bytes, MaxBytes: st.MaxBytes,
			DiskBytes: st.DiskBytes, Oldest: timePtr(st.Oldest), OldestAgeSeconds: oldestAge(st).Seconds(),
			Waiting: st.Waiting, Dead: st.Dead, StoreDown: st.StoreDown, Counts: st.Counts, Deliveries: []SpoolEntryJSON{}}
		for _, e := range p.List(spoolListLimit) {
			ej := SpoolEntryJSON{Seq: e.Seq, Scope: e.Scope, EventID: e.EventID, Arrived: e.Arrived.UTC(),
				Attempts: e.Attempts, NotBefore: timePtr(e.NotBefore), Dead: e.Dead}
			if e.Last != 0 {
				ej.Last = e.Last.String()
			}
			j.Deliveries = append(j.Deliveries, ej)
		}
		out = append(out, j)
		return true
	})
	slices.SortFunc(out, func(a, b SpoolJSON) int { return strings.Compare(a.Dir, b.Dir) })
	return writeJSON(w, out)
}

// spoolAction answers POST /webhook_idempotency/spool/retry and /drop, an
// operator's decision on dead deliveries (set aside after the upstream
// refused them for spool.DefaultDeadAfter). Query: dir (the spool's
// directory, as GET lists it; optional when one spool is open) and seq
// (the delivery; retry without it retries every dead delivery of the
// spool). retry answers {"retried": n}; drop answers the dropped delivery,
// 404 when no waiting delivery has seq, 409 when it is not dead.
func (a *Admin) spoolAction(w http.ResponseWriter, r *http.Request, action string) error {
	if action != "retry" && action != "drop" {
		return apiErr(http.StatusNotFound, "unknown spool action %q: want retry or drop", action)
	}
	q := r.URL.Query()
	var p *pooledSpool
	n := 0
	openSpools.Range(func(k, v any) bool {
		if q.Get("dir") == "" || q.Get("dir") == k.(string) {
			p = v.(*pooledSpool)
			n++
		}
		return true
	})
	switch {
	case n == 0:
		return apiErr(http.StatusNotFound, "no open spool has directory %q", q.Get("dir"))
	case n > 1:
		return apiErr(http.StatusBadRequest, "several spools are open: name one with dir")
	}
	var seq uint64
	if s := q.Get("seq"); s != "" {
		var err error
		if seq, err = strconv.ParseUint(s, 10, 64); err != nil || seq == 0 {
			return apiErr(http.StatusBadRequest, "bad seq %q", s)
		}
	}
	if action == "retry" {
		n := p.Retry(seq)
		a.log0().Info("spool: dead deliveries retried by an operator", zap.String("spool", p.Dir()), zap.Int("retried", n))
		return writeJSON(w, map[string]any{"retried": n})
	}
	if seq == 0 {
		return apiErr(http.StatusBadRequest, "drop needs seq")
	}
	e, err := p.Drop(seq)
	switch {
	case errors.Is(err, spool.ErrNoRecord):
		return apiErr(http.StatusNotFound, "spool %s: no waiting delivery %d", p.Dir(), seq)
	case errors.Is(err, spool.ErrNotDead):
		return apiErr(http.StatusConflict, "spool %s: delivery %d is not dead (it is still tried); only a dead delivery is dropped", p.Dir(), seq)
	case err != nil:
		return apiErr(http.StatusServiceUnavailable, "spool %s: %v", p.Dir(), err)
	}
	return writeJSON(w, map[string]any{"dropped": SpoolEntryJSON{Seq: e.Seq, Scope: e.Scope, EventID: e.EventID,
		Arrived: e.Arrived.UTC(), Attempts: e.Attempts, Dead: true}})
}
