package caddymodule

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// withReplacerVars gives req the caddy.Replacer Caddy's server would, with vars.
func withReplacerVars(req *http.Request, vars map[string]any) *http.Request {
	repl := caddy.NewReplacer()
	for k, v := range vars {
		repl.Set(k, v)
	}
	return req.WithContext(context.WithValue(req.Context(), caddy.ReplacerCtxKey, repl))
}

// TestReplayCutBodyHeadersOnly: a 2xx whose body was cut (the upstream's
// connection failed mid-body) completes the event, but only its status and
// headers are stored: a partial body is never replayed.
func TestReplayCutBodyHeadersOnly(t *testing.T) {
	t.Parallel()
	const secret = "whsec_cut"
	g := newGateway(t, "webhook_idempotency {\n\tprovider stripe\n\tsecret "+secret+"\n\treplay response\n\tcache 0\n}")
	g.up.respond = func(w http.ResponseWriter, _ *http.Request, _ int) error {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"partial":`)
		return caddyhttp.Error(http.StatusBadGateway, io.ErrUnexpectedEOF)
	}
	req := func() *http.Request {
		return stripeDelivery(t, "http://gateway.test/hook", secret, "evt_cut", time.Now())
	}
	first := g.serve(req())
	require.Equal(t, http.StatusOK, first.status)

	ev := g.requireRow("stripe", "evt_cut", store.StateCompleted)
	require.True(t, ev.Response.Stored)
	require.False(t, ev.Response.BodyStored)
	require.EqualValues(t, len(`{"partial":`), ev.Response.Size)
	lines := g.logged("stored status and headers only")
	require.Len(t, lines, 1)
	require.Equal(t, "the body was cut before its end", lines[0].ContextMap()["reason"])

	dup := g.serve(req())
	require.Equal(t, http.StatusOK, dup.status)
	require.Equal(t, "true", dup.header.Get("Idempotent-Replayed"))
	require.Equal(t, "application/json", dup.header.Get("Content-Type"))
	require.Empty(t, dup.body)
	require.Equal(t, 1, g.up.count())
}

// TestReplayShortByDefault: a provider that does not read the answer keeps
// the short duplicate answer, and replay short turns a preset's default off.
func TestReplayShortByDefault(t *testing.T) {
	t.Parallel()
	g := newGateway(t, "webhook_idempotency {\n\tprovider stripe\n\tsecret s\n}")
	require.Equal(t, "short", g.h.Replay)
	require.False(t, g.h.replayOn)
	tw := newGateway(t, "webhook_idempotency {\n\tprovider twilio\n\tsecret s\n\turl https://h.example/sms\n\treplay short\n}")
	require.False(t, tw.h.replayOn)
	tw2 := newGateway(t, "webhook_idempotency {\n\tprovider twilio\n\tsecret s\n\turl https://h.example/sms\n}")
	require.True(t, tw2.h.replayOn, "twilio reads the answer")
	require.Equal(t, []string{"Content-Type", "Content-Language", "Location", "Content-Encoding"}, tw2.h.replayHeaders)
}

func apiCall(key, body string, headers ...string) *http.Request {
	hs := []string{"Content-Type", "application/json"}
	if key != "" {
		hs = append(hs, "Idempotency-Key", key)
	}
	return newDelivery("http://api.test/v1/orders", []byte(body), append(hs, headers...)...)
}

func TestIdempotencyKeyRequests(t *testing.T) {
	t.Parallel()

	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		g := newGateway(t, "webhook_idempotency {\n\tprovider idempotency_key\n}")
		require.Equal(t, caddy.Duration(24*time.Hour), g.h.Retention)
		require.Equal(t, "response", g.h.Replay)
		require.Equal(t, fingerprintParts, g.h.idem.parts)
	})

	t.Run("quoted key, several lines, safe methods", func(t *testing.T) {
		t.Parallel()
		g := newGateway(t, "webhook_idempotency {\n\tprovider idempotency_key\n}")
		require.Equal(t, http.StatusOK, g.serve(apiCall(`"k-1"`, `{}`)).status)
		dup := g.serve(apiCall(`k-1`, `{}`))
		require.Equal(t, "true", dup.header.Get("Idempotent-Replayed"), "a structured-field string is its content")
		require.Equal(t, 1, g.up.count())

		two := g.serve(apiCall("a", `{}`, "Idempotency-Key", "b"))
		require.Equal(t, http.StatusBadRequest, two.status)
		require.Equal(t, "application/problem+json", two.header.Get("Content-Type"))
		require.Contains(t, string(two.body), "several lines")
		require.Equal(t, http.StatusBadRequest, g.serve(apiCall(`""`, `{}`)).status)

		get := newDelivery("http://api.test/v1/orders", nil)
		get.Method = http.MethodGet
		require.Equal(t, http.StatusOK, g.serve(get).status, "GET needs no key")
		require.Equal(t, 2, g.up.count())
		require.Len(t, g.rows(), 1)
	})

	t.Run("optional", func(t *testing.T) {
		t.Parallel()
		g := newGateway(t, "webhook_idempotency {\n\tprovider idempotency_key\n\tidempotency_key {\n\t\toptional\n\t}\n}")
		for range 2 {
			require.Equal(t, http.StatusOK, g.serve(apiCall("", `{}`)).status)
		}
		require.Equal(t, 2, g.up.count())
		require.Empty(t, g.rows())
	})

	t.Run("client identity hashed", func(t *testing.T) {
		t.Parallel()
		g := newGateway(t, "webhook_idempotency {\n\tprovider idempotency_key\n\tidempotency_key {\n\t\tclient {http.auth.user.id}\n\t}\n}")
		for _, user := range []string{"alice", "bob"} {
			req := withReplacerVars(apiCall("same", `{}`), map[string]any{"http.auth.user.id": user})
			a := g.serve(req)
			require.Equal(t, http.StatusOK, a.status)
			require.Empty(t, a.header.Get("Idempotent-Replayed"))
		}
		require.Equal(t, 2, g.up.count())
		sum := sha256.Sum256([]byte("alice"))
		g.requireRow("idempotency_key", hex.EncodeToString(sum[:16])+":same", store.StateCompleted)
		for _, ev := range g.rows() {
			require.NotContains(t, ev.EventID, "alice")
		}

		h := newGateway(t, "webhook_idempotency {\n\tprovider idempotency_key\n\tidempotency_key {\n\t\tclient header Authorization\n\t}\n}")
		require.Equal(t, http.StatusOK, h.serve(apiCall("k", `{}`, "Authorization", "Bearer sk_live_abc")).status)
		for _, ev := range h.rows() {
			require.NotContains(t, ev.EventID, "sk_live_abc", "never stored raw")
		}
		for _, e := range h.logs.All() {
			for _, v := range e.ContextMap() {
				require.NotContains(t, fmt.Sprint(v), "sk_live_abc", "never logged")
			}
		}
	})

	t.Run("fingerprint none and partial", func(t *testing.T) {
		t.Parallel()
		g := newGateway(t, "webhook_idempotency {\n\tprovider idempotency_key\n\tidempotency_key {\n\t\tfingerprint none\n\t}\n}")
		require.Equal(t, http.StatusOK, g.serve(apiCall("k", `{"a":1}`)).status)
		require.Equal(t, "true", g.serve(apiCall("k", `{"a":2}`)).header.Get("Idempotent-Replayed"))

		p := newGateway(t, "webhook_idempotency {\n\tprovider idempotency_key\n\tscope fp_partial_"+randomHex(4)+"\n\tidempotency_key {\n\t\tfingerprint method path\n\t}\n}")
		require.Equal(t, http.StatusOK, p.serve(apiCall("k", `{"a":1}`)).status)
		require.Equal(t, "true", p.serve(apiCall("k", `{"a":2}`)).header.Get("Idempotent-Replayed"), "the body is not covered")
		other := apiCall("k", `{"a":1}`)
		other.Method = http.MethodPatch
		require.Equal(t, http.StatusUnprocessableEntity, p.serve(other).status)
		require.Equal(t, 1.0, p.outcomes(outcomeKeyReused))
		require.Len(t, p.logged("idempotency key reused"), 1)
	})

	t.Run("store_4xx off", func(t *testing.T) {
		t.Parallel()
		g := newGateway(t, "webhook_idempotency {\n\tprovider idempotency_key\n\tidempotency_key {\n\t\tstore_4xx off\n\t}\n}")
		g.up.respond = answerWith(http.StatusUnprocessableEntity, "application/json", `{"error":"bad amount"}`)
		for range 2 {
			require.Equal(t, http.StatusUnprocessableEntity, g.serve(apiCall("k", `{}`)).status)
		}
		require.Equal(t, 2, g.up.count())
		g.requireRow("idempotency_key", "k", store.StateReleased)
	})
}

func TestReplayConfigRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, cfg, want string }{
		{"secret with idempotency_key", "provider idempotency_key\n\tsecret s", "verifies no signature"},
		{"async idempotency_key", "provider idempotency_key\n\tmode async\n\tdeliver_to http://127.0.0.1:1", "async"},
		{"replay short with idempotency_key", "provider idempotency_key\n\treplay short", "replay is always response"},
		{"client_header alone", "provider idempotency_key\n\tidempotency_key {\n\t\tclient header Authorization\n\t}", ""},
		{"retention under lease", "provider idempotency_key\n\tlease 30s\n\tretention 10s", "at least the lease"},
		{"replay bogus", "provider stripe\n\tsecret s\n\treplay always", "want short or response"},
		{"replay_headers Content-Length", "provider stripe\n\tsecret s\n\treplay response\n\treplay_headers Content-Length", "cannot be replayed"},
		{"replay_max too large", "provider stripe\n\tsecret s\n\treplay_max 1GB", "replay_max"},
		{"fingerprint bogus", "provider idempotency_key\n\tidempotency_key {\n\t\tfingerprint headers\n\t}", "fingerprint"},
		{"client not a placeholder", "provider idempotency_key\n\tidempotency_key {\n\t\tclient alice\n\t}", "placeholder"},
		{"idempotency_key unknown", "provider idempotency_key\n\tidempotency_key {\n\t\tscope x\n\t}", "unknown subdirective"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := provisionErr(t, "webhook_idempotency {\n\t"+tc.cfg+"\n}")
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
	// client and client_header together (JSON only: the Caddyfile has one
	// client line).
	h := &Handler{Provider: providerIdempotencyKey}
	h.IdempotencyKey = &IdempotencyKeyConfig{Client: "{http.auth.user.id}", ClientHeader: "Authorization"}
	require.NoError(t, h.provisionIdempotencyKey(nil))
	h.Replay, h.Retention, h.Lease = "response", caddy.Duration(time.Hour), caddy.Duration(time.Second)
	require.ErrorContains(t, h.validateIdempotencyKey(), "exclusive")
	require.True(t, strings.HasPrefix(problemType, "https://"))
}
