package caddymodule

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// The intake: the first half of ServeHTTP. A request is read (its body, at
// most max_body, within read_timeout), authenticated and given its event
// ID, and handed to the route's mode (forward.go, async.go, batch.go); or
// it is answered here: refused, a handshake (handshake.go), or passed on
// without a claim. Signed webhooks and Idempotency-Key requests each have
// one implementation.

// intake takes a request in.
type intake interface {
	// take fills d (body, event ID, fingerprint) and reports true, or
	// answers the request itself and reports false with the error to
	// return to Caddy.
	take(w http.ResponseWriter, next caddyhttp.Handler, d *delivery) (bool, error)
}

// provisionIntake builds the route's intake: the Idempotency-Key reader of
// provider idempotency_key, or the verifier and event ID extractor of a
// signature provider (prepareConfig has judged the config).
func (h *Handler) provisionIntake() error {
	if h.Provider == providerIdempotencyKey {
		h.provisionIdempotencyKey()
		h.intake = keyIntake{h: h, k: h.idem}
		return nil
	}
	h.intake = webhookIntake{h}
	return h.provisionVerifier(caddy.NewReplacer())
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
	if err := h.provisionSingleUse(); err != nil {
		return err
	}
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
	h.recordOnBody = h.recordOnSignedContent(parts)
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

// webhookIntake takes in a signed webhook delivery: read the body, answer a
// provider handshake, verify the signature over the bytes the provider
// signed, read the event ID (or, under batch split, the items).
type webhookIntake struct{ h *Handler }

func (in webhookIntake) take(w http.ResponseWriter, next caddyhttp.Handler, d *delivery) (bool, error) {
	h, r := in.h, d.r
	if !h.readBody(w, d) {
		return false, nil
	}
	var hs signature.HandshakeAnswer
	handshake := false
	if len(h.preset.Challenges) > 0 { // the provider has handshakes (handshake.go)
		hs, handshake = h.matchHandshake(r, d.signed)
	}
	if handshake && hs.Challenge.Auth != signature.AuthSignature {
		return false, h.serveHandshake(w, hs, next, d)
	}
	if err := h.verifyBody(d); err != nil {
		h.refuse(w, d, err)
		return false, nil
	}
	if handshake {
		return false, h.serveHandshake(w, hs, next, d)
	}
	if !h.spendSingleUse(w, d) {
		return false, nil
	}
	if h.batch != nil && h.splitting(d.signed) { // a batching provider (batch.go)
		items, refused, err := h.batchItemsChecked(d.signed)
		if err != nil {
			h.answer(w, d, ansBadRequest, say{reason: eventIDReason(err)})
			return false, nil
		}
		d.items, d.split, d.refusedItems = items, true, refused
		return true, nil
	}
	id, err := h.eventID(d.signed, r.Header)
	if err != nil {
		// An ambiguous ID is not a missing one: the delivery names two
		// events, and the upstream may act on the other. Always refused.
		if h.OnMissingID == "forward" && !errors.Is(err, eventid.ErrAmbiguous) {
			d.outcome = outcomeForwardedNoID
			h.logger.Warn("delivery has no usable event id; forwarded without deduplication (on_missing_id forward)",
				zap.String("scope", h.Scope), zap.String("reason", eventIDReason(err)))
			return false, h.passOn(w, d.forwardable(), next, d)
		}
		h.answer(w, d, ansBadRequest, say{reason: eventIDReason(err)})
		return false, nil
	}
	d.eventID = id
	return true, nil
}

// verifyBody verifies the delivery's body: in memory (verifyDelivery), or
// spilled, read from its file by the streaming verifier.
func (h *Handler) verifyBody(d *delivery) error {
	if f := d.signedFile(); f != nil {
		return h.stream.VerifyReader(f.reader(), d.r.Header)
	}
	return h.verifyDelivery(d.r.Context(), d.signed, d.r.Header)
}

// refuse answers a delivery that failed verification; a store failure
// while reading a learned secret is a 503, not a refusal, and neither is
// a spilled body that could not be read back.
func (h *Handler) refuse(w http.ResponseWriter, d *delivery, err error) {
	if errors.Is(err, errSpillDisk) {
		h.warnThrottled("reading the body back from its temporary file failed; answered 503, nothing forwarded",
			zap.String("scope", h.Scope), zap.Error(err))
		h.answer(w, d, ansBodyUnkept, say{})
		return
	}
	if errors.Is(err, errSecretStore) {
		if h.providerGone(d, false) {
			return
		}
		h.warnThrottled("reading the learned secret failed; answered 503, nothing forwarded", zap.String("scope", h.Scope), zap.Error(err))
		h.answer(w, d, ansStoreUnavailable, say{})
		return
	}
	if errors.Is(err, signature.ErrKeyUnavailable) {
		// Not a verdict on the delivery: the provider retries a 503.
		h.warnThrottled("fetching the provider's signing key failed; answered 503, nothing recorded nor forwarded",
			zap.String("scope", h.Scope), zap.String("provider", h.Provider), zap.Error(err))
		h.answer(w, d, ansKeyUnavailable, say{})
		return
	}
	d.reason = err.Error()
	if h.preset.NeedsURL {
		d.signedURL = h.signedURL // a wrong configured url is the usual cause
	}
	h.answer(w, d, refusal(err), say{reason: signatureReason(err)})
}

// verify checks a delivery's signature. A route whose provider teaches its
// secret in a handshake checks it with the learned secret as well
// (handshake.go), which may read the store: a store failure wraps
// errSecretStore.
func (h *Handler) verify(ctx context.Context, body []byte, hdr http.Header) error {
	if h.learned != nil {
		return h.verifyLearned(ctx, body, hdr)
	}
	return h.verifier.Verify(body, hdr)
}

// eventID returns the delivery's event ID: the configured or default
// source's, or under batch set the key of the set of its item IDs
// (batch.go).
func (h *Handler) eventID(body []byte, hdr http.Header) (string, error) {
	if h.batch != nil && h.batched(body) {
		return h.batchKey(body)
	}
	return h.extractor.Extract(body, hdr)
}

// keyIntake takes in a request of provider idempotency_key: safe methods
// pass without a key; the key is read (idemkey.go), then the body; the
// event ID is the key scoped by the client, with the request's
// fingerprint.
type keyIntake struct {
	h *Handler
	k *idemKey
}

func (in keyIntake) take(w http.ResponseWriter, next caddyhttp.Handler, d *delivery) (bool, error) {
	h, k, r := in.h, in.k, d.r
	if safeMethod(r.Method) {
		d.outcome = outcomeForwardedNoID
		return false, h.passOn(w, r, next, d)
	}
	key, problem := k.key(r)
	switch {
	case problem != "":
		h.answer(w, d, ansKeyMalformed, say{reason: problem})
		return false, nil
	case key == "" && k.optional:
		d.outcome = outcomeForwardedNoID
		return false, h.passOn(w, r, next, d)
	case key == "":
		h.answer(w, d, ansKeyMissing, say{reason: k.header + " is missing",
			detail: "This operation is idempotent and requires an " + k.header + " request header (1 to 255 bytes)."})
		return false, nil
	}
	if !h.readBody(w, d) {
		return false, nil
	}
	d.signed = nil // nothing is verified
	id, ok := k.scoped(r, key)
	if !ok {
		h.answer(w, d, ansNoIdentity, say{detail: "Idempotency-Keys are kept per client: send " + k.identityName() + " with the key."})
		return false, nil
	}
	d.eventID, d.fingerprint = id, k.fingerprint(r, d.raw)
	return true, nil
}

// readBody reads the raw body, at most MaxBody bytes, into the delivery's
// buffer: d.raw is what the upstream gets, d.signed what the provider
// signed (the decoded body when Content-Encoding is gzip). It answers a
// body it refuses and reports false.
func (h *Handler) readBody(w http.ResponseWriter, d *delivery) bool {
	a, reason := h.read(w, d)
	if a != 0 {
		h.answer(w, d, a, say{reason: reason})
		return false
	}
	return true
}

// read is readBody's reading: a non-zero answer refuses the body, with
// that reason where the answer's row leaves it to the call. Every byte
// held is reserved in the route's body_budget first (budget.go): a body
// of known length before it is read, one of unknown length and a gzip
// body's decoded bytes as they come.
func (h *Handler) read(w http.ResponseWriter, d *delivery) (answerID, string) {
	r := d.r
	encs := r.Header.Values("Content-Encoding")
	if len(encs) > 1 {
		// The upstream would undo every line; only one is ever verified.
		return ansUnsupported, "unsupported Content-Encoding (sent on several lines)"
	}
	enc := ""
	if len(encs) == 1 {
		enc = strings.ToLower(strings.TrimSpace(encs[0]))
	}
	if enc != "" && enc != "identity" && enc != "gzip" {
		return ansUnsupported, "unsupported Content-Encoding (only gzip and identity)"
	}
	if r.ContentLength > h.MaxBody {
		return ansTooLarge, "body exceeds max_body"
	}
	if !d.reserve(r.ContentLength) { // -1 (unknown): reserved as it arrives
		return h.refuseBudget(d), ""
	}
	n, err := h.readWithDeadline(w, d, enc != "gzip" && h.stream != nil)
	d.bodyRead = err == nil && n <= h.MaxBody
	switch {
	case isTimeout(err):
		return ansReadTimeout, "body not received within read_timeout"
	case errors.Is(err, errBodyBudget):
		return h.refuseBudget(d), ""
	case errors.Is(err, errSpillDisk):
		h.warnThrottled("writing the body to a temporary file failed; answered 503, nothing forwarded",
			zap.String("scope", h.Scope), zap.Error(err))
		return ansBodyUnkept, ""
	case err != nil:
		return ansBadRequest, "reading body failed"
	case n > h.MaxBody:
		return ansTooLarge, "body exceeds max_body"
	case d.spill != nil:
		return 0, "" // verified from its file (spill.go)
	}
	d.raw = d.buf.Bytes()
	d.signed = d.raw
	if enc != "gzip" {
		return 0, ""
	}
	zr, err := gzip.NewReader(bytes.NewReader(d.raw))
	if err != nil {
		return ansBadRequest, "gzip body is malformed"
	}
	// The decoded bytes are held too, in memory or in a file: a small
	// compressed body can decode to max_body.
	decoded := d.meter(zr, h.MaxBody)
	// On a route that spills, at most spillAbove decoded bytes are held
	// in memory; the rest goes to a file (d.decoded), as a large body
	// that arrived uncompressed does.
	inMemory := h.MaxBody
	if h.stream != nil {
		inMemory = min(inMemory, spillAbove)
	}
	var dec bytes.Buffer
	m, err := dec.ReadFrom(io.LimitReader(decoded, inMemory+1))
	if m > inMemory && inMemory < h.MaxBody && err == nil {
		d.decoded, m, err = spillBody(dec.Bytes(), decoded, h.MaxBody)
	}
	switch {
	case errors.Is(err, errBodyBudget):
		return h.refuseBudget(d), ""
	case errors.Is(err, errSpillDisk):
		h.warnThrottled("writing the decoded body to a temporary file failed; answered 503, nothing forwarded",
			zap.String("scope", h.Scope), zap.Error(err))
		return ansBodyUnkept, ""
	case m > h.MaxBody:
		return ansTooLarge, "decoded body exceeds max_body"
	case err != nil:
		return ansBadRequest, "gzip body is malformed"
	case d.decoded == nil:
		d.signed = dec.Bytes()
	default:
		d.signed = nil
	}
	return 0, ""
}

// readWithDeadline reads the body (readInto, at most MaxBody+1 bytes)
// with the connection's read deadline set ReadTimeout from now, then clears
// it, so the next request on a kept-alive connection is not cut short.
// When the deadline passed it stays: net/http then gives up reading the
// rest of the trickled body at once and closes the connection after the
// 408. Where the writer cannot set a deadline (http.ErrNotSupported) the
// body is read without one.
func (h *Handler) readWithDeadline(w http.ResponseWriter, d *delivery, spill bool) (int64, error) {
	rc := http.NewResponseController(w)
	set := rc.SetReadDeadline(time.Now().Add(time.Duration(h.ReadTimeout))) == nil
	n, err := h.readInto(d, spill)
	if set && !isTimeout(err) {
		_ = rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// readInto reads the body into the delivery's buffer, or, when spill is
// set and the body is larger than spillAbove, into a temporary file
// (d.spill): straight away when Content-Length announces it, else once
// the buffer holds spillAbove bytes.
func (h *Handler) readInto(d *delivery, spill bool) (int64, error) {
	d.bodyStarted = true
	var body io.Reader = d.r.Body
	if d.r.ContentLength < 0 { // reserved as it arrives
		body = d.meter(body, h.MaxBody)
	} else if d.r.ContentLength <= min(h.MaxBody, presizeAtMost) {
		// One allocation, not MinRead steps doubled (7.7 KB for 1.7 KB).
		d.buf.Grow(int(d.r.ContentLength) + bytes.MinRead)
	}
	if !spill {
		return readAtMost(d.buf.Buffer, body, h.MaxBody)
	}
	if d.r.ContentLength <= spillAbove {
		n, err := readAtMost(d.buf.Buffer, body, spillAbove)
		if err != nil || n <= spillAbove {
			return n, err
		}
	}
	s, n, err := spillBody(d.buf.Bytes(), body, h.MaxBody)
	d.spill = s
	d.buf.Reset()
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

const (
	maxPooledBuf  = 1 << 20
	presizeAtMost = 64 << 10 // a declared length sizes the buffer up to this
)

// bodyBuf is a pooled buffer for a request body. The body buffer is pooled
// for deliveries answered at the edge. Once a request is forwarded the
// transport may still read its body after the next handler returns, so
// that buffer is left to the garbage collector.
type bodyBuf struct {
	*bytes.Buffer
	forwarded bool // set when the body is handed to the next handler
}

// getBodyBuf takes a buffer from the pool.
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
