package signature

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha1" //nolint:gosec // HMAC-SHA1 is what GitHub (legacy), Intercom and Twilio sign with.
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/tidwall/gjson"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
)

// engine verifies and signs any Scheme: the one generic HMAC implementation
// behind every data-only preset.
type engine struct {
	name      string
	primary   variant
	legacy    *variant // the Scheme's Legacy header, nil if it has none
	allowSHA1 bool     // legacy may be used (Options.AllowSHA1)
	parts     []part
	codec     codec
	keys      [][]byte
	tolerance time.Duration // 0: the scheme has no timestamp
	unit      time.Duration
	layout    string // Scheme.TimestampLayout: "" for Unix digits
	url       string
	jsonBody  bool
	now       func() time.Time
	signsID   bool
}

// variant is one way the signature header can be written: its header names,
// format and hash. GitHub has two (SHA-256 and the legacy SHA-1).
type variant struct {
	headers []HeaderSet
	format  Format
	hash    func() hash.Hash
	size    int
	// macs pools one keyed HMAC per secret (by index into engine.keys), so
	// a verification allocates no hash state and skips the key schedule.
	macs []sync.Pool
}

// macState is a pooled HMAC under one key, with room for its sum and for
// the short parts of the signed bytes.
type macState struct {
	h    hash.Hash
	sum  []byte
	text []byte
}

func newMACPools(h func() hash.Hash, keys [][]byte) []sync.Pool {
	pools := make([]sync.Pool, len(keys))
	for i, key := range keys {
		pools[i].New = func() any { return &macState{h: hmac.New(h, key)} }
	}
	return pools
}

func newEngine(p Preset, s Scheme, o Options) (*engine, error) {
	h, err := newHash(s.Algorithm)
	if err != nil {
		return nil, err
	}
	c, err := newCodec(s.Encoding)
	if err != nil {
		return nil, err
	}
	parts, err := parseTemplate(s.Signed)
	if err != nil {
		return nil, err
	}
	keys, err := decodeSecrets(s.Secret, o.Secrets)
	if err != nil {
		return nil, err
	}
	e := &engine{
		name:      p.Name,
		primary:   variant{headers: s.Headers, format: s.Format, hash: h, size: h().Size()},
		allowSHA1: o.AllowSHA1,
		parts:     parts,
		codec:     c,
		keys:      keys,
		unit:      s.TimestampUnit,
		layout:    s.TimestampLayout,
		url:       o.URL,
		jsonBody:  s.JSONBody,
		now:       o.Now,
	}
	if e.unit == 0 {
		e.unit = time.Second
	}
	if e.now == nil {
		e.now = time.Now
	}
	if p.DefaultTolerance > 0 {
		e.tolerance = p.DefaultTolerance
		if o.Tolerance > 0 {
			e.tolerance = o.Tolerance
		}
	}
	for _, pt := range parts {
		e.signsID = e.signsID || pt.kind == partID
	}
	if s.Legacy != nil {
		lh, err := newHash(s.Legacy.Algorithm)
		if err != nil {
			return nil, err
		}
		e.legacy = &variant{
			headers: []HeaderSet{{Signature: s.Legacy.Header}},
			format:  Format{Prefix: s.Legacy.Prefix},
			hash:    lh,
			size:    lh().Size(),
			macs:    newMACPools(lh, keys),
		}
	}
	e.primary.macs = newMACPools(h, keys)
	return e, nil
}

// Verify implements Verifier.
func (e *engine) Verify(body []byte, h http.Header) error {
	s, err := e.read(h)
	if err != nil {
		return err
	}
	defer s.release()
	if !e.match(s.v, s.sigs, body, s.ts, s.id) {
		return e.noMatch(s)
	}
	if e.jsonBody && !isJSONObject(body) {
		return fmt.Errorf("signed body is not a JSON object, which %s never sends: %w", e.name, ErrBodyNotJSON)
	}
	return nil
}

// signed is what a delivery's headers say about its signature: the header
// family present, its signatures, and the timestamp and ID it signs.
type signed struct {
	v      *variant
	hs     HeaderSet
	sigs   [][]byte
	ts, id string
	// d holds sigs' memory: the caller of read releases it once done with
	// them.
	d *digests
}

// release gives the signatures' memory back (see digests).
func (s signed) release() {
	if s.d != nil {
		s.d.release()
	}
}

