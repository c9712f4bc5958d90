package signature

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
)

// Schemes whose signature, timestamp or signed bytes live in the body rather
// than in headers: Mailgun (signature object in the JSON body), Microsoft
// Graph (clientState in every notification), Linear (webhookTimestamp in the
// signed body) and Gitea/Forgejo form deliveries (payload=<json>, the JSON
// signed). The generic engine reads headers only, so each has code here.

// bodySigner is implemented by schemes that sign inside the body: signBody
// returns body with the signature written into it.
type bodySigner interface {
	signBody(body []byte, ts time.Time) ([]byte, error)
}

// headerAlsoSigner is a bodySigner that also sets headers (Adyen's Basic
// credentials).
type headerAlsoSigner interface {
	signHeaders(h http.Header) error
}

// SignDelivery is Sign for every scheme: it returns the body to send, which
// differs from body where the provider writes into it (Mailgun's signature,
// Graph's clientState, Linear's webhookTimestamp), and sets h as Sign does.
// It is meant for tests and the CLI.
func SignDelivery(provider string, o Options, body []byte, h http.Header, ts time.Time) ([]byte, error) {
	s, err := build(provider, o)
	if err != nil {
		return nil, err
	}
	switch v := s.(type) {
	case bodySigner:
		out, err := v.signBody(body, ts)
		if hs, ok := s.(headerAlsoSigner); ok && err == nil {
			err = hs.signHeaders(h)
		}
		return out, err
	case *bodyTimestamp:
		if body, err = v.stamp(body, ts); err != nil {
			return nil, err
		}
	}
	if err := s.sign(body, h, ts); err != nil {
		return nil, err
	}
	return body, nil
}

// mailgun verifies Mailgun's body signature: {"signature": {"timestamp":
// "<unix s>", "token": "<50 chars>", "signature": "<hex>"}, "event-data":
// {...}}, where signature = hex HMAC-SHA256(signing key, timestamp+token).
// The event data itself is not signed (Mailgun's design): the timestamp
// tolerance is what keeps a captured signature from being reused, so it is
// always checked.
// See https://documentation.mailgun.com/docs/mailgun/user-manual/webhooks/securing-webhooks
type mailgun struct {
	keys      [][]byte
	tolerance time.Duration
	now       func() time.Time
}

func buildMailgun(p Preset, o Options) (signer, error) {
	m := &mailgun{}
	m.tolerance, m.now = clock(p, o)
	for _, s := range o.Secrets {
		m.keys = append(m.keys, []byte(s))
	}
	return m, nil
}

func (m *mailgun) Verify(body []byte, _ http.Header) error {
	if !isJSONObject(body) {
		return fmt.Errorf("body is not a JSON object carrying signature: %w", ErrMissingHeader)
	}
	f := gjson.GetManyBytes(body, "signature.timestamp", "signature.token", "signature.signature")
	for i, name := range []string{"signature.timestamp", "signature.token", "signature.signature"} {
		if !f[i].Exists() {
			return fmt.Errorf("body field %s: %w", name, ErrMissingHeader)
		}
		if f[i].Type != gjson.String || f[i].Str == "" {
			return fmt.Errorf("body field %s is not a non-empty string: %w", name, ErrMalformedHeader)
		}
	}
	ts, token := f[0].Str, f[1].Str
	sig, err := hex.DecodeString(f[2].Str)
	if err != nil || len(sig) != sha256.Size {
		return fmt.Errorf("body field signature.signature is not a hex SHA-256 digest: %w", ErrMalformedHeader)
	}
	if err := checkTimestamp(ts, time.Second, m.tolerance, m.now()); err != nil {
		return err
	}
	for _, k := range m.keys {
		if hmac.Equal(mailgunMAC(k, ts, token), sig) {
			return nil
		}
	}
	return fmt.Errorf("signature.signature matches none of %d key(s): %w", len(m.keys), ErrNoMatchingSignature)
}

