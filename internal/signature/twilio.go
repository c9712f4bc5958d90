package signature

import (
	"crypto/hmac"
	"crypto/sha1" //nolint:gosec // Twilio signs with HMAC-SHA1.
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"
)

// Twilio: X-Twilio-Signature: <base64>, HMAC-SHA1 keyed with the auth token
// over the public URL followed by every POST parameter, sorted by name, as
// name+value with no separators (values decoded). The engine cannot express
// the parsing and sorting of the form, so the scheme has its own code here.
//
// JSON bodies are signed differently: Twilio adds bodySHA256=<hex SHA-256 of
// the body> to the URL's query and signs that URL alone. If the configured
// URL already holds bodySHA256 it must match the body; otherwise, for an
// application/json request, it is appended to the configured URL.
//
// As the official helpers do, the URL is tried as configured and with the
// scheme's default port added or removed. Only Options.URL is used, never the
// request's Host or X-Forwarded-* headers.
//
// I-Twilio-Idempotency-Token is not signed and there is no timestamp, hence
// DedupeBody.
func init() {
	register(Preset{
		Name: "twilio",
		Delivery: Delivery{
			Retry:   Retry{Note: "a failed request goes to the fallback URL if one is set; connection retries only with a #rc= connection override", Source: "https://www.twilio.com/docs/errors/11205"},
			Timeout: Timeout{Duration: 15 * time.Second, Note: "10 s to connect (two 5 s attempts) within it", Source: "https://www.twilio.com/docs/errors/11205"},
			Answer:  Answer{Note: "TwiML for voice and messaging webhooks (the answer is read)", Source: "https://www.twilio.com/docs/usage/webhooks/getting-started-twilio-webhooks"},
			MaxBody: MaxBody{Source: Undocumented},
			Refusal: Refusal{Source: Undocumented},
		},
		Doc:             "https://www.twilio.com/docs/usage/webhooks/webhooks-security",
		SignatureHeader: "X-Twilio-Signature: <base64>",
		EventID:         ids(headerID("I-Twilio-Idempotency-Token")),
		DedupeBody:      true,
		NeedsURL:        true,
		ReplayResponse:  true, // the TwiML answer is the reply SMS or call flow
		Oracle:          "twilio",
		IDStability:     StabilityStable, // the same for every retry of one webhook
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Twilio-Signature"}},
			Signed:    "{url} then each form parameter sorted by name as name+value; JSON: {url} with bodySHA256=<hex>",
			Algorithm: "sha1",
			Encoding:  "base64",
		},
		covers: func(body []byte, h http.Header) []byte {
			if isJSONContent(h) { // signed by its SHA-256: the bytes
				return body
			}
			return formCovers(body, h)
		},
		build: func(p Preset, o Options) (signer, error) {
			keys, err := decodeSecrets("raw", o.Secrets)
			if err != nil {
				return nil, err
			}
			return &twilioVerifier{header: p.Headers[0].Signature, keys: keys, url: o.URL}, nil
		},
	})
}

type twilioVerifier struct {
	header string
	keys   [][]byte
	url    string
}

func (v *twilioVerifier) Verify(body []byte, h http.Header) error {
	raw, err := oneValue(h, v.header)
	if err != nil {
		return err
	}
	b64 := codec{name: "base64", decode: base64.StdEncoding.Strict().DecodeString}
	sig, ok := b64.decodeDigest(raw, sha1.Size)
	if !ok {
		return fmt.Errorf("header %s does not hold a base64 digest of %d bytes: %w", v.header, sha1.Size, ErrMalformedHeader)
	}
	msgs, err := v.messages(body, h)
	if err != nil {
		return err
	}
	for _, key := range v.keys {
		for _, msg := range msgs {
			if hmac.Equal(twilioMAC(key, msg), sig) {
				return nil
			}
		}
	}
	return fmt.Errorf("%s: checked against %d secret(s): %w", v.header, len(v.keys), ErrNoMatchingSignature)
}

func (v *twilioVerifier) sign(body []byte, h http.Header, _ time.Time) error {
	msgs, err := v.messages(body, h)
	if err != nil {
		return err
	}
	h.Set(v.header, base64.StdEncoding.EncodeToString(twilioMAC(v.keys[0], msgs[0])))
	return nil
}

// messages returns the candidate signed strings, the configured URL's first.
func (v *twilioVerifier) messages(body []byte, h http.Header) ([]string, error) {
	u, err := url.Parse(v.url)
	if err != nil {
		return nil, fmt.Errorf("configured url does not parse: %w", ErrNoMatchingSignature)
	}
	given := u.Query().Get("bodySHA256")
	if given != "" || isJSONContent(h) {
		sum := sha256.Sum256(body)
		got := hex.EncodeToString(sum[:])
		base := v.url
		if given == "" {
			sep := "?"
			if strings.Contains(base, "?") {
				sep = "&"
			}
			base += sep + "bodySHA256=" + got
		} else if !hmac.Equal([]byte(strings.ToLower(given)), []byte(got)) {
			return nil, fmt.Errorf("bodySHA256 of the configured url does not match the body: %w", ErrNoMatchingSignature)
		}
		return urlVariants(base), nil
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, fmt.Errorf("%w (application/x-www-form-urlencoded), nor is Content-Type JSON", ErrBodyNotForm)
	}
	params := sortedParams(form)
	bases := urlVariants(v.url)
	msgs := make([]string, len(bases))
	for i, base := range bases {
		msgs[i] = base + params
	}
	return msgs, nil
}

// sortedParams concatenates every parameter as name+value, sorted by name
// and, for repeated names, by value. Every value counts: dropping repeated
// ones would let extra values ride on a valid signature.
func sortedParams(form url.Values) string {
	names := make([]string, 0, len(form))
	for name := range form {
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, name := range names {
		vals := append([]string(nil), form[name]...)
		sort.Strings(vals)
		for _, val := range vals {
			b.WriteString(name)
			b.WriteString(val)
		}
	}
	return b.String()
}

// formCovers is Preset.Covered of the schemes that sign a form's parameters
// sorted by name as name+value (twilio, plivo, mandrill): that text, which
// every body one signature verifies shares. A body that is not a form
// fails verification; it is returned as is.
func formCovers(body []byte, _ http.Header) []byte {
	form, err := url.ParseQuery(string(body))
	if err != nil {
		return body
	}
	return []byte("form:" + sortedParams(form))
}

// urlVariants returns raw, then raw with the scheme's default port added
// (when it has no port) or removed (when it has the default one).
func urlVariants(raw string) []string {
	out := []string{raw}
	u, err := url.Parse(raw)
	if err != nil {
		return out
	}
	def := map[string]string{"https": "443", "http": "80"}[u.Scheme]
	switch alt := *u; u.Port() {
	case "":
		alt.Host = u.Host + ":" + def
		out = append(out, alt.String())
	case def:
		alt.Host = strings.TrimSuffix(u.Host, ":"+def)
		out = append(out, alt.String())
	}
	return out
}

func twilioMAC(key []byte, msg string) []byte {
	m := hmac.New(sha1.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

// isJSONContent reports an application/json (or +json) request body.
func isJSONContent(h http.Header) bool {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}