// read parses and checks the signature headers (the timestamp against the
// tolerance), everything Verify checks before the body. The caller releases
// what it returns (signed.release) once it has matched the signatures.
func (e *engine) read(h http.Header) (signed, error) {
	v, hs, err := e.pick(h)
	if err != nil {
		return signed{}, err
	}
	raw, err := oneValue(h, hs.Signature)
	if err != nil {
		return signed{}, err
	}
	d := digestPool.Get().(*digests)
	ts, err := v.parse(hs.Signature, raw, e.codec, d)
	if err == nil && hs.Timestamp != "" {
		ts, err = oneValue(h, hs.Timestamp)
	}
	if err == nil && e.tolerance > 0 {
		check := checkTimestamp
		if e.layout != "" {
			check = layoutChecker(e.layout)
		}
		err = check(ts, e.unit, e.tolerance, e.now())
	}
	var id string
	if err == nil && e.signsID {
		id, err = oneValue(h, hs.ID)
	}
	if err != nil {
		d.release()
		return signed{}, err
	}
	return signed{v: v, hs: hs, sigs: d.sigs, ts: ts, id: id, d: d}, nil
}

func (e *engine) noMatch(s signed) error {
	return fmt.Errorf("%s: %d signature(s) checked against %d secret(s): %w",
		s.hs.Signature, len(s.sigs), len(e.keys), ErrNoMatchingSignature)
}

// pick chooses the header family present on the request. The legacy header
// counts only when no primary header is present and AllowSHA1 is set.
func (e *engine) pick(h http.Header) (*variant, HeaderSet, error) {
	for _, hs := range e.primary.headers {
		if present(h, hs.Signature) || present(h, hs.Timestamp) || present(h, hs.ID) {
			return &e.primary, hs, nil
		}
	}
	if e.legacy != nil && present(h, e.legacy.headers[0].Signature) {
		if e.allowSHA1 {
			return e.legacy, e.legacy.headers[0], nil
		}
		return nil, HeaderSet{}, fmt.Errorf("header %s: %w (%s is accepted only with allow_sha1)",
			e.primary.headers[0].Signature, ErrMissingHeader, e.legacy.headers[0].Signature)
	}
	return nil, HeaderSet{}, fmt.Errorf("header %s: %w", e.primary.headers[0].Signature, ErrMissingHeader)
}

// parse splits a signature header into its timestamp (list formats with a
// TimestampKey) and its decoded signatures, added to d.
func (v *variant) parse(name, raw string, c codec, d *digests) (ts string, err error) {
	f := v.format
	if f.List == "" {
		rest, ok := strings.CutPrefix(raw, f.Prefix)
		if !ok {
			return "", fmt.Errorf("header %s does not start with %q: %w", name, f.Prefix, ErrMalformedHeader)
		}
		if !d.add(c, strings.TrimSpace(rest), v.size) {
			return "", fmt.Errorf("header %s does not hold a %s digest of %d bytes: %w", name, c.name, v.size, ErrMalformedHeader)
		}
		return "", nil
	}
	if f.TimestampFirst {
		entries := strings.Split(raw, f.List)
		ts = strings.TrimSpace(entries[0])
		for _, e := range entries[1:] {
			d.add(c, strings.TrimSpace(e), v.size)
		}
		if len(d.sigs) == 0 {
			return "", fmt.Errorf("header %s has no usable signature after its timestamp: %w", name, ErrMalformedHeader)
		}
		return ts, nil
	}
	seenTS := false
	for entry := range strings.SplitSeq(raw, f.List) {
		entry = strings.TrimSpace(entry)
		key, val, ok := strings.Cut(entry, f.Pair)
		if !ok {
			if f.Lenient {
				continue
			}
			return "", fmt.Errorf("header %s has an entry without %q: %w", name, f.Pair, ErrMalformedHeader)
		}
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		switch {
		case f.TimestampKey != "" && key == f.TimestampKey:
			if seenTS {
				return "", fmt.Errorf("header %s has more than one %s= timestamp: %w", name, f.TimestampKey, ErrMalformedHeader)
			}
			seenTS, ts = true, val
		case key == f.SigKey:
			// Undecodable entries are skipped, as the providers' libraries
			// do; they can never match anyway.
			d.add(c, val, v.size)
		}
	}
	if f.TimestampKey != "" && !seenTS {
		return "", fmt.Errorf("header %s has no %s= timestamp: %w", name, f.TimestampKey, ErrMalformedHeader)
	}
	if len(d.sigs) == 0 {
		return "", fmt.Errorf("header %s has no usable %s signature: %w", name, f.SigKey, ErrMalformedHeader)
	}
	return ts, nil
}