func mailgunMAC(key []byte, ts, token string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(ts))
	h.Write([]byte(token))
	return h.Sum(nil)
}

func (m *mailgun) signBody(body []byte, ts time.Time) ([]byte, error) {
	tsText := strconv.FormatInt(ts.Unix(), 10)
	seed := sha256.Sum256(append([]byte(tsText), body...))
	token := hex.EncodeToString(seed[:25]) // 50 characters, as Mailgun's
	out, err := sjson.SetBytes(body, "signature", map[string]string{
		"timestamp": tsText,
		"token":     token,
		"signature": hex.EncodeToString(mailgunMAC(m.keys[0], tsText, token)),
	})
	if err != nil {
		return nil, fmt.Errorf("writing the signature into the body: %w", err)
	}
	return out, nil
}

func (m *mailgun) sign([]byte, http.Header, time.Time) error {
	return errors.New("mailgun signs inside the body: use SignBody")
}

// graphClientState verifies Microsoft Graph change notifications: there is
// no signature, but every notification in the body's value array carries
// the clientState the subscription was created with, a shared secret
// compared in constant time (over SHA-256 digests) with every configured
// secret. All items must carry a matching clientState: one forged item
// cannot ride along with genuine ones.
// See https://learn.microsoft.com/en-us/graph/change-notifications-delivery-webhooks
type graphClientState struct {
	digests [][]byte
	first   string
}

func buildGraph(_ Preset, o Options) (signer, error) {
	g := &graphClientState{first: o.Secrets[0]}
	for _, s := range o.Secrets {
		d := sha256.Sum256([]byte(s))
		g.digests = append(g.digests, d[:])
	}
	return g, nil
}

func (g *graphClientState) Verify(body []byte, _ http.Header) error {
	if !isJSONObject(body) {
		return fmt.Errorf("body is not a JSON object with a value array: %w", ErrMissingHeader)
	}
	items := gjson.GetBytes(eventid.JSONText(body), "value")
	if !items.IsArray() || len(items.Array()) == 0 {
		return fmt.Errorf("body has no notifications in value: %w", ErrMissingHeader)
	}
	for i, it := range items.Array() {
		cs := it.Get("clientState")
		if !cs.Exists() {
			return fmt.Errorf("notification %d has no clientState: %w", i+1, ErrMissingHeader)
		}
		if cs.Type != gjson.String || cs.Str == "" {
			return fmt.Errorf("notification %d clientState is not a non-empty string: %w", i+1, ErrMalformedHeader)
		}
		d := sha256.Sum256([]byte(cs.Str))
		ok := false
		for _, want := range g.digests {
			if hmac.Equal(d[:], want) {
				ok = true
			}
		}
		if !ok {
			return fmt.Errorf("notification %d clientState matches none of %d secret(s): %w", i+1, len(g.digests), ErrNoMatchingSignature)
		}
	}
	return nil
}

// signBody writes clientState into every notification of value[]; a body
// without value[] gets one notification holding only clientState.
func (g *graphClientState) signBody(body []byte, _ time.Time) ([]byte, error) {
	if !gjson.GetBytes(body, "value").IsArray() {
		return sjson.SetBytes(body, "value", []map[string]string{{"clientState": g.first}})
	}
	n := len(gjson.GetBytes(body, "value").Array())
	out := body
	for i := 0; i < n; i++ {
		var err error
		if out, err = sjson.SetBytes(out, "value."+strconv.Itoa(i)+".clientState", g.first); err != nil {
			return nil, fmt.Errorf("writing clientState: %w", err)
		}
	}
	return out, nil
}

func (g *graphClientState) sign([]byte, http.Header, time.Time) error {
	return errors.New("msgraph carries clientState inside the body: use SignBody")
}

// bodyTimestamp checks, after the wrapped verifier accepted the signature,
// a timestamp written inside the signed body (Linear's webhookTimestamp, in
// milliseconds): as it is signed, it bounds replays the way a signed header
// timestamp does. A body without it is refused, as Linear's SDK does.
type bodyTimestamp struct {
	signer
	path      string
	unit      time.Duration
	tolerance time.Duration
	now       func() time.Time
}

