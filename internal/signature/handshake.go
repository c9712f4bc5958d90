package signature

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
)

// Stability says whether a preset's default event ID stays the same when the
// provider retries one event, per the provider's documentation.
type Stability string

// Values of Preset.IDStability.
const (
	// StabilityStable: documented to be the same on every retry of an event.
	StabilityStable Stability = "stable"
	// StabilityPerDelivery: a new value on every attempt; it cannot
	// deduplicate retries on its own, so such a preset has no default.
	StabilityPerDelivery Stability = "per delivery"
	// StabilityUndocumented: the ID names the event, but the provider does
	// not say what its retries carry.
	StabilityUndocumented Stability = "undocumented"
	// StabilityNone: the preset has no default event ID; configure one.
	StabilityNone Stability = "none"
)

// ChallengeAuth is how a handshake request is authenticated before it is
// answered.
type ChallengeAuth string

// Values of Challenge.Auth.
const (
	// AuthNone: anyone may trigger the answer. Only used where the answer
	// reveals nothing but what the request itself carries.
	AuthNone ChallengeAuth = "none"
	// AuthSignature: the handshake is signed like a delivery; verify it with
	// the preset's Verifier first.
	AuthSignature ChallengeAuth = "signature"
	// AuthVerifyToken: query parameter Challenge.TokenQuery must equal the
	// route's configured verify token (HandshakeAnswer.CheckToken), as Meta
	// and Strava document. The verify token is not the signing secret.
	AuthVerifyToken ChallengeAuth = "verify_token"
)

// AnswerKind is how a recognised handshake is answered.
type AnswerKind string

// Values of Challenge.Answer. "The value" is what Challenge.Echo names.
const (
	// AnswerText: 200 text/plain; charset=utf-8, the body is the value.
	AnswerText AnswerKind = "text"
	// AnswerJSON: 200 application/json, {"<JSONKey>": "<value>"}.
	AnswerJSON AnswerKind = "json"
	// AnswerHeader: 200, empty body, response header EchoHeader = the value.
	AnswerHeader AnswerKind = "header"
	// AnswerEmpty: 200 with an empty body.
	AnswerEmpty AnswerKind = "empty"
	// AnswerFixed: 200 application/json with Challenge.Body as is.
	AnswerFixed AnswerKind = "fixed"
	// AnswerZoom: 200 application/json {"plainToken": v, "encryptedToken":
	// hex HMAC-SHA256(secret, v)}, Zoom's endpoint.url_validation answer.
	AnswerZoom AnswerKind = "zoom"
	// AnswerBraintree: 200 text/plain "<public key>|<hex HMAC-SHA1 keyed
	// with SHA-1(private key) of the value>", Braintree's bt_challenge
	// answer (the route's secret is "<public key>:<private key>"); a value
	// that is not 20 to 32 lowercase hex digits is Incomplete, as the
	// braintree library refuses it.
	AnswerBraintree AnswerKind = "braintree"
	// AnswerForward: no answer at the edge; forward upstream without a
	// claim (the handshake is the legacy handler's to answer).
	AnswerForward AnswerKind = "forward"
)

// Challenge describes one endpoint handshake (or heartbeat) of a provider as
// data: how to recognise it, how to authenticate it and how to answer it.
// Handshakes are never claimed nor deduplicated.
//
// Recognition: every non-empty condition must hold. Values are compared
// exactly (header and query names case as HTTP defines them).
type Challenge struct {
	// Name is a short label for logs and the provider table, e.g.
	// "hub.challenge" or "heartbeat".
	Name string
	// Method is the request method, e.g. GET; "" matches any method.
	Method string
	// Query is a query parameter that must be present and non-empty;
	// with QueryValue it must equal it.
	Query, QueryValue string
	// Header is a request header that must be present and non-empty; with
	// HeaderValue it must equal it.
	Header, HeaderValue string
	// BodyField is a path of member names separated by dots, optionally
	// ending in "#" (the length of an array), that must exist in a JSON
	// object body, each name given once in its object (see bodyMember);
	// with BodyValue its value must equal it: a BodyValue that is a JSON
	// number matches a number as written ("1" is the number 1, not "1" nor
	// 1.0; "events.#" with "0" matches an empty events array), any other a
	// string after unescaping.
	BodyField, BodyValue string

	// Auth is how the handshake is authenticated.
	Auth ChallengeAuth
	// TokenQuery is the query parameter carrying the verify token
	// (AuthVerifyToken only).
	TokenQuery string

	// Answer is how it is answered.
	Answer AnswerKind
	// Echo names the echoed value: "query <name>", "header <name>" or
	// "json <gjson path>". Required by text, json, header and zoom.
	Echo string
	// JSONKey is the member of an AnswerJSON answer: "challenge",
	// "verification".
	JSONKey string
	// EchoHeader is the response header of an AnswerHeader answer.
	EchoHeader string
	// Body is the answer of AnswerFixed.
	Body string
	// NoSniff adds X-Content-Type-Options: nosniff (Dropbox requires it).
	NoSniff bool
	// LearnSecret names a value ("header <name>" or "json <path>") that
	// becomes the route's signing secret (Asana's X-Hook-Secret). The route
	// stores it durably; a stored secret is replaced only by a handshake the
	// provider authenticates (Auth != AuthNone), never by an unauthenticated
	// one, so a forged handshake cannot take the route over.
	LearnSecret string
}

