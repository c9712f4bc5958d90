package caddymodule

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// Defaults of stored-response replay.
const (
	// defaultReplayMax is the largest body stored for replay: 64 KiB.
	defaultReplayMax = 64 << 10
	// maxReplayMax bounds replay_max: a stored body lives in a table row.
	maxReplayMax = 16 << 20
)

// defaultReplayHeaders is the allow-list of headers stored with a response.
var defaultReplayHeaders = []string{"Content-Type", "Content-Language", "Location"}

// ReplayConfig is how duplicates are answered: the short duplicate answer,
// or the upstream's own stored answer (replay response), and the
// Idempotency-Key mode for client APIs (provider idempotency_key, see
// idemkey.go).
type ReplayConfig struct {
	// Replay is how a duplicate of a completed event is answered: "short"
	// (200 with {"received":true,"duplicate":true}) or "response": the
	// status, allow-listed headers and body the upstream answered when the
	// event completed, plus Idempotent-Replayed: true. Default: "response"
	// for providers that read the answer (twilio, discord) and for provider
	// idempotency_key, "short" for the others. Not available in async mode.
	Replay string `json:"replay,omitempty"`

	// ReplayMax is the largest upstream body stored for replay, in bytes.
	// A larger answer, or one cut before its end, is stored as status and
	// headers only (logged, and shown by the admin API): its duplicates get
	// the status and headers with an empty body and
	// Idempotent-Replay-Incomplete (too-large or cut); under provider
	// idempotency_key, retries with the key get 502 instead (see
	// Handler.replay). Default: 65536 (64 KiB); at most 16 MiB.
	ReplayMax int64 `json:"replay_max,omitempty"`

	// ReplayHeaders are the response headers stored and replayed. Default:
	// Content-Type, Content-Language, Location. Content-Encoding is always
	// stored when present, since the stored body is encoded with it.
	// Hop-by-hop headers, Content-Length and Idempotent-Replayed are
	// refused. Stored answers are data a provider or client sent to
	// someone: they never reach logs, and the admin API shows only their
	// size and SHA-256.
	ReplayHeaders []string `json:"replay_headers,omitempty"`

	// IdempotencyKey configures provider idempotency_key (client APIs, no
	// signature); see IdempotencyKeyConfig.
	IdempotencyKey *IdempotencyKeyConfig `json:"idempotency_key,omitempty"`

	replayOn      bool
	replayHeaders []string // canonical names, Content-Encoding included
	idem          *idemKey // nil unless provider idempotency_key
}

// replayDefaults applies the replay defaults (part of applyDefaults). Explicit async + replay
// response is refused; a preset's default is dropped in async mode, where
// the answer is given before any upstream has answered.
func (h *Handler) replayDefaults() {
	if h.Replay == "" {
		h.Replay = "short"
		if h.preset.ReplayResponse || h.Provider == providerIdempotencyKey {
			h.Replay = "response"
		}
		if h.Mode == "async" {
			h.Replay = "short"
		}
	}
	if h.ReplayMax == 0 {
		h.ReplayMax = defaultReplayMax
	}
	names := h.ReplayHeaders
	if len(names) == 0 {
		names = defaultReplayHeaders
	}
	h.replayHeaders = h.replayHeaders[:0]
	for _, n := range append(slices.Clone(names), "Content-Encoding") {
		n = http.CanonicalHeaderKey(strings.TrimSpace(n))
		if !slices.Contains(h.replayHeaders, n) {
			h.replayHeaders = append(h.replayHeaders, n)
		}
	}
	h.replayOn = h.Replay == "response"
}

// unreplayable are headers a stored answer never carries: hop-by-hop ones,
// the length (recomputed) and the gateway's own marker.
var unreplayable = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te",
	"Trailer", "Transfer-Encoding", "Upgrade", "Content-Length", "Idempotent-Replayed"}

// validateReplay checks the replay fields; Provision has applied defaults.
func (h *Handler) validateReplay() error {
	switch h.Replay {
	case "short", "response":
	default:
		return fmt.Errorf("replay: want short or response, got %q", h.Replay)
	}
	if h.Replay == "response" && h.Mode == "async" {
		return errors.New("replay response: not available in async mode (the answer is given before the upstream's)")
	}
	if h.ReplayMax < 0 || h.ReplayMax > maxReplayMax {
		return fmt.Errorf("replay_max: must be between 1 and %d bytes, got %d", maxReplayMax, h.ReplayMax)
	}
	for _, n := range h.ReplayHeaders {
		if slices.Contains(unreplayable, http.CanonicalHeaderKey(strings.TrimSpace(n))) {
			return fmt.Errorf("replay_headers: %s cannot be replayed", n)
		}
	}
	return nil
}

// capture tees an upstream's answer on its way to the client: the final
// status, the allow-listed headers as they were when it was written, the
// body up to max bytes, and the whole body's size and SHA-256. It sits
// under the forward's ResponseRecorder, so streaming is unchanged.
type capture struct {
	*caddyhttp.ResponseWriterWrapper
	allow  []string
	max    int64
	status int
	header http.Header
	body   bytes.Buffer
	over   bool // the body exceeded max: not stored
	size   int64
	hash   hash.Hash
	// failed: a write to the client failed, so the next handler stopped
	// copying and the body seen is not the upstream's whole answer.
	failed bool
}