// match reports whether any signature equals the MAC of the signed bytes
// under any key. Comparisons are constant-time.
func (e *engine) match(v *variant, sigs [][]byte, body []byte, ts, id string) bool {
	for i, key := range e.keys {
		if len(v.macs) != len(e.keys) { // a variant built without pools
			sum := e.mac(v, key, body, ts, id)
			for _, sig := range sigs {
				if hmac.Equal(sum, sig) {
					return true
				}
			}
			continue
		}
		m := v.macs[i].Get().(*macState)
		m.h.Reset()
		m.text = e.writeSigned(m.h, m.text, body, ts, id)
		m.sum = m.h.Sum(m.sum[:0])
		ok := false
		for _, sig := range sigs {
			if hmac.Equal(m.sum, sig) {
				ok = true
				break
			}
		}
		v.macs[i].Put(m)
		if ok {
			return true
		}
	}
	return false
}

// mac computes the HMAC of the signed bytes described by the template.
func (e *engine) mac(v *variant, key, body []byte, ts, id string) []byte {
	m := hmac.New(v.hash, key)
	e.writeSigned(m, nil, body, ts, id)
	return m.Sum(nil)
}

// writeSigned writes the signed bytes described by the template to m, in
// order, without copying the body. The short parts go through scratch
// (a string converted for an interface call would be allocated); the
// possibly grown scratch is returned for reuse.
func (e *engine) writeSigned(m hash.Hash, scratch, body []byte, ts, id string) []byte {
	for _, pt := range e.parts {
		if pt.kind == partBody {
			m.Write(body)
			continue
		}
		scratch = append(scratch[:0], e.text(pt, ts, id)...)
		m.Write(scratch)
	}
	return scratch
}

// text is a template part other than the body: its text in the signed
// bytes.
func (e *engine) text(pt part, ts, id string) string {
	switch pt.kind {
	case partText:
		return pt.text
	case partTimestamp:
		return ts
	case partID:
		return id
	case partURL:
		return e.url
	case partMethod:
		return http.MethodPost
	}
	return ""
}

// sign sets the headers the provider would send, signed with the first
// secret. GitHub's legacy header is set too, as GitHub sends both.
func (e *engine) sign(body []byte, h http.Header, ts time.Time) error {
	hs := e.primary.headers[0]
	var tsText string
	if e.tolerance > 0 {
		tsText = strconv.FormatInt(ts.Unix(), 10)
		if e.unit == time.Millisecond {
			tsText = strconv.FormatInt(ts.UnixMilli(), 10)
		}
		if e.layout != "" {
			tsText = ts.UTC().Format(e.layout)
		}
	}
	var id string
	if e.signsID {
		if id = h.Get(hs.ID); id == "" {
			return fmt.Errorf("signing %s needs header %s set", e.name, hs.ID)
		}
	}
	sig := e.codec.encode(e.mac(&e.primary, e.keys[0], body, tsText, id))
	f := e.primary.format
	value := f.Prefix + sig
	switch {
	case f.TimestampFirst:
		value = tsText + f.List + sig
	case f.List != "":
		value = f.SigKey + f.Pair + sig
		if f.TimestampKey != "" {
			value = f.TimestampKey + f.Pair + tsText + f.List + value
		}
	}
	h.Set(hs.Signature, value)
	if hs.Timestamp != "" {
		h.Set(hs.Timestamp, tsText)
	}
	if e.legacy != nil {
		l := e.legacy
		h.Set(l.headers[0].Signature, l.format.Prefix+e.codec.encode(e.mac(l, e.keys[0], body, tsText, id)))
	}
	return nil
}

// checkTimestamp parses a signed timestamp (decimal digits only) and checks
// it is within tolerance of now, in both directions; exactly tolerance away
// is still accepted. A refusal names the raw timestamp, its unit and the
// tolerance, never a distance: a timestamp in the wrong unit (milliseconds
// sent to a seconds scheme) lies thousands of years away, beyond what a
// time.Duration holds, and its distance would print as a saturated
// 2562047h47m16s.
func checkTimestamp(text string, unit, tolerance time.Duration, now time.Time) error {
	if text == "" || len(text) > 19 || strings.TrimLeft(text, "0123456789") != "" {
		return fmt.Errorf("timestamp is not a whole number: %w", ErrMalformedHeader)
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		return fmt.Errorf("timestamp is out of range: %w", ErrMalformedHeader)
	}
	t := time.Unix(n, 0)
	if unit == time.Millisecond {
		t = time.UnixMilli(n)
	}
	// Compare instants, not durations: a far-off timestamp would saturate a
	// Duration.
	var side string
	switch {
	case t.Before(now.Add(-tolerance)):
		side = "in the past"
	case t.After(now.Add(tolerance)):
		side = "in the future"
	default:
		return nil
	}
	return fmt.Errorf("timestamp %s (unix %s%s) is further %s than the tolerance of %s: %w",
		text, unitName(unit), unitHint(text, unit, now), side, tolerance, ErrTimestampOutOfTolerance)
}

