package caddymodule

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
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

// cutAnswer is an upstream that answers status with a JSON body and is cut
// after partial (maybe nothing) of it, as reverse_proxy leaves such an
// answer: it returns the copy's error, or panics with http.ErrAbortHandler
// (Caddy's finalizeResponse), e.g. when the upstream closes before the
// Content-Length it announced.
func cutAnswer(status int, partial string, panics bool) func(http.ResponseWriter, *http.Request, int) error {
	return func(w http.ResponseWriter, _ *http.Request, _ int) error {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/o_1")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, partial)
		if panics {
			panic(http.ErrAbortHandler)
		}
		return caddyhttp.Error(http.StatusBadGateway, io.ErrUnexpectedEOF)
	}
}

// serveCut serves a request whose forward may end in the next handler's
// panic, which ServeHTTP raises again (net/http would then close the
// connection); it returns what was written before.
func (g *gateway) serveCut(req *http.Request) answer {
	g.t.Helper()
	rec := &writeTracker{ResponseRecorder: httptest.NewRecorder()}
	func() {
		defer func() {
			if p := recover(); p != nil && p != http.ErrAbortHandler { //nolint:errorlint // the sentinel value itself is raised
				panic(p)
			}
		}()
		_ = g.h.ServeHTTP(rec, req, g.up)
	}()
	return answer{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
}

// cutCases are the ways a 2xx answer's body is cut.
var cutCases = []struct {
	name    string
	partial string
	panics  bool
}{
	{"cut mid-body, error returned", `{"order":"o_1","amou`, false},
	{"cut mid-body, ErrAbortHandler", `{"order":"o_1","amou`, true},
	{"no byte of the announced body", "", true},
}

// adminView is the admin API's JSON of an event.
func adminView(t *testing.T, ev store.Event) string {
	t.Helper()
	b, err := json.Marshal(toJSON(ev))
	require.NoError(t, err)
	return string(b)
}

// TestReplayCutBodyHeadersOnly: a 2xx whose body was cut (the upstream's
// connection failed mid-body) completes the event, but only its status and
// headers are stored: a partial body is never replayed, nor measured. A
// duplicate gets the status and headers, an empty body and
// Idempotent-Replay-Incomplete: cut; the admin API says the body was cut.
func TestReplayCutBodyHeadersOnly(t *testing.T) {
	t.Parallel()
	const secret = "whsec_cut"
	for _, tc := range cutCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := newGateway(t, "webhook_idempotency {\n\tprovider stripe\n\tsecret "+secret+"\n\treplay response\n\tcache 0\n}")
			g.up.respond = cutAnswer(http.StatusOK, tc.partial, tc.panics)
			req := func() *http.Request {
				return stripeDelivery(t, "http://gateway.test/hook", secret, "evt_cut", time.Now())
			}
			first := g.serveCut(req())
			require.Equal(t, http.StatusOK, first.status)

			ev := g.requireRow("stripe", "evt_cut", store.StateCompleted)
			view := adminView(t, ev)
			require.Contains(t, view, `"response":{"body_stored":false,"body_not_stored":"cut"}`, "no size or hash of a body not seen whole")
			lines := g.logged("stored status and headers only")
			require.Len(t, lines, 1)
			require.Equal(t, "the body was cut before its end", lines[0].ContextMap()["reason"])
			require.EqualValues(t, len(tc.partial), lines[0].ContextMap()["bytes_before_cut"])

			g.up.respond = nil
			dup := g.serve(req())
			require.Equal(t, http.StatusOK, dup.status)
			require.Equal(t, "true", dup.header.Get("Idempotent-Replayed"))
			require.Equal(t, "cut", dup.header.Get("Idempotent-Replay-Incomplete"))
			require.Equal(t, "application/json", dup.header.Get("Content-Type"))
			require.Empty(t, dup.body)
			require.Equal(t, 1, g.up.count())
		})
	}
}