// HandshakeAnswer is what the edge sends back for a recognised handshake,
// plus what the caller must check or store before sending it.
type HandshakeAnswer struct {
	// Challenge is the handshake that matched; its Auth says what to check
	// before answering.
	Challenge Challenge
	// Forward: do not answer; forward upstream without a claim.
	Forward bool
	// Status, Header and Body are the answer (Status 200).
	Status int
	Header http.Header
	Body   []byte
	// Token is the presented verify token (AuthVerifyToken).
	Token string
	// Secret is the value LearnSecret names, to store as the route's
	// secret; "" when the handshake teaches none.
	Secret string
	// Incomplete names what the request lacks to be answered ("json
	// challenge": the value to echo, or the secret to learn) when it has
	// the handshake's shape but not that value; "" when it is complete.
	// Such a handshake is still never claimed: the edge refuses it (the
	// provider's own handshake always carries the value), handshake
	// forward passes it on. Status, Header and Body are then unset.
	Incomplete string
}

// CheckToken reports whether the presented verify token equals one of the
// configured ones, in constant time over SHA-256 digests.
func (a HandshakeAnswer) CheckToken(tokens []string) bool {
	if a.Token == "" {
		return false
	}
	got := sha256.Sum256([]byte(a.Token))
	ok := false
	for _, t := range tokens {
		want := sha256.Sum256([]byte(t))
		if t != "" && hmac.Equal(got[:], want[:]) {
			ok = true
		}
	}
	return ok
}

// MatchHandshake reports whether r (with its already read body) is one of
// the preset's handshakes and, if so, builds the answer. It is a pure
// function of its inputs: it neither verifies nor stores anything. The
// caller then authenticates per answer.Challenge.Auth (verify the
// signature, or CheckToken), stores answer.Secret if any, and writes the
// answer (Respond) or forwards when answer.Forward; an answer.Incomplete
// one cannot be answered. secret is the route's first signing secret, used
// only by AnswerZoom. Handshakes are tried in order; the first whose shape
// matches wins, complete or not.
func (p Preset) MatchHandshake(r *http.Request, body []byte, secret string) (HandshakeAnswer, bool) {
	for i := range p.Challenges {
		c := &p.Challenges[i]
		if c.matches(r, body) {
			return c.answer(r, body, secret), true
		}
	}
	return HandshakeAnswer{}, false
}

// Respond writes the answer to w. It must not be called when Forward is set.
func (a HandshakeAnswer) Respond(w http.ResponseWriter) {
	for k, vs := range a.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(a.Status)
	if len(a.Body) > 0 {
		_, _ = w.Write(a.Body)
	}
}

func (c *Challenge) matches(r *http.Request, body []byte) bool {
	if c.Method != "" && r.Method != c.Method {
		return false
	}
	if c.Query != "" {
		v := queryValue(r, c.Query)
		if v == "" || (c.QueryValue != "" && v != c.QueryValue) {
			return false
		}
	}
	return c.matchesSigned(body, r.Header)
}