func unitName(unit time.Duration) string {
	if unit == time.Millisecond {
		return "milliseconds"
	}
	return "seconds"
}

// unitHint names the likely mistake when a timestamp has the digit count of
// the other unit: 13 digits are today's Unix time in milliseconds, 10 in
// seconds.
func unitHint(text string, unit time.Duration, now time.Time) string {
	switch {
	case unit == time.Second && len(text) == len(strconv.FormatInt(now.UnixMilli(), 10)):
		return "; it looks like milliseconds"
	case unit == time.Millisecond && len(text) == len(strconv.FormatInt(now.Unix(), 10)):
		return "; it looks like seconds"
	}
	return ""
}

// present reports whether the request carries header name (any case).
func present(h http.Header, name string) bool {
	return name != "" && len(values(h, name)) > 0
}

// values returns every value of header name. net/http canonicalises names,
// but a header built by hand may hold a lower-case key (as HTTP/2 writes
// them): those count too, so a second line can never hide.
func values(h http.Header, name string) []string {
	vals := slices.Clip(h.Values(name)) // append must not write into the header's array
	canon := http.CanonicalHeaderKey(name)
	for k, vs := range h {
		if k != canon && strings.EqualFold(k, name) {
			vals = append(vals, vs...)
		}
	}
	return vals
}

// oneValue returns the single value of header name: absent is
// ErrMissingHeader, repeated on several lines or empty is ErrMalformedHeader.
func oneValue(h http.Header, name string) (string, error) {
	vals := values(h, name)
	switch {
	case len(vals) == 0:
		return "", fmt.Errorf("header %s: %w", name, ErrMissingHeader)
	case len(vals) > 1:
		return "", fmt.Errorf("header %s sent on %d lines: %w", name, len(vals), ErrMalformedHeader)
	}
	v := strings.TrimSpace(vals[0])
	if v == "" {
		return "", fmt.Errorf("header %s is empty: %w", name, ErrMalformedHeader)
	}
	return v, nil
}

// isJSONObject reports whether body is valid JSON whose top level is an
// object. gjson's validator accepts exactly what encoding/json.Valid accepts
// (checked by differential fuzzing) at about twice the speed: on a 2 KB
// Stripe event this check was 40% of the duplicate path's CPU.
// A leading UTF-8 byte order mark is not part of the JSON text
// (eventid.JSONText).
func isJSONObject(body []byte) bool {
	body = eventid.JSONText(body)
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	return len(trimmed) > 0 && trimmed[0] == '{' && gjson.ValidBytes(body)
}

// decodeSecrets turns configured secrets into HMAC keys.
func decodeSecrets(format string, secrets []string) ([][]byte, error) {
	keys := make([][]byte, 0, len(secrets))
	for i, s := range secrets {
		key := []byte(s)
		if format == "whsec" {
			var err error
			key, err = base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "whsec_"))
			if err != nil {
				return nil, fmt.Errorf("secret %d is not base64 after its whsec_ prefix", i+1)
			}
			if len(key) == 0 {
				return nil, fmt.Errorf("secret %d decodes to an empty key", i+1)
			}
		}
		keys = append(keys, key)
	}
	return keys, nil
}

func newHash(name string) (func() hash.Hash, error) {
	switch name {
	case "sha1":
		return sha1.New, nil
	case "sha256":
		return sha256.New, nil
	case "sha512":
		return sha512.New, nil
	}
	return nil, fmt.Errorf("unknown algorithm %q (want sha1, sha256 or sha512)", name)
}

// codec is a signature encoding.
type codec struct {
	name   string
	encode func([]byte) string
	decode func(string) ([]byte, error)
	// appendDecode appends the decoding of src to dst (hex.AppendDecode,
	// base64.Encoding.AppendDecode): Verify decodes into pooled memory. Set
	// by newCodec, which builds every engine's codec.
	appendDecode func(dst, src []byte) ([]byte, error)
}

