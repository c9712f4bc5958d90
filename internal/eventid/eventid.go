// Package eventid extracts a provider's event ID from a verified delivery:
// from a header, a JSON path over the raw body (gjson, no full unmarshal) or a
// form field of a form-encoded body. Several parts can be combined into one
// composite key for providers that have no single per-event ID.
package eventid

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// MaxLen is the longest accepted event ID, in bytes (after joining parts).
const MaxLen = 255

// Errors returned by Extract; each names why a delivery has no usable ID.
var (
	ErrMissing   = errors.New("event id missing")
	ErrEmpty     = errors.New("event id empty")
	ErrNotScalar = errors.New("event id is not a string or number")
	ErrTooLong   = errors.New("event id longer than 255 bytes")
	ErrAmbiguous = errors.New("event id given more than once")
	ErrBadBody   = errors.New("body is not valid for the event id source")
	// ErrNotText: the ID holds a NUL byte or is not valid UTF-8; no
	// provider sends one, and PostgreSQL's text cannot store it.
	ErrNotText = errors.New("event id is not text (a NUL byte or invalid UTF-8)")
)

// Kind is where a part of the ID is read from.
type Kind string

// Kinds of Source.
const (
	Header Kind = "header" // a request header, by case-insensitive name
	JSON   Kind = "json"   // a gjson path over a JSON body, e.g. "data.object.id"
	Form   Kind = "form"   // a field of an application/x-www-form-urlencoded body
	// FormSHA256 is the hex SHA-256 of a form field, for a provider whose
	// only per-notification value is too long to be an ID (Braintree's
	// bt_payload, the whole notification).
	FormSHA256 Kind = "form_sha256"
	// JWSPayload reads a JSON path inside the payload of a compact JWS
	// carried by a JSON member: Name is "<member path>#<payload path>",
	// e.g. Apple's "signedPayload#notificationUUID". The verifier has
	// checked the JWS before the ID is read; this only decodes it.
	JWSPayload Kind = "jws"
)

// Source is one place an ID part is read from.
type Source struct {
	// Kind is where the part is read from: "header" (a request header, by
	// case-insensitive name), "json" (a plain gjson path over the raw JSON
	// body: member names and array indexes, no wildcards, queries or
	// modifiers), "form" (a field of an
	// application/x-www-form-urlencoded body, percent-decoded),
	// "form_sha256" (the hex SHA-256 of a form field, for a provider whose
	// only per-notification value is the whole notification: Braintree's
	// bt_payload) or "jws" (a JSON path inside the payload of a compact JWS
	// carried by a JSON member, named "<member path>#<payload path>":
	// Apple's "signedPayload#notificationUUID").
	Kind Kind `json:"from"`
	// Name is the header's name, the JSON path (e.g. data.object.id), the
	// form field's name, or for jws "<member path>#<payload path>".
	Name string `json:"name"`
}

func (s Source) String() string { return string(s.Kind) + " " + s.Name }

// ParseSource parses "header X-Name", "json path" or "form field".
func ParseSource(kind, name string) (Source, error) {
	s := Source{Kind: Kind(kind), Name: name}
	switch s.Kind {
	case Header, JSON, Form, FormSHA256, JWSPayload:
	default:
		return Source{}, fmt.Errorf("unknown event id source %q (want header, json, form, form_sha256 or jws)", kind)
	}
	if name == "" {
		return Source{}, fmt.Errorf("event id source %s needs a name", kind)
	}
	if s.Kind == JSON {
		if _, err := parseJSONPath(name); err != nil {
			return Source{}, err
		}
	}
	if s.Kind == JWSPayload {
		member, inner, ok := strings.Cut(name, "#")
		if !ok {
			return Source{}, fmt.Errorf("event id source jws %q: want <member>#<payload path>", name)
		}
		for _, p := range []string{member, inner} {
			if _, err := parseJSONPath(p); err != nil {
				return Source{}, err
			}
		}
	}
	return s, nil
}

// Extractor reads the event ID of a delivery. Parts are joined into one
// composite key; each part is a list of alternatives, the first present one
// wins (Shopify: X-Shopify-Event-Id, else X-Shopify-Webhook-Id).
type Extractor struct {
	parts     [][]Source
	paths     [][][]string // the member names of each json source, by part and alternative
	validJSON bool         // AssumeValidJSON
}

// New returns an Extractor whose key joins every part. With one part of one
// alternative the ID is the value itself; composite keys are encoded as a JSON
// array of the parts' values, which cannot be confused with another split.
// A json source's path must be a plain path (see parseJSONPath).
func New(parts [][]Source) (*Extractor, error) {
	if len(parts) == 0 {
		return nil, errors.New("no event id source")
	}
	paths := make([][][]string, len(parts))
	for i, alts := range parts {
		if len(alts) == 0 {
			return nil, errors.New("empty event id part")
		}
		paths[i] = make([][]string, len(alts))
		for j, s := range alts {
			if s.Kind != JSON {
				continue
			}
			names, err := parseJSONPath(s.Name)
			if err != nil {
				return nil, err
			}
			paths[i][j] = names
		}
	}
	return &Extractor{parts: parts, paths: paths}, nil
}