func (h *Handler) newCapture(w http.ResponseWriter) *capture {
	return &capture{
		ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
		allow:                 h.replayHeaders,
		max:                   h.ReplayMax,
		hash:                  sha256.New(),
	}
}

// WriteHeader records a final status and the allow-listed headers.
func (c *capture) WriteHeader(status int) {
	if c.status == 0 && status >= 200 {
		c.final(status)
	}
	c.ResponseWriter.WriteHeader(status)
}

func (c *capture) final(status int) {
	c.status = status
	c.header = http.Header{}
	src := c.ResponseWriter.Header()
	for _, n := range c.allow {
		if vs := src.Values(n); len(vs) > 0 {
			c.header[n] = slices.Clone(vs)
		}
	}
}

// Write tees p.
func (c *capture) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.final(http.StatusOK) // net/http writes 200 implicitly
	}
	n, err := c.ResponseWriter.Write(p)
	c.size += int64(n)
	c.hash.Write(p[:n])
	if !c.over {
		if int64(c.body.Len()+n) > c.max {
			c.over = true
			c.body = bytes.Buffer{}
		} else {
			c.body.Write(p[:n])
		}
	}
	if err != nil {
		c.failed = true
	}
	return n, err
}

// ReadFrom copies through Write, so nothing bypasses the tee (the embedded
// wrapper's ReadFrom would hand r to the client's writer directly).
func (c *capture) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(writerOnly{c}, r)
}

type writerOnly struct{ io.Writer }

// response is what is stored for the forward that ended as end: the body
// only when it was seen whole and within max; a cut body neither stored
// nor measured (store.Response.Cut).
func (c *capture) response(end forwardEnd) *store.Response {
	resp := &store.Response{Status: end.status, Header: c.header}
	if resp.Header == nil {
		resp.Header = http.Header{}
	}
	switch {
	case c.cut(end):
		resp.Cut = true
	case c.over:
		resp.Size, resp.SHA256 = c.size, hex.EncodeToString(c.hash.Sum(nil))
	default:
		resp.Size, resp.SHA256 = c.size, hex.EncodeToString(c.hash.Sum(nil))
		resp.Body = bytes.Clone(c.body.Bytes())
		if resp.Body == nil {
			resp.Body = []byte{}
		}
		resp.BodyStored = true
	}
	return resp
}

// cut reports whether the body seen is not the upstream's whole answer: a
// write to the client failed (the next handler then stops copying), or the
// next handler returned an error or panicked after the status
// (reverse_proxy raises http.ErrAbortHandler when the upstream's body ends
// early, a Content-Length it did not send included). A status that carries
// no body has nothing to cut.
func (c *capture) cut(end forwardEnd) bool {
	return bodyAllowed(end.status) && (c.failed || end.err != nil || end.panicked)
}

// storedResponse builds the response stored with a completed claim, and
// says in the log when only status and headers are stored (never the body
// itself).
func (h *Handler) storedResponse(c *capture, end forwardEnd, d *delivery) *store.Response {
	resp := c.response(end)
	resp.Fingerprint = d.fingerprint
	if resp.BodyStored {
		return resp
	}
	msg := "stored status and headers only, without the body; duplicates get an empty body"
	if h.idem != nil {
		msg = "stored status and headers only, without the body; retries with the key get 502"
	}
	fields := []zap.Field{zap.String("scope", h.Scope), zap.String("event_id", d.eventID), zap.Int("status", resp.Status)}
	if resp.Cut {
		fields = append(fields, zap.Int64("bytes_before_cut", c.size), zap.String("reason", "the body was cut before its end"))
	} else {
		fields = append(fields, zap.Int64("body_size", resp.Size), zap.Int64("replay_max", h.ReplayMax),
			zap.String("reason", "the body is larger than replay_max"))
	}
	h.logger.Warn(msg, fields...)
	return resp
}

// loadResponse reads the stored response of a completed event, bounded by
// storeTimeout; ErrNotFound when it completed without one.
func (h *Handler) loadResponse(parent context.Context, scope, id string) (*store.Response, error) {
	ctx, cancel := context.WithTimeout(parent, storeTimeout)
	defer cancel()
	resp, err := h.backend.Response(ctx, scope, id)
	if err != nil {
		return nil, err
	}
	return &resp, nil
}