func newCodec(name string) (codec, error) {
	switch name {
	case "hex":
		// Hex decoding accepts either case; the providers write lower case.
		return codec{name: name, encode: hex.EncodeToString, decode: hex.DecodeString, appendDecode: hex.AppendDecode}, nil
	case "base64":
		b := base64.StdEncoding.Strict()
		return codec{name: name, encode: b.EncodeToString, decode: b.DecodeString, appendDecode: b.AppendDecode}, nil
	case "base64url":
		// Unpadded URL-safe base64 (RFC 4648 section 5), as Sanity writes it.
		b := base64.RawURLEncoding.Strict()
		return codec{name: name, encode: b.EncodeToString, decode: b.DecodeString, appendDecode: b.AppendDecode}, nil
	}
	return codec{}, fmt.Errorf("unknown encoding %q (want hex, base64 or base64url)", name)
}

// digests holds the signatures Verify decoded from a header, in memory
// reused from one verification to the next (digestPool): a delivery's
// check allocates nothing for them.
type digests struct {
	sigs [][]byte
	buf  []byte
}

var digestPool = sync.Pool{New: func() any { return &digests{sigs: make([][]byte, 0, 4), buf: make([]byte, 0, 256)} }}

// add decodes s with c and keeps it when it is a digest of size bytes. A
// digest is appended to buf only where it fits, so the earlier ones, which
// sigs points into, never move.
func (d *digests) add(c codec, s string, size int) bool {
	if !digestSized(s, size) {
		return false
	}
	if cap(d.buf)-len(d.buf) < len(s) { // no decoding is longer than its text
		d.buf = make([]byte, 0, max(2*cap(d.buf), len(s)))
	}
	start := len(d.buf)
	out, err := c.appendDecode(d.buf, unsafe.Slice(unsafe.StringData(s), len(s))) //nolint:gosec // audited: the decoders only read src and keep none of it
	if err != nil || len(out)-start != size {
		return false
	}
	d.buf = out
	d.sigs = append(d.sigs, out[start:len(out):len(out)])
	return true
}

// release empties d and returns it to the pool.
func (d *digests) release() {
	clear(d.sigs)
	d.sigs, d.buf = d.sigs[:0], d.buf[:0]
	digestPool.Put(d)
}

// digestSized reports whether s is short enough to be the text of a digest
// of size bytes (the bound, 4 characters a byte, is above every codec's:
// hex, the longest, takes 2), so that longer text is refused before it is
// decoded.
func digestSized(s string, size int) bool { return s != "" && len(s) <= 4*size }

// decodeDigest decodes s and checks it is a digest of size bytes.
func (c codec) decodeDigest(s string, size int) ([]byte, bool) {
	if !digestSized(s, size) {
		return nil, false
	}
	b, err := c.decode(s)
	if err != nil || len(b) != size {
		return nil, false
	}
	return b, true
}

type partKind int

const (
	partText partKind = iota
	partBody
	partTimestamp
	partID
	partURL
	partMethod
)

// part is one piece of the signed bytes.
type part struct {
	kind partKind
	text string
}

// parseTemplate parses a Scheme.Signed template such as
// "v0:{timestamp}:{body}". The body must appear exactly once.
func parseTemplate(t string) ([]part, error) {
	var parts []part
	bodies := 0
	for t != "" {
		i := strings.IndexByte(t, '{')
		if i < 0 {
			parts = append(parts, part{kind: partText, text: t})
			break
		}
		if i > 0 {
			parts = append(parts, part{kind: partText, text: t[:i]})
		}
		name, rest, ok := strings.Cut(t[i+1:], "}")
		if !ok {
			return nil, errors.New("unterminated { in signed template")
		}
		switch name {
		case "body":
			bodies++
			parts = append(parts, part{kind: partBody})
		case "timestamp":
			parts = append(parts, part{kind: partTimestamp})
		case "id":
			parts = append(parts, part{kind: partID})
		case "url":
			parts = append(parts, part{kind: partURL})
		case "method":
			parts = append(parts, part{kind: partMethod})
		default:
			return nil, fmt.Errorf("unknown {%s} in signed template", name)
		}
		t = rest
	}
	if bodies != 1 {
		return nil, errors.New("signed template must contain {body} exactly once")
	}
	return parts, nil
}