// Parts returns the extractor's configuration.
func (e *Extractor) Parts() [][]Source { return e.parts }

// AssumeValidJSON tells the extractor that every body it will be given was
// already checked to be valid JSON by the same validator (a signature
// verifier that refuses anything else, as stripe's does), so json sources
// skip validating it again: on a 2 KB event that was a third of the
// duplicate path's work. Call it before the first Extract. With an invalid
// body an assuming extractor may return a wrong ID; it never panics.
func (e *Extractor) AssumeValidJSON() { e.validJSON = true }

// Extract returns the event ID of a delivery whose (decoded) body and headers
// are given. The errors are ErrMissing, ErrEmpty, ErrNotScalar, ErrTooLong,
// ErrAmbiguous, ErrBadBody and ErrNotText, wrapped with the source's name.
//
// ErrAmbiguous means the delivery names its event in two ways that parsers
// read differently, so the gateway and the upstream could disagree on which
// event it is: a member name on a json path given twice in one object
// (after unescaping, or ignoring case), a form field given twice, or a
// header sent on several lines with different values.
func (e *Extractor) Extract(body []byte, h http.Header) (string, error) {
	body = JSONText(body)
	var form url.Values
	var small [4]string // no allocation for the usual one-part key
	vals := small[:0]
	for _, alts := range e.parts {
		var (
			v   string
			err error
		)
		for j, s := range alts {
			v, err = extractOne(s, e.paths[len(vals)][j], body, h, &form, e.validJSON)
			if !errors.Is(err, ErrMissing) {
				break
			}
		}
		if err != nil {
			return "", err
		}
		vals = append(vals, v)
	}
	id := vals[0]
	if len(vals) > 1 {
		b, _ := json.Marshal(slices.Clone(vals)) // a copy escapes, not small
		id = string(b)
	}
	if len(id) > MaxLen {
		return "", ErrTooLong
	}
	return id, nil
}

// extractOne reads one source; path is a json source's parsed member names.
func extractOne(s Source, path []string, body []byte, h http.Header, form *url.Values, validJSON bool) (string, error) {
	switch s.Kind {
	case Header:
		vs := headerValues(h, s.Name)
		if len(vs) == 0 {
			return "", fmt.Errorf("header %s: %w", s.Name, ErrMissing)
		}
		// The same value on several lines (an intermediary that repeats a
		// header) is still one ID; two values are two answers.
		v := strings.TrimSpace(vs[0])
		for _, o := range vs[1:] {
			if strings.TrimSpace(o) != v {
				return "", fmt.Errorf("header %s sent on %d lines with different values: %w", s.Name, len(vs), ErrAmbiguous)
			}
		}
		return checkValue(s, v)
	case JSON:
		if !validJSON && !gjson.ValidBytes(body) {
			return "", fmt.Errorf("json %s: %w: not JSON", s.Name, ErrBadBody)
		}
		r, err := lookupJSON(body, path)
		if err != nil {
			return "", fmt.Errorf("json %s: %w", s.Name, err)
		}
		// r shares the body's memory (a pooled buffer): checkValue's result
		// is cloned before it is kept.
		switch r.Type {
		case gjson.String:
			if loneSurrogate(r.Raw) {
				// gjson (like encoding/json) turns a lone \ud800-\udfff
				// escape into U+FFFD, so "\ud801" and "\ud802" would be one
				// key: refuse such IDs instead of merging distinct events.
				return "", fmt.Errorf("%s: %w", s, ErrNotText)
			}
			return cloned(checkValue(s, r.Str))
		case gjson.Number:
			// Keyed by the exact decimal text, so 2^63+1 is not rounded.
			return cloned(checkValue(s, r.Raw))
		case gjson.Null:
			if !r.Exists() {
				return "", fmt.Errorf("json %s: %w", s.Name, ErrMissing)
			}
			return "", fmt.Errorf("json %s: %w", s.Name, ErrNotScalar)
		default:
			return "", fmt.Errorf("json %s: %w", s.Name, ErrNotScalar)
		}
	case JWSPayload:
		return jwsPayloadID(s, body)
	case Form, FormSHA256:
		if *form == nil {
			f, err := url.ParseQuery(string(bytes.TrimSpace(body)))
			if err != nil {
				return "", fmt.Errorf("form %s: %w: not form-encoded", s.Name, ErrBadBody)
			}
			*form = f
		}
		vs := (*form)[s.Name]
		switch {
		case len(vs) == 0:
			return "", fmt.Errorf("form %s: %w", s.Name, ErrMissing)
		case len(vs) > 1:
			// Also a name spelled twice ("a" and "%61"): url.ParseQuery
			// unescapes names. Frameworks read the first or the last.
			return "", fmt.Errorf("form %s given %d times: %w", s.Name, len(vs), ErrAmbiguous)
		}
		if s.Kind == FormSHA256 {
			if vs[0] == "" {
				return "", fmt.Errorf("form %s: %w", s.Name, ErrEmpty)
			}
			sum := sha256.Sum256([]byte(vs[0]))
			return hex.EncodeToString(sum[:]), nil
		}
		return checkValue(s, vs[0])
	}
	return "", fmt.Errorf("unknown event id source %q", s.Kind)
}

