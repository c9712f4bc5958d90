package signature_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// vector is one case of the conformance vectors (testdata/signatures.json,
// README "Tests"): a signed delivery and the verdict of the provider's
// official library (or of the README's "Edge cases" where it is stricter).
type vector struct {
	ID               string              `json:"id"`
	Provider         string              `json:"provider"`
	Kind             string              `json:"kind"`
	Secrets          []string            `json:"secrets"`
	ToleranceSeconds int64               `json:"tolerance_seconds"`
	NowUnix          int64               `json:"now_unix"`
	URL              string              `json:"url"`
	Method           string              `json:"method"`
	Headers          map[string][]string `json:"headers"`
	BodyBase64       string              `json:"body_base64"`
	Expected         string              `json:"expected"`
	Oracle           string              `json:"oracle"`
	EventID          string              `json:"event_id"`
}

// loadVectors reads the shared conformance file when the repository sits
// next to it, else the copy in testdata.
func loadVectors(t testing.TB) []vector {
	t.Helper()
	raw, err := os.ReadFile("../../../shared/conformance/signatures.json")
	if errors.Is(err, os.ErrNotExist) {
		raw, err = os.ReadFile("testdata/signatures.json")
	}
	require.NoError(t, err)
	var f struct {
		Cases []vector `json:"cases"`
	}
	require.NoError(t, json.Unmarshal(raw, &f))
	require.NotEmpty(t, f.Cases)
	return f.Cases
}

// options builds the Options a gateway route would be configured with for
// the vector: provider hmac is the conformance file's X-Webhook-Signature,
// SHA-256, hex.
func (c vector) options() signature.Options {
	o := signature.Options{
		Secrets:   c.Secrets,
		Tolerance: time.Duration(c.ToleranceSeconds) * time.Second,
		Now:       func() time.Time { return time.Unix(c.NowUnix, 0) },
	}
	if p, ok := signature.Lookup(c.Provider); ok && p.NeedsURL {
		o.URL = c.URL
	}
	if c.Provider == "hmac" {
		o.HMAC = signature.HMACOptions{Header: "X-Webhook-Signature", Algorithm: "sha256", Encoding: "hex"}
	}
	return o
}

// request rebuilds the delivery as net/http would hand it over: header
// names canonicalised by Header.Add, values in order.
func (c vector) request(t testing.TB) ([]byte, http.Header) {
	t.Helper()
	body, err := base64.StdEncoding.DecodeString(c.BodyBase64)
	require.NoError(t, err)
	req := httptest.NewRequest(c.Method, c.URL, bytes.NewReader(body))
	for name, vals := range c.Headers {
		for _, v := range vals {
			req.Header.Add(name, v)
		}
	}
	return body, req.Header
}

func TestConformance(t *testing.T) {
	t.Parallel()
	cases := loadVectors(t)
	seen := map[string]int{}
	for _, c := range cases {
		seen[c.Provider]++
		t.Run(c.ID, func(t *testing.T) {
			t.Parallel()
			v, err := signature.New(c.Provider, c.options())
			require.NoError(t, err)
			body, h := c.request(t)

			err = v.Verify(body, h)
			if c.Expected == "valid" {
				require.NoError(t, err, "oracle: %s", c.Oracle)
				require.Equal(t, c.EventID, defaultEventID(t, c, body, h), "default event ID")
				return
			}
			require.Error(t, err, "oracle: %s", c.Oracle)
			requireOneSentinel(t, err)
			requireNoLeak(t, err, c.Secrets, h)
		})
	}
	for _, p := range []string{"stripe", "github", "standard", "hmac", "shopify", "slack", "paddle", "square", "svix", "twilio", "razorpay"} {
		require.Positive(t, seen[p], "no conformance vectors for %s", p)
	}
}

// defaultEventID applies the preset's default event-ID sources (hmac: the
// conformance file's "json id") the way the eventid package would: the first
// source that yields a value wins.
func defaultEventID(t *testing.T, c vector, body []byte, h http.Header) string {
	t.Helper()
	p, ok := signature.Lookup(c.Provider)
	require.True(t, ok)
	sources := p.EventID
	if c.Provider == "hmac" {
		sources = []string{"json id"}
	}
	for _, src := range sources {
		kind, name, ok := strings.Cut(src, " ")
		require.True(t, ok, src)
		switch kind {
		case "header":
			if v := h.Get(name); v != "" {
				return v
			}
		case "json":
			if v := jsonPath(body, name); v != "" {
				return v
			}
		default:
			t.Fatalf("unknown event id source %q", src)
		}
	}
	return ""
}

// jsonPath resolves a dotted path of object keys to a string or number.
func jsonPath(body []byte, path string) string {
	var v any
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	if d.Decode(&v) != nil {
		return ""
	}
	for _, key := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		v = m[key]
	}
	switch v := v.(type) {
	case string:
		return v
	case json.Number:
		return v.String()
	}
	return ""
}

var sentinels = []error{
	signature.ErrMissingHeader,
	signature.ErrMalformedHeader,
	signature.ErrNoMatchingSignature,
	signature.ErrTimestampOutOfTolerance,
	signature.ErrBodyNotJSON,
	signature.ErrBodyNotForm,
	signature.ErrKeyUnavailable,
}

// requireOneSentinel checks err wraps exactly one of the package's reasons.
func requireOneSentinel(t testing.TB, err error) {
	t.Helper()
	n := 0
	for _, s := range sentinels {
		if errors.Is(err, s) {
			n++
		}
	}
	require.Equal(t, 1, n, "error %q must wrap exactly one sentinel", err)
}

// requireNoLeak checks the message holds no secret and no signature value.
func requireNoLeak(t testing.TB, err error, secrets []string, h http.Header) {
	t.Helper()
	msg := err.Error()
	for _, s := range secrets {
		require.NotContains(t, msg, s)
	}
	for name, vals := range h {
		if !strings.Contains(strings.ToLower(name), "signature") && !strings.Contains(strings.ToLower(name), "hmac") {
			continue
		}
		for _, v := range vals {
			if len(v) >= 8 {
				require.NotContains(t, msg, v)
			}
		}
	}
}