// replayStored answers a duplicate the store reported: the stored answer,
// or the short duplicate answer when the event completed without one (it
// completed before replay was turned on, or an operator completed it). A
// store failure is a 503: the stored answer exists but cannot be read.
func (h *Handler) replayStored(w http.ResponseWriter, d *delivery, cl store.Claim) {
	ctx, id := d.r.Context(), d.eventID
	d.outcome, d.status = outcomeDuplicate, cl.Status
	resp, err := h.loadResponse(ctx, h.Scope, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		if c := h.logger.Check(zapcore.DebugLevel, "completed event has no stored response; answered with the short duplicate answer"); c != nil {
			c.Write(zap.String("scope", h.Scope), zap.String("event_id", id))
		}
		if h.dedupeBody {
			h.checkSameBody(ctx, id, d)
		}
		h.answer(w, d, ansDuplicate, say{})
		return
	case err != nil:
		if h.providerGone(d, false) {
			return
		}
		h.warnThrottled("reading the stored response failed; answered 503",
			zap.String("scope", h.Scope), zap.String("event_id", id), zap.Error(err))
		h.answer(w, d, ansStoredUnreadable, say{})
		return
	}
	h.completed.AddResponse(h.Scope, id, resp, h.responseTTL())
	if h.dedupeBody {
		h.checkSameBody(ctx, id, d)
	}
	d.status = resp.Status
	h.replay(w, resp, d)
}

// replay answers a duplicate with its stored response (respondReplay).
// Under provider idempotency_key an answer stored without its whole body
// is not replayed as if it were the client's answer: 502, a problem naming
// the upstream's status, and Idempotent-Replayed: true with
// Idempotent-Replay-Incomplete (cut, too-large). Never the status with an
// empty body, which a client would take for its answer. The request is not
// forwarded again while the key is kept: the upstream did the work, and the
// client must look its result up rather than retry under a new key.
func (h *Handler) replay(w http.ResponseWriter, resp *store.Response, d *delivery) {
	if h.idem == nil || resp.BodyStored {
		respondReplay(w, resp)
		return
	}
	d.reason = "the stored answer is incomplete: " + incompleteReason(resp)
	why := "its body was cut before its end"
	if !resp.Cut {
		why = "its body was larger than the gateway stores (replay_max)"
	}
	w.Header().Set(replayIncomplete, incompleteReason(resp))
	h.answer(w, d, ansIncomplete, say{upstreamStatus: resp.Status,
		detail: fmt.Sprintf("A request with this Idempotency-Key was processed: the upstream answered %d, but %s, "+
			"so the answer was not stored and cannot be replayed. The request is not processed again with this key; "+
			"do not retry it with a new key: look its result up instead.", resp.Status, why)})
}

// replayIncomplete is the header of a replay whose stored answer has no
// body (incompleteReason says why).
const replayIncomplete = "Idempotent-Replay-Incomplete"

// incompleteReason is the value of replayIncomplete for a response stored
// without its body: "cut" (cut before its end) or "too-large" (larger
// than replay_max).
func incompleteReason(resp *store.Response) string {
	if resp.Cut {
		return "cut"
	}
	return "too-large"
}

// respondReplay answers a duplicate with a stored response: its status,
// stored headers and body, plus Idempotent-Replayed: true. When only status
// and headers were stored the body is empty and Idempotent-Replay-Incomplete
// says why (cut, too-large). The header values are copied
// into one array, each header a capacity-limited window of it (as
// respondDuplicate does): header handlers may rewrite values in place, and
// the stored response is shared through the cache.
func respondReplay(w http.ResponseWriter, resp *store.Response) {
	n := 3
	for _, vs := range resp.Header {
		n += len(vs)
	}
	vals := make([]string, 0, n)
	hdr := w.Header()
	window := func(name string, vs ...string) {
		i := len(vals)
		vals = append(vals, vs...)
		hdr[name] = vals[i:len(vals):len(vals)]
	}
	for k, vs := range resp.Header {
		window(k, vs...)
	}
	window("Idempotent-Replayed", "true")
	body := bodyAllowed(resp.Status)
	if body {
		window("Content-Length", strconv.Itoa(len(resp.Body)))
		if !resp.BodyStored {
			window(replayIncomplete, incompleteReason(resp))
		}
	}
	w.WriteHeader(resp.Status)
	if body {
		_, _ = w.Write(resp.Body) //nolint:gosec // G705: the upstream's own stored answer, replayed byte for byte with its own Content-Type
	}
}

// bodyAllowed reports whether an answer with status may carry a body.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// unmarshalReplay parses replay, replay_max, replay_headers and the
// idempotency_key { } block.
func (h *Handler) unmarshalReplay(d *caddyfile.Dispenser, name string) error {
	switch name {
	case "replay":
		if !d.AllArgs(&h.Replay) {
			return d.ArgErr()
		}
		if h.Replay != "short" && h.Replay != "response" {
			return d.Errf("replay: want short or response, got %q", h.Replay)
		}
	case "replay_max":
		var s string
		if !d.AllArgs(&s) {
			return d.ArgErr()
		}
		n, err := humanize.ParseBytes(s)
		if err != nil || n == 0 || n > maxReplayMax {
			return d.Errf("replay_max: invalid size %q (at most 16MiB)", s)
		}
		h.ReplayMax = int64(n)
	case "replay_headers":
		h.ReplayHeaders = d.RemainingArgs()
		if len(h.ReplayHeaders) == 0 {
			return d.ArgErr()
		}
	case "idempotency_key":
		return h.unmarshalIdempotencyKey(d)
	}
	return nil
}