// cloned copies a value that may share the body's memory.
func cloned(v string, err error) (string, error) {
	return strings.Clone(v), err
}

// headerValues returns every value of header name, also under keys that are
// not in canonical form (a hand-built header, as HTTP/2 writes names), so
// names are case-insensitive and a second line can never hide.
func headerValues(h http.Header, name string) []string {
	vals := slices.Clip(h.Values(name)) // append must not write into the header's array
	canon := http.CanonicalHeaderKey(name)
	for k, vs := range h {
		if len(k) == len(name) && k != canon && strings.EqualFold(k, name) {
			vals = append(vals, vs...)
		}
	}
	return vals
}

// checkValue checks an ID part read from s; s names it in errors only, so
// a valid ID costs no message string.
func checkValue(s Source, v string) (string, error) {
	switch {
	case v == "":
		return "", fmt.Errorf("%s: %w", s, ErrEmpty)
	case len(v) > MaxLen:
		return "", fmt.Errorf("%s: %w", s, ErrTooLong)
	case !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0:
		return "", fmt.Errorf("%s: %w", s, ErrNotText)
	}
	return v, nil
}

// loneSurrogate reports whether a raw JSON string holds a \uD800-\uDFFF
// escape that is not half of a surrogate pair.
func loneSurrogate(raw string) bool {
	for i := 0; i+6 <= len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		if raw[i+1] != 'u' {
			i++ // skip the escaped character (it may be a backslash)
			continue
		}
		hi, ok := hex4(raw[i+2 : i+6])
		switch {
		case !ok || hi < 0xD800 || hi > 0xDFFF:
		case hi <= 0xDBFF && i+12 <= len(raw) && raw[i+6] == '\\' && raw[i+7] == 'u':
			lo, ok := hex4(raw[i+8 : i+12])
			if !ok || lo < 0xDC00 || lo > 0xDFFF {
				return true
			}
			i += 11
			continue
		default:
			return true
		}
		i += 5
	}
	return false
}

func hex4(s string) (rune, bool) {
	var r rune
	for i := 0; i < 4; i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// jwsPayloadID reads a JWSPayload source: the member's compact JWS, its
// payload (base64url JSON), then the path in it, with json's rules (one
// string or number; a repeated member name on either path is ErrAmbiguous).
func jwsPayloadID(s Source, body []byte) (string, error) {
	member, inner, _ := strings.Cut(s.Name, "#")
	outer, _ := parseJSONPath(member)
	names, _ := parseJSONPath(inner)
	if !gjson.ValidBytes(body) {
		return "", fmt.Errorf("jws %s: %w: not JSON", s.Name, ErrBadBody)
	}
	r, err := lookupJSON(body, outer)
	switch {
	case err != nil:
		return "", fmt.Errorf("jws %s: %w", s.Name, err)
	case !r.Exists():
		return "", fmt.Errorf("jws %s: %w", s.Name, ErrMissing)
	case r.Type != gjson.String:
		return "", fmt.Errorf("jws %s: %w", s.Name, ErrNotScalar)
	}
	parts := strings.Split(r.Str, ".")
	if len(parts) != 3 {
		return "", fmt.Errorf("jws %s: %w: not a compact JWS", s.Name, ErrBadBody)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil || !gjson.ValidBytes(payload) {
		return "", fmt.Errorf("jws %s: %w: payload is not base64url JSON", s.Name, ErrBadBody)
	}
	v, err := lookupJSON(payload, names)
	switch {
	case err != nil:
		return "", fmt.Errorf("jws %s: %w", s.Name, err)
	case !v.Exists():
		return "", fmt.Errorf("jws %s: %w", s.Name, ErrMissing)
	case v.Type == gjson.String:
		return cloned(checkValue(s, v.Str))
	case v.Type == gjson.Number:
		return cloned(checkValue(s, v.Raw))
	}
	return "", fmt.Errorf("jws %s: %w", s.Name, ErrNotScalar)
}