// matchesSigned checks the header and body conditions.
func (c *Challenge) matchesSigned(body []byte, h http.Header) bool {
	if c.Header != "" {
		v := strings.TrimSpace(h.Get(c.Header))
		if v == "" || (c.HeaderValue != "" && v != c.HeaderValue) {
			return false
		}
	}
	if c.BodyField != "" {
		v, ok := bodyMember(body, c.BodyField)
		if !ok {
			return false
		}
		if c.BodyValue != "" {
			if gjson.Valid(c.BodyValue) && gjson.Parse(c.BodyValue).Type == gjson.Number {
				return v.Type == gjson.Number && v.Raw == c.BodyValue
			}
			return v.Type == gjson.String && v.Str == c.BodyValue
		}
	}
	return true
}

// bodyMember resolves a Challenge's BodyField in a JSON object body:
// member names separated by dots, each given exactly once in its object
// (topMember's rule: a repeated name, after unescaping or ignoring case,
// makes ok false, since parsers disagree on which one counts and the
// upstream could read this body as an event), and a final "#" for the
// length of the array reached.
func bodyMember(body []byte, path string) (gjson.Result, bool) {
	var v gjson.Result
	doc := body
	for name := range strings.SplitSeq(path, ".") {
		if name == "#" {
			if !v.IsArray() {
				return gjson.Result{}, false
			}
			n := strconv.Itoa(len(v.Array()))
			return gjson.Result{Type: gjson.Number, Raw: n, Num: float64(len(v.Array()))}, true
		}
		var ok bool
		if v, ok = topMember(doc, name); !ok {
			return gjson.Result{}, false
		}
		doc = []byte(v.Raw)
	}
	return v, true
}

// queryValue is the first value of the query parameter name, matched as
// header names are, ignoring case: providers spell a handshake's parameter
// differently (Microsoft Graph sends validationToken, SharePoint list
// webhooks and OneDrive validationtoken). An exact match wins.
func queryValue(r *http.Request, name string) string {
	q := r.URL.Query()
	if vs, ok := q[name]; ok && len(vs) > 0 {
		return vs[0]
	}
	for k, vs := range q {
		if strings.EqualFold(k, name) && len(vs) > 0 {
			return vs[0]
		}
	}
	return ""
}

// lookup reads the value a "query|header|json <name>" reference names.
func lookup(ref string, r *http.Request, body []byte) string {
	kind, name, _ := strings.Cut(ref, " ")
	switch kind {
	case "query":
		return queryValue(r, name)
	case "header":
		return strings.TrimSpace(r.Header.Get(name))
	case "json":
		if res := gjson.GetBytes(eventid.JSONText(body), name); res.Type == gjson.String {
			return res.Str
		}
	}
	return ""
}

// answer builds the answer of a request that has the handshake's shape;
// one without the value to learn or echo is Incomplete.
func (c *Challenge) answer(r *http.Request, body []byte, secret string) HandshakeAnswer {
	a := HandshakeAnswer{Challenge: *c, Status: http.StatusOK, Header: http.Header{}}
	if c.Auth == AuthVerifyToken {
		a.Token = queryValue(r, c.TokenQuery)
	}
	if c.LearnSecret != "" {
		if a.Secret = lookup(c.LearnSecret, r, body); a.Secret == "" {
			return HandshakeAnswer{Challenge: *c, Token: a.Token, Incomplete: c.LearnSecret, Forward: c.Answer == AnswerForward}
		}
	}
	var v string
	if c.Echo != "" {
		if v = lookup(c.Echo, r, body); v == "" {
			return HandshakeAnswer{Challenge: *c, Token: a.Token, Incomplete: c.Echo, Forward: c.Answer == AnswerForward}
		}
	}
	if c.NoSniff {
		a.Header.Set("X-Content-Type-Options", "nosniff")
	}
	switch c.Answer {
	case AnswerText:
		a.Header.Set("Content-Type", "text/plain; charset=utf-8")
		a.Body = []byte(v)
	case AnswerJSON:
		a.Header.Set("Content-Type", "application/json")
		a.Body, _ = json.Marshal(map[string]string{c.JSONKey: v})
	case AnswerHeader:
		a.Header.Set(c.EchoHeader, v)
	case AnswerEmpty:
	case AnswerFixed:
		a.Header.Set("Content-Type", "application/json")
		a.Body = []byte(c.Body)
	case AnswerZoom:
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte(v))
		a.Header.Set("Content-Type", "application/json")
		a.Body, _ = json.Marshal(map[string]string{"plainToken": v, "encryptedToken": hex.EncodeToString(m.Sum(nil))})
	case AnswerBraintree:
		pub, priv, ok := strings.Cut(secret, ":")
		if !ok || !braintreeChallenge.MatchString(v) {
			return HandshakeAnswer{Challenge: *c, Incomplete: c.Echo}
		}
		a.Header.Set("Content-Type", "text/plain; charset=utf-8")
		a.Body = []byte(pub + "|" + braintreeDigest(priv, []byte(v)))
	case AnswerForward:
		a.Forward, a.Status, a.Header = true, 0, nil
	}
	return a
}