func (b *bodyTimestamp) Verify(body []byte, h http.Header) error {
	if err := b.signer.Verify(body, h); err != nil {
		return err
	}
	ts := gjson.GetBytes(body, b.path)
	switch {
	case !ts.Exists():
		return fmt.Errorf("signed body has no %s: %w", b.path, ErrMissingHeader)
	case ts.Type != gjson.Number:
		return fmt.Errorf("signed body's %s is not a number: %w", b.path, ErrMalformedHeader)
	}
	return checkTimestamp(ts.Raw, b.unit, b.tolerance, b.now())
}

// stamp writes ts into the body at the timestamp's path, as the provider
// does before signing.
func (b *bodyTimestamp) stamp(body []byte, ts time.Time) ([]byte, error) {
	n := ts.Unix()
	if b.unit == time.Millisecond {
		n = ts.UnixMilli()
	}
	out, err := sjson.SetBytes(body, b.path, n)
	if err != nil {
		return nil, fmt.Errorf("writing %s into the body: %w", b.path, err)
	}
	return out, nil
}

// withBodyTimestamp builds p's engine and wraps it in a bodyTimestamp check
// of path (unit: Scheme.TimestampUnit) with p's tolerance.
func withBodyTimestamp(path string) func(p Preset, o Options) (signer, error) {
	return func(p Preset, o Options) (signer, error) {
		s := p.Scheme
		if o.HMAC != (HMACOptions{}) {
			var err error
			if s, err = overrideScheme(p, o.HMAC); err != nil {
				return nil, err
			}
		}
		q := p
		q.DefaultTolerance = 0 // the header scheme has no timestamp
		e, err := newEngine(q, s, o)
		if err != nil {
			return nil, err
		}
		b := &bodyTimestamp{signer: e, path: path, unit: p.TimestampUnit}
		b.tolerance, b.now = clock(p, o)
		return b, nil
	}
}

// formPayload verifies deliveries that a sender may wrap in a form:
// Gitea, Forgejo and Gogs, with the webhook's content type set to form,
// send application/x-www-form-urlencoded payload=<json> but sign the JSON
// itself. For such a body the signature is checked over the payload field
// (exactly one); any other body is checked as is.
type formPayload struct {
	signer
}

func (f formPayload) Verify(body []byte, h http.Header) error {
	signed, err := FormPayload(body, h)
	if err != nil {
		return err
	}
	return f.signer.Verify(signed, h)
}

// FormPayload returns the bytes a form-wrapping sender (Gitea, Forgejo)
// signs: the payload field of an application/x-www-form-urlencoded body, or
// body itself for any other content type. The JSON event ID of such a
// delivery is read from these bytes too.
func FormPayload(body []byte, h http.Header) ([]byte, error) {
	mt, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	if mt != "application/x-www-form-urlencoded" {
		return body, nil
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, fmt.Errorf("form body does not parse: %w", ErrNoMatchingSignature)
	}
	p := form["payload"]
	if len(p) != 1 {
		return nil, fmt.Errorf("form body has %d payload fields, want 1: %w", len(p), ErrNoMatchingSignature)
	}
	return []byte(p[0]), nil
}

// formPayloadCovers is Preset.Covered of the form-wrapping senders: the
// payload field, not the form's encoding of it.
func formPayloadCovers(body []byte, h http.Header) []byte {
	if signed, err := FormPayload(body, h); err == nil {
		return signed
	}
	return body
}

func withFormPayload(p Preset, o Options) (signer, error) {
	s := p.Scheme
	if o.HMAC != (HMACOptions{}) {
		var err error
		if s, err = overrideScheme(p, o.HMAC); err != nil {
			return nil, err
		}
	}
	e, err := newEngine(p, s, o)
	if err != nil {
		return nil, err
	}
	return formPayload{signer: e}, nil
}