// TestIdempotencyKeyIncompleteAnswer: a client API's answer that was not
// stored whole (cut mid-body, or over replay_max) completes the key, since
// the upstream did the work, but is never replayed as the client's
// answer: retries with the key get 502 with a problem that names the
// upstream's status, Idempotent-Replayed: true and
// Idempotent-Replay-Incomplete, and are not forwarded again.
func TestIdempotencyKeyIncompleteAnswer(t *testing.T) {
	t.Parallel()
	requireIncomplete := func(t *testing.T, a answer, why string) {
		t.Helper()
		require.Equal(t, http.StatusBadGateway, a.status, "body %s", a.body)
		require.Equal(t, "application/problem+json", a.header.Get("Content-Type"))
		require.Equal(t, "true", a.header.Get("Idempotent-Replayed"))
		require.Equal(t, why, a.header.Get("Idempotent-Replay-Incomplete"))
		require.Empty(t, a.header.Get("Location"), "no header of the stored answer")
		var p struct {
			Type           string `json:"type"`
			Title          string `json:"title"`
			Status         int    `json:"status"`
			Detail         string `json:"detail"`
			UpstreamStatus int    `json:"upstream_status"`
		}
		require.NoError(t, json.Unmarshal(a.body, &p))
		require.Equal(t, problemType, p.Type)
		require.Equal(t, "Stored answer is incomplete", p.Title)
		require.Equal(t, http.StatusBadGateway, p.Status)
		require.Equal(t, http.StatusCreated, p.UpstreamStatus)
		require.Contains(t, p.Detail, "do not retry it with a new key")
		require.NotContains(t, string(a.body), "o_1", "nothing of the answer itself")
	}

	for _, tc := range cutCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := newGateway(t, "webhook_idempotency {\n\tprovider idempotency_key\n}")
			g.up.respond = cutAnswer(http.StatusCreated, tc.partial, tc.panics)
			first := g.serveCut(apiCall("k-cut", `{"amount":100}`))
			require.Equal(t, http.StatusCreated, first.status, "the client saw the status, then the cut")

			g.up.respond = nil // a forward again would answer 200 "ok"
			for range 2 {
				requireIncomplete(t, g.serve(apiCall("k-cut", `{"amount":100}`)), "cut")
			}
			require.Equal(t, 1, g.up.count())
			ev := g.requireRow("idempotency_key", callerKey("k-cut"), store.StateCompleted)
			require.Equal(t, http.StatusCreated, ev.Status)
			require.Contains(t, adminView(t, ev), `"response":{"body_stored":false,"body_not_stored":"cut"}`)
			lines := g.logged("stored status and headers only, without the body; retries with the key get 502")
			require.Len(t, lines, 1)
			require.Equal(t, "the body was cut before its end", lines[0].ContextMap()["reason"])
			log := g.deliveryLog()
			require.Equal(t, outcomeDuplicate, log[len(log)-1]["outcome"])
			require.Equal(t, "the stored answer is incomplete: cut", log[len(log)-1]["reason"])

			// The key's fingerprint is still checked first. A caller reusing
			// its key at will is refused each time and warned of once a
			// second.
			start := time.Now()
			for i := range 20 {
				require.Equal(t, http.StatusUnprocessableEntity, g.serve(apiCall("k-cut", fmt.Sprintf(`{"amount":%d}`, 200+i))).status)
			}
			require.LessOrEqual(t, len(g.logged("idempotency key reused with another request fingerprint")), 2+int(time.Since(start)/time.Second))
		})
	}

	t.Run("larger than replay_max", func(t *testing.T) {
		t.Parallel()
		g := newGateway(t, "webhook_idempotency {\n\tprovider idempotency_key\n\treplay_max 1KiB\n}")
		big := `{"order":"o_1","pad":"` + strings.Repeat("x", 2000) + `"}`
		g.up.respond = answerWith(http.StatusCreated, "application/json", big)
		first := g.serve(apiCall("k-big", `{}`))
		require.Equal(t, http.StatusCreated, first.status)
		require.Equal(t, big, string(first.body), "the first answer is streamed whole")
		requireIncomplete(t, g.serve(apiCall("k-big", `{}`)), "too-large")
		require.Equal(t, 1, g.up.count())
		ev := g.requireRow("idempotency_key", callerKey("k-big"), store.StateCompleted)
		sum := sha256.Sum256([]byte(big))
		require.Contains(t, adminView(t, ev), `"response":{"body_stored":false,"body_not_stored":"too_large","size":`+
			strconv.Itoa(len(big))+`,"sha256":"`+hex.EncodeToString(sum[:])+`"}`)
	})
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

// testCaller is the Authorization apiCall sends unless headers give one.
const testCaller = "Bearer tok_test"

func apiCall(key, body string, headers ...string) *http.Request {
	hs := []string{"Content-Type", "application/json"}
	if key != "" {
		hs = append(hs, "Idempotency-Key", key)
	}
	if !slices.Contains(headers, "Authorization") {
		hs = append(hs, "Authorization", testCaller)
	}
	return newDelivery("http://api.test/v1/orders", []byte(body), append(hs, headers...)...)
}