// validate checks that the description can be run.
func (c *Challenge) validate() error {
	if c.Name == "" {
		return errors.New("no name")
	}
	if c.Method == "" && c.Query == "" && c.Header == "" && c.BodyField == "" {
		return errors.New("no recognition condition")
	}
	switch c.Auth {
	case AuthNone, AuthSignature:
	case AuthVerifyToken:
		if c.TokenQuery == "" {
			return errors.New("verify_token needs TokenQuery")
		}
	default:
		return fmt.Errorf("unknown auth %q", c.Auth)
	}
	refOK := func(ref string) bool {
		kind, name, ok := strings.Cut(ref, " ")
		return ok && name != "" && (kind == "query" || kind == "header" || kind == "json")
	}
	switch c.Answer {
	case AnswerText, AnswerJSON, AnswerHeader, AnswerZoom, AnswerBraintree:
		if !refOK(c.Echo) {
			return fmt.Errorf("answer %s needs Echo as query|header|json <name>", c.Answer)
		}
	case AnswerEmpty, AnswerForward:
	case AnswerFixed:
		if !json.Valid([]byte(c.Body)) {
			return errors.New("fixed answer body is not JSON")
		}
	default:
		return fmt.Errorf("unknown answer %q", c.Answer)
	}
	if c.Answer == AnswerJSON && c.JSONKey == "" {
		return errors.New("json answer needs JSONKey")
	}
	if c.Answer == AnswerHeader && !validHeaderName(c.EchoHeader) {
		return errors.New("header answer needs EchoHeader")
	}
	if c.LearnSecret != "" && !refOK(c.LearnSecret) {
		return errors.New("LearnSecret must be header|json <name>")
	}
	if c.BodyField != "" {
		names := strings.Split(c.BodyField, ".")
		for i, n := range names {
			if n == "" || (n == "#" && (i == 0 || i != len(names)-1)) || (n != "#" && strings.ContainsAny(n, `\*?#@|[]{}!`)) {
				return fmt.Errorf("BodyField %q: want member names separated by dots, optionally ending in #", c.BodyField)
			}
		}
	}
	return nil
}

// Describe renders the handshake for the provider table, e.g.
// "GET ?hub.challenge → text (verify_token)".
func (c Challenge) Describe() string {
	var when []string
	if c.Method != "" {
		when = append(when, c.Method)
	}
	if c.Query != "" {
		q := "?" + c.Query
		if c.QueryValue != "" {
			q += "=" + c.QueryValue
		}
		when = append(when, q)
	}
	if c.Header != "" {
		h := c.Header
		if c.HeaderValue != "" {
			h += ": " + c.HeaderValue
		}
		when = append(when, h)
	}
	if c.BodyField != "" {
		b := "body " + c.BodyField
		if c.BodyValue != "" {
			b += "=" + c.BodyValue
		}
		when = append(when, b)
	}
	ans := string(c.Answer)
	switch c.Answer {
	case AnswerText:
		ans = "echo " + c.Echo + " as text"
	case AnswerJSON:
		ans = `{"` + c.JSONKey + `": ` + c.Echo + "}"
	case AnswerHeader:
		ans = "echo " + c.Echo + " in " + c.EchoHeader
	case AnswerFixed:
		ans = c.Body
	case AnswerEmpty:
		ans = "empty 200"
	case AnswerBraintree:
		ans = "public key|HMAC-SHA1 of " + c.Echo
	}
	s := c.Name + ": " + strings.Join(when, " ") + " → " + ans + " (auth " + string(c.Auth) + ")"
	if c.LearnSecret != "" {
		s += "; secret learned from " + c.LearnSecret
	}
	return s
}
