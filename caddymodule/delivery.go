package caddymodule

import (
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/cache"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/sendonce"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// delivery is one request on its way through the handler: what the intake
// read (body, event ID), and what its log line and metric report. It is
// the one value a request allocates for it.
type delivery struct {
	h     *Handler
	r     *http.Request
	start time.Time
	buf   bodyBuf
	// raw is the body as it arrived (what the upstream gets); signed the
	// bytes verified (the decoded body of a gzip delivery; nil under
	// provider idempotency_key).
	raw, signed []byte
	// spill holds a body past spillAbove on a route that spills
	// (spill.go); raw and signed are nil then.
	spill *spillFile
	// decoded holds the decoded body of a gzip delivery past spillAbove
	// on a route that spills: what was signed, while raw (in memory) is
	// what the upstream gets; signed is nil then. A small compressed body
	// can decode to max_body: in memory, each such request would cost
	// max_body before its signature is checked.
	decoded *spillFile
	// bodyRead: the body was read to its end (else answer bounds the
	// reading of the rest: endUnreadBody); bodyStarted: its reading began.
	bodyRead, bodyStarted bool
	// reserved is what the delivery holds of its scope's body_budget
	// (budget.go), returned by done; bodyMeter reserves it chunk by chunk
	// for a body of unknown length and a gzip body's decoded bytes.
	reserved  int64
	bodyMeter bodyMeter
	// items are the items of a batch forwarded one by one (split).
	items []signature.BatchItem
	split bool
	// refusedItems counts the items of a split delivery that failed their
	// own signature (a provider that signs each item): left out.
	refusedItems int

	eventID string
	// known is what the cache of completed events knows of eventID (when
	// knownOK), looked up once by eventIDValue; not under replay response,
	// whose cache holds answers.
	known   cache.Entry
	knownOK bool
	outcome string
	attempt int
	// ambiguousBefore counts the event's earlier forwards that ended with
	// no known outcome (store.Claim.Ambiguous): settle holds the event
	// when this forward ends so too.
	ambiguousBefore int
	status          int
	cached          bool
	upstream        time.Duration
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

// deliveryPool recycles deliveries: the intake and the mode are
// interfaces, so a delivery handed to them lives on the heap; pooled, a
// request costs no allocation for it. Nothing keeps a delivery past
// ServeHTTP (the forward's heartbeat and the completion written after the
// answer hold only claim.Refs).
var deliveryPool = sync.Pool{New: func() any { return new(delivery) }}

// takeDelivery takes a delivery of r from the pool, with a body buffer.
func takeDelivery(h *Handler, r *http.Request) *delivery {
	d := deliveryPool.Get().(*delivery)
	d.h, d.r, d.start, d.buf = h, r, time.Now(), getBodyBuf()
	return d
}

// done logs the delivery, removes its temporary files, returns its body
// buffer (unless forwarded) and its share of the body budget, and puts it
// back in the pool. ServeHTTP defers it, so it runs however the request
// ends: answered, refused, timed out or panicking.
func (d *delivery) done() {
	d.log()
	if d.spill != nil {
		d.spill.remove()
	}
	if d.decoded != nil {
		d.decoded.remove()
	}
	d.buf.release()
	if d.reserved > 0 {
		d.h.budget.give(d.reserved)
	}
	*d = delivery{}
	deliveryPool.Put(d)
}

// eventIDValue looks the event up in the cache of completed events (see
// known) and returns the value of its placeholder: the cache's own when the
// event is known, so a cached duplicate boxes no string for it, else the
// ID.
func (d *delivery) eventIDValue() any {
	h := d.h
	if h.completed != nil && !h.replayOn {
		d.known, d.knownOK = h.completed.Has(h.Scope, d.eventID)
		if id, ok := d.known.ID.(string); d.knownOK && ok && id == d.eventID {
			return d.known.ID
		}
	}
	return d.eventID
}

// forwardable returns the request with its body put back exactly as it
// arrived, for the next handler.
func (d *delivery) forwardable() *http.Request {
	if d.spill != nil {
		sendonce.SetReader(d.r, d.spill.reader(), d.spill.size)
		return d.r
	}
	d.buf.forwarded = true
	sendonce.SetBody(d.r, d.raw)
	return d.r
}

// signedFile is the file of the verified body when it was spilled (the
// body as it arrived, or a gzip delivery's decoded body); nil when it is
// in memory (signed).
func (d *delivery) signedFile() *spillFile {
	if d.spill != nil {
		return d.spill
	}
	return d.decoded
}

// bodyKey is bodyKey of what the signature covers of the verified body, in
// memory or spilled (only schemes that sign the bytes spill).
func (d *delivery) bodyKey() string {
	if f := d.signedFile(); f != nil {
		return f.key()
	}
	return bodyKey(d.covered())
}

// covered is what the signature covers of the verified body
// (signature.Preset.Covered): replay records are keyed on it, so a
// capture re-encoded in a way the signature cannot see (a form's
// parameters reordered) is still the delivery it was.
func (d *delivery) covered() []byte {
	return d.h.coveredOf(d.signed, d.r.Header)
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

// warnThrottled writes a warning that any sender can cause (a flood of
// unsigned bodies, of handshakes), or that every delivery meets while the
// store or the disk fails (a retry storm during an outage), at most once a
// second per message and route, with times: how often it happened since
// the last such line, this one included. What happened after the last line
// is written a second after it (the latest occurrence's fields), so the
// lines' times add up to every occurrence, as the metrics and each
// delivery's own line count them.
func (h *Handler) warnThrottled(msg string, fields ...zap.Field) {
	h.logThrottled(zapcore.WarnLevel, msg, fields...)
}

// logThrottled is warnThrottled at level lvl.
func (h *Handler) logThrottled(lvl zapcore.Level, msg string, fields ...zap.Field) {
	v, ok := h.throttled.Load(msg)
	if !ok {
		v, _ = h.throttled.LoadOrStore(msg, &throttle{log: h.logger, lvl: lvl, msg: msg})
	}
	v.(*throttle).note(fields)
}

// throttle is logThrottled's state for one message.
type throttle struct {
	log *zap.Logger
	lvl zapcore.Level
	msg string

	mu      sync.Mutex
	last    time.Time   // when the last line was written
	n       int64       // occurrences since then
	pending []zap.Field // the latest of them, for the trailing line
	trail   *time.Timer // armed to write the trailing line
}

func (t *throttle) note(fields []zap.Field) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n++
	// While the trailing line is due, it is the next line: a timer that
	// fired and waits for the lock would otherwise write a second line
	// right after this one.
	if t.trail == nil && time.Since(t.last) >= time.Second {
		t.writeLocked(fields)
		return
	}
	t.pending = append(t.pending[:0], fields...)
	if t.trail == nil {
		t.trail = time.AfterFunc(time.Until(t.last.Add(time.Second)), func() {
			t.mu.Lock()
			defer t.mu.Unlock()
			t.trail = nil
			if t.n > 0 {
				t.writeLocked(t.pending)
			}
		})
	}
}

func (t *throttle) writeLocked(fields []zap.Field) {
	t.log.Log(t.lvl, t.msg, append(fields[:len(fields):len(fields)], zap.Int64("times", t.n))...)
	t.n, t.last = 0, time.Now()
	clear(t.pending) // keep no error or event ID alive
	t.pending = t.pending[:0]
}

// logFields pools the field slices of the per-delivery log line.
var logFields = sync.Pool{New: func() any {
	s := make([]zap.Field, 0, 16)
	return &s
}}