// callerKey is the stored event ID of testCaller's key.
func callerKey(key string) string {
	sum := sha256.Sum256([]byte(testCaller))
	return hex.EncodeToString(sum[:16]) + ":" + key
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

	t.Run("store_5xx", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			cfg          string
			status, runs int
		}{
			{"", http.StatusInternalServerError, 2},             // default: a 5xx releases the key
			{"store_5xx on", http.StatusInternalServerError, 1}, // stored and replayed, as Stripe does
			{"store_5xx on", http.StatusServiceUnavailable, 2},  // 503 asks for a retry: never stored
		} {
			g := newGateway(t, "webhook_idempotency {\n\tprovider idempotency_key\n\tidempotency_key {\n\t\t"+tc.cfg+"\n\t}\n}")
			g.up.respond = answerWith(tc.status, "application/json", `{"error":"boom"}`)
			for range 2 {
				require.Equal(t, tc.status, g.serve(apiCall("k5", `{}`)).status)
			}
			require.Equal(t, tc.runs, g.up.count(), "%q, %d", tc.cfg, tc.status)
		}
	})

	t.Run("store_4xx off", func(t *testing.T) {
		t.Parallel()
		g := newGateway(t, "webhook_idempotency {\n\tprovider idempotency_key\n\tidempotency_key {\n\t\tstore_4xx off\n\t}\n}")
		g.up.respond = answerWith(http.StatusUnprocessableEntity, "application/json", `{"error":"bad amount"}`)
		for range 2 {
			require.Equal(t, http.StatusUnprocessableEntity, g.serve(apiCall("k", `{}`)).status)
		}
		require.Equal(t, 2, g.up.count())
		g.requireRow("idempotency_key", callerKey("k"), store.StateReleased)
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
	h.provisionIdempotencyKey()
	h.Replay, h.Retention, h.Lease = "response", caddy.Duration(time.Hour), caddy.Duration(time.Second)
	require.ErrorContains(t, h.validateIdempotencyKey(), "exclusive")
	require.True(t, strings.HasPrefix(problemType, "https://"))
}

// TestIdempotencyKeyPerCaller: keys are the caller's by default (its
// Authorization header), as Stripe's and the IETF draft's keys are. The
// attacker's requests of issue 22: caller B sending A's key and body is
// forwarded in B's own key space and never gets A's stored answer; a
// request without an identity is refused 401, never answered with A's
// data; a stranger reusing A's key with another body is forwarded, not
// told 422 that the key is in use. client shared is the explicit opt-in
// to one key space, warned about at load.
func TestIdempotencyKeyPerCaller(t *testing.T) {
	t.Parallel()
	echoCaller := func(w http.ResponseWriter, r *http.Request, n int) error {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, err := fmt.Fprintf(w, `{"order":%d,"auth":%q}`, 30340+n, r.Header.Get("Authorization"))
		return err
	}

	t.Run("default", func(t *testing.T) {
		t.Parallel()
		g := newGateway(t, "webhook_idempotency {\n\tprovider idempotency_key\n}")
		g.up.respond = echoCaller
		a := g.serve(apiCall("k-1", `{"amount":1}`, "Authorization", "Bearer tok_A"))
		require.Equal(t, http.StatusCreated, a.status)
		require.Contains(t, string(a.body), "tok_A")

		b := g.serve(apiCall("k-1", `{"amount":1}`, "Authorization", "Bearer tok_B"))
		require.Equal(t, http.StatusCreated, b.status)
		require.Empty(t, b.header.Get("Idempotent-Replayed"), "B's own key space: forwarded")
		require.NotContains(t, string(b.body), "tok_A", "never A's data")

		anon := newDelivery("http://api.test/v1/orders", []byte(`{"amount":1}`), "Content-Type", "application/json", "Idempotency-Key", "k-1")
		n := g.serve(anon)
		require.Equal(t, http.StatusUnauthorized, n.status)
		require.Equal(t, "application/problem+json", n.header.Get("Content-Type"))
		require.Contains(t, string(n.body), "Client identity is missing")
		require.NotContains(t, string(n.body), "tok_A")

		c := g.serve(apiCall("k-1", `{"amount":999}`, "Authorization", "Bearer tok_C"))
		require.Equal(t, http.StatusCreated, c.status, "a stranger is not told the key is in use: %s", c.body)
		require.Equal(t, 3, g.up.count(), "A, B and C each ran once; the anonymous request never")

		again := g.serve(apiCall("k-1", `{"amount":1}`, "Authorization", "Bearer tok_A"))
		require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		require.Contains(t, string(again.body), "tok_A", "A's retry gets A's answer")
		require.Equal(t, 3, g.up.count())
	})

	t.Run("client shared", func(t *testing.T) {
		t.Parallel()
		g := newGateway(t, "webhook_idempotency {\n\tprovider idempotency_key\n\tidempotency_key {\n\t\tclient shared\n\t}\n}")
		g.up.respond = echoCaller
		logs, err := validateCaddyfile(t, ":18082 {\n\twebhook_idempotency {\n\t\tprovider idempotency_key\n\t\tstorage sqlite "+
			filepath.Join(t.TempDir(), "k.db")+"\n\t\tidempotency_key {\n\t\t\tclient shared\n\t\t}\n\t}\n\trespond 201\n}\n")
		require.NoError(t, err)
		require.Contains(t, logs, "every caller shares one key space", "warned at load")
		require.Equal(t, http.StatusCreated, g.serve(apiCall("k-1", `{}`, "Authorization", "Bearer tok_A")).status)
		b := g.serve(apiCall("k-1", `{}`, "Authorization", "Bearer tok_B"))
		require.Equal(t, "true", b.header.Get("Idempotent-Replayed"), "one key space, as written")
		require.Equal(t, 1, g.up.count())
		g.requireRow("idempotency_key", "k-1", store.StateCompleted)
	})

	t.Run("QUERY is safe", func(t *testing.T) {
		t.Parallel()
		g := newGateway(t, "webhook_idempotency {\n\tprovider idempotency_key\n}")
		q := newDelivery("http://api.test/v1/orders", []byte(`{"q":1}`), "Content-Type", "application/json")
		q.Method = "QUERY"
		require.Equal(t, http.StatusOK, g.serve(q).status, "no key needed")
		require.Empty(t, g.rows())
	})
}
