package caddymodule

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha1" //nolint:gosec // Twilio signs with HMAC-SHA1
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/stretchr/testify/require"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// These tests drive a real in-process Caddy (caddytest) with replay
// response and provider idempotency_key, on the real PostgreSQL and on
// SQLite. No t.Parallel: Caddy's config and ports are global.

const twiml = `<?xml version="1.0" encoding="UTF-8"?>` + "\n" +
	`<Response><Message>Thanks, your order #1042 is confirmed. Reply STOP to opt out.</Message></Response>` + "\n"

// answeringUpstream answers as the request's X-Answer header says and
// counts requests by X-Test-Event.
type answeringUpstream struct {
	*httptest.Server
	mu    sync.Mutex
	calls map[string]int
}

// bigBody is the 200 KiB answer of X-Answer: big; its text must never
// reach a log line.
var bigBody = bytes.Repeat([]byte("BIGANSWER-"), 200<<10/10)

func newAnsweringUpstream(t *testing.T) *answeringUpstream {
	u := &answeringUpstream{calls: map[string]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		id := r.Header.Get("X-Test-Event")
		u.mu.Lock()
		u.calls[id]++
		n := u.calls[id]
		u.mu.Unlock()
		if ms, _ := strconv.Atoi(r.Header.Get("X-Delay-Ms")); ms > 0 {
			time.Sleep(time.Duration(ms) * time.Millisecond)
		}
		switch r.Header.Get("X-Answer") {
		case "twiml":
			w.Header().Set("Content-Type", "text/xml; charset=utf-8")
			w.Header().Set("Content-Language", "en-US")
			w.Header().Set("X-Internal-Trace", "not-replayed")
			_, _ = io.WriteString(w, twiml)
		case "big":
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = w.Write(bigBody)
		case "cut": // 201 announcing more body than it sends, then closed
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				panic(err)
			}
			_, _ = buf.WriteString("HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n" +
				`{"order":"` + id + `","amou`)
			_ = buf.Flush()
			_ = conn.Close()
		default: // a client API: the status asked for, a body naming the call
			status, _ := strconv.Atoi(r.Header.Get("X-Status"))
			if status == 0 {
				status = http.StatusCreated
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Location", fmt.Sprintf("/orders/%s-%d", id, n))
			w.WriteHeader(status)
			_, _ = fmt.Fprintf(w, `{"order":%q,"call":%d,"status":%d}`, id, n, status)
		}
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *answeringUpstream) count(id string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[id]
}

// startRoutes loads a Caddy config with one route per store, /postgres/*
// and /sqlite/*, each with the directive lines of body(backend) and a
// storage of its own, in front of up. Caddy's log goes to the returned
// file, as JSON, from DEBUG.
func startRoutes(t *testing.T, up *answeringUpstream, body func(backend string) string) (routes map[string]string, logPath string) {
	if testing.Short() {
		t.Skip("in-process Caddy: skipped with -short")
	}
	dsn := pgDSN(t)
	table := "rp_" + randomHex(6)
	t.Cleanup(func() { dropTable(dsn, table) })
	dir := t.TempDir()
	logPath = filepath.Join(dir, "caddy.log")
	tester := caddytest.NewTester(t)
	tester.InitServer(fmt.Sprintf(`{
`+caddyTestGlobals+`	log {
		output file %[1]q
		format json
		level DEBUG
	}
}
http://localhost:9080 {
	handle /postgres/* {
		webhook_idempotency {
			%[2]s
			storage postgres %[3]q
			table %[4]s
		}
		reverse_proxy %[7]s
	}
	handle /sqlite/* {
		webhook_idempotency {
			%[5]s
			storage sqlite %[6]q
		}
		reverse_proxy %[7]s
	}
}`, logPath, body("postgres"), dsn, table, body("sqlite"), filepath.Join(dir, "events.db"), up.Listener.Addr().String()), "caddyfile")
	require.False(t, t.Failed(), "caddy config did not load")
	return map[string]string{"postgres": gatewayBase + "/postgres", "sqlite": gatewayBase + "/sqlite"}, logPath
}

// full is an answer with its headers.
type full struct {
	status int
	header http.Header
	body   []byte
}

func (f full) replayed() bool { return f.header.Get("Idempotent-Replayed") == "true" }

func do(t *testing.T, req *http.Request) full {
	t.Helper()
	f, err := tryDo(req)
	require.NoError(t, err)
	return f
}

func tryDo(req *http.Request) (full, error) {
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		return full{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return full{resp.StatusCode, resp.Header, b}, err
}

// twilioDelivery is an incoming-SMS webhook signed as Twilio signs it:
// base64 HMAC-SHA1 of the URL, then the form parameters sorted by name.
func twilioDelivery(t *testing.T, url, secret, token string) *http.Request {
	t.Helper()
	body := "Body=Order+1042&From=%2B15550001111&MessageSid=SM" + token
	mac := hmac.New(sha1.New, []byte(secret))
	_, _ = io.WriteString(mac, url+"BodyOrder 1042From+15550001111MessageSidSM"+token)
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Twilio-Signature", base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	req.Header.Set("I-Twilio-Idempotency-Token", token)
	req.Header.Set("X-Test-Event", token)
	req.Header.Set("X-Answer", "twiml")
	return req
}

// adminEvent reads an event through the admin API.
// adminEvent reads an event through the admin API once it has settled:
// a completion is written just after its answer, so a read right after a
// delivery may still find the claim processing (at most 5 s).
func adminEvent(t *testing.T, scope, id string) (EventJSON, string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get("http://localhost:2999/webhook_idempotency/events/" + scope + "/" + id)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
		var ev EventJSON
		require.NoError(t, json.Unmarshal(b, &ev))
		if ev.State != string(store.StateProcessing) || time.Now().After(deadline) {
			return ev, string(b)
		}
	}
}

func sizePtr(n int) *int64 {
	s := int64(n)
	return &s
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestReplayTwiML: Twilio reads the answer (the reply SMS is the TwiML
// body), so its preset defaults to replay response: a retried delivery gets
// the first answer byte-for-byte with its content type, from the cache and
// from each store.
func TestReplayTwiML(t *testing.T) {
	const secret = "tw_replay_secret"
	up := newAnsweringUpstream(t)
	for _, cacheLine := range []string{"", "cache 0"} {
		routes, logPath := startRoutes(t, up, func(backend string) string {
			return `provider twilio
			scope twilio_` + backend + ` # routes on two storages need two scopes
			secret ` + secret + `
			url "http://localhost:9080/` + backend + `/sms"
			` + cacheLine
		})
		for _, backend := range []string{"postgres", "sqlite"} {
			t.Run(backend+"/"+cacheLine, func(t *testing.T) {
				url := routes[backend] + "/sms"
				token := "idem" + randomHex(8)
				first := do(t, twilioDelivery(t, url, secret, token))
				require.Equal(t, http.StatusOK, first.status)
				require.Equal(t, twiml, string(first.body))
				require.False(t, first.replayed())

				for range 3 {
					dup := do(t, twilioDelivery(t, url, secret, token))
					require.Equal(t, http.StatusOK, dup.status)
					require.True(t, dup.replayed(), "Idempotent-Replayed: true")
					require.Equal(t, []byte(twiml), dup.body, "byte-for-byte")
					require.Equal(t, "text/xml; charset=utf-8", dup.header.Get("Content-Type"))
					require.Equal(t, "en-US", dup.header.Get("Content-Language"))
					require.Empty(t, dup.header.Get("X-Internal-Trace"), "not allow-listed")
					require.Equal(t, strconv.Itoa(len(twiml)), dup.header.Get("Content-Length"))
				}
				require.Equal(t, 1, up.count(token))

				// The admin API shows the size and hash, not the content.
				ev, raw := adminEvent(t, "twilio_"+backend, token)
				require.Equal(t, "completed", ev.State)
				require.NotNil(t, ev.Response)
				require.Equal(t, ResponseJSON{BodyStored: true, Size: sizePtr(len(twiml)), SHA256: sha256Hex([]byte(twiml))}, *ev.Response)
				require.NotContains(t, raw, "Thanks")
			})
		}
		logs, err := os.ReadFile(logPath)
		require.NoError(t, err)
		require.NotContains(t, string(logs), "Thanks, your order", "a stored body never reaches the log")
	}
}

// TestReplayLargeAnswerHeadersOnly: an answer over replay_max is stored as
// status and headers only, said in the log (without the body) and the
// admin API; duplicates get the status and headers with an empty body.
func TestReplayLargeAnswerHeadersOnly(t *testing.T) {
	const secret = "whsec_replay_big"
	up := newAnsweringUpstream(t)
	routes, logPath := startRoutes(t, up, func(backend string) string {
		return "provider stripe\n\t\t\tscope stripe_" + backend + "\n\t\t\tsecret " + secret + "\n\t\t\treplay response"
	})
	for _, backend := range []string{"postgres", "sqlite"} {
		t.Run(backend, func(t *testing.T) {
			id := "evt_" + randomHex(8)
			req := func() *http.Request {
				r := stripeDelivery(t, routes[backend]+"/hook", secret, id, time.Now())
				r.Header.Set("X-Answer", "big")
				return r
			}
			first := do(t, req())
			require.Equal(t, http.StatusOK, first.status)
			require.Equal(t, bigBody, first.body, "the client still gets the whole answer")

			dup := do(t, req())
			require.Equal(t, http.StatusOK, dup.status)
			require.True(t, dup.replayed())
			require.Equal(t, "application/octet-stream", dup.header.Get("Content-Type"))
			require.Equal(t, "too-large", dup.header.Get("Idempotent-Replay-Incomplete"))
			require.Empty(t, dup.body)
			require.Equal(t, 1, up.count(id))

			ev, raw := adminEvent(t, "stripe_"+backend, id)
			require.NotNil(t, ev.Response)
			require.Equal(t, ResponseJSON{BodyStored: false, BodyNotStored: "too_large", Size: sizePtr(len(bigBody)), SHA256: sha256Hex(bigBody)}, *ev.Response)
			require.NotContains(t, raw, "BIGANSWER")

			var line map[string]any
			for _, l := range strings.Split(readFile(t, logPath), "\n") {
				if strings.Contains(l, "stored status and headers only") && strings.Contains(l, id) {
					require.NoError(t, json.Unmarshal([]byte(l), &line))
				}
			}
			require.NotNil(t, line, "a log line says the body was not stored")
			require.EqualValues(t, len(bigBody), line["body_size"])
			require.EqualValues(t, defaultReplayMax, line["replay_max"])
			require.Equal(t, "the body is larger than replay_max", line["reason"])
		})
	}
	require.NotContains(t, readFile(t, logPath), "BIGANSWER", "bodies never reach the log")
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// apiRequest is a client API call with an Idempotency-Key.
func apiRequest(t *testing.T, url, key, client, body string, headers ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if client != "" {
		req.Header.Set("Authorization", "Bearer "+client)
	}
	req.Header.Set("X-Test-Event", key+"|"+client)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return req
}

// idemStoredID is the stored event ID of key for the client whose
// Authorization is "Bearer <client>" (client header Authorization).
func idemStoredID(key, client string) string {
	sum := sha256.Sum256([]byte("Bearer " + client))
	return hex.EncodeToString(sum[:16]) + ":" + key
}

// requireProblem asserts an RFC 9457 problem answer.
func requireProblem(t *testing.T, f full, status int, title string) {
	t.Helper()
	require.Equal(t, status, f.status, "body %s", f.body)
	require.Equal(t, "application/problem+json", f.header.Get("Content-Type"))
	var p struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
	}
	require.NoError(t, json.Unmarshal(f.body, &p))
	require.Equal(t, status, p.Status)
	require.Equal(t, title, p.Title)
	require.Equal(t, problemType, p.Type)
	require.False(t, f.replayed())
}

// TestIdempotencyKeyMode is the Idempotency-Key table, on both stores.
func TestIdempotencyKeyMode(t *testing.T) {
	up := newAnsweringUpstream(t)
	routes, logPath := startRoutes(t, up, func(backend string) string {
		return `provider idempotency_key
			scope api_` + backend + `
			idempotency_key {
				client header Authorization
			}
			lease 1s
			retention 3s`
	})
	for _, backend := range []string{"postgres", "sqlite"} {
		url := routes[backend] + "/v1/orders"
		key := func() string { return "key-" + randomHex(8) }

		t.Run(backend+"/first, then the completed duplicate replayed", func(t *testing.T) {
			k := key()
			first := do(t, apiRequest(t, url, k, "alice", `{"amount":100}`))
			require.Equal(t, http.StatusCreated, first.status)
			require.False(t, first.replayed())
			for range 2 {
				dup := do(t, apiRequest(t, url, k, "alice", `{"amount":100}`))
				require.Equal(t, http.StatusCreated, dup.status)
				require.True(t, dup.replayed())
				require.Equal(t, first.body, dup.body)
				require.Equal(t, first.header.Get("Location"), dup.header.Get("Location"))
				require.Equal(t, "application/json", dup.header.Get("Content-Type"))
			}
			require.Equal(t, 1, up.count(k+"|alice"))
		})

		t.Run(backend+"/concurrent duplicate 409", func(t *testing.T) {
			k := key()
			req := apiRequest(t, url, k, "alice", `{"amount":7}`, "X-Delay-Ms", "1500")
			done := make(chan full, 1)
			errc := make(chan error, 1)
			go func() { // no assertions off the test's goroutine
				f, err := tryDo(req)
				done <- f
				errc <- err
			}()
			require.Eventually(t, func() bool { return up.count(k+"|alice") == 1 }, 5*time.Second, 10*time.Millisecond)
			conflict := do(t, apiRequest(t, url, k, "alice", `{"amount":7}`))
			requireProblem(t, conflict, http.StatusConflict, "A request is outstanding for this Idempotency-Key")
			require.NotEmpty(t, conflict.header.Get("Retry-After"))
			first := <-done
			require.NoError(t, <-errc)
			require.Equal(t, http.StatusCreated, first.status)
			dup := do(t, apiRequest(t, url, k, "alice", `{"amount":7}`))
			require.True(t, dup.replayed())
			require.Equal(t, first.body, dup.body)
			require.Equal(t, 1, up.count(k+"|alice"))
		})

		t.Run(backend+"/different payload 422", func(t *testing.T) {
			k := key()
			require.Equal(t, http.StatusCreated, do(t, apiRequest(t, url, k, "alice", `{"amount":1}`)).status)
			requireProblem(t, do(t, apiRequest(t, url, k, "alice", `{"amount":2}`)), http.StatusUnprocessableEntity, "Idempotency-Key is already used")
			// Another path or query is another request too.
			requireProblem(t, do(t, apiRequest(t, url+"?dry_run=1", k, "alice", `{"amount":1}`)), http.StatusUnprocessableEntity, "Idempotency-Key is already used")
			require.Equal(t, 1, up.count(k+"|alice"))
		})

		t.Run(backend+"/missing key 400", func(t *testing.T) {
			requireProblem(t, do(t, apiRequest(t, url, "", "alice", `{}`)), http.StatusBadRequest, "Idempotency-Key is missing")
			requireProblem(t, do(t, apiRequest(t, url, strings.Repeat("k", 256), "alice", `{}`)), http.StatusBadRequest, "Idempotency-Key is malformed")
			require.Equal(t, 0, up.count("|alice"))
		})

		t.Run(backend+"/two clients with the same key both run", func(t *testing.T) {
			k := key()
			a := do(t, apiRequest(t, url, k, "alice", `{"amount":5}`))
			b := do(t, apiRequest(t, url, k, "bob", `{"amount":5}`))
			require.Equal(t, http.StatusCreated, a.status)
			require.Equal(t, http.StatusCreated, b.status)
			require.False(t, b.replayed())
			require.Equal(t, 1, up.count(k+"|alice"))
			require.Equal(t, 1, up.count(k+"|bob"))
		})

		t.Run(backend+"/5xx then retry runs again", func(t *testing.T) {
			k := key()
			r := do(t, apiRequest(t, url, k, "alice", `{"amount":9}`, "X-Status", "503"))
			require.Equal(t, http.StatusServiceUnavailable, r.status)
			r = do(t, apiRequest(t, url, k, "alice", `{"amount":9}`))
			require.Equal(t, http.StatusCreated, r.status)
			require.False(t, r.replayed())
			require.Equal(t, 2, up.count(k+"|alice"))
		})

		t.Run(backend+"/4xx stored and replayed, 429 not", func(t *testing.T) {
			k := key()
			r := do(t, apiRequest(t, url, k, "alice", `{"amount":-1}`, "X-Status", "400"))
			require.Equal(t, http.StatusBadRequest, r.status)
			dup := do(t, apiRequest(t, url, k, "alice", `{"amount":-1}`))
			require.Equal(t, http.StatusBadRequest, dup.status)
			require.True(t, dup.replayed())
			require.Equal(t, r.body, dup.body)
			require.Equal(t, 1, up.count(k+"|alice"))

			k2 := key()
			require.Equal(t, http.StatusTooManyRequests, do(t, apiRequest(t, url, k2, "alice", `{}`, "X-Status", "429")).status)
			require.Equal(t, http.StatusCreated, do(t, apiRequest(t, url, k2, "alice", `{}`)).status)
			require.Equal(t, 2, up.count(k2+"|alice"))
		})

		// The upstream announces 1000 bytes, sends a few and closes: the
		// client's first answer is cut; its retries get 502 saying the
		// stored answer is incomplete (never a 201 with an empty body),
		// and the request is not run again.
		t.Run(backend+"/answer cut mid-body", func(t *testing.T) {
			k := key()
			_, err := tryDo(apiRequest(t, url, k, "alice", `{"amount":4}`, "X-Answer", "cut"))
			require.Error(t, err, "the first answer is cut")
			for range 2 {
				r := do(t, apiRequest(t, url, k, "alice", `{"amount":4}`, "X-Answer", "cut"))
				require.Equal(t, http.StatusBadGateway, r.status, "body %s", r.body)
				require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
				require.True(t, r.replayed())
				require.Equal(t, "cut", r.header.Get("Idempotent-Replay-Incomplete"))
				require.Contains(t, string(r.body), `"upstream_status":201`)
			}
			require.Equal(t, 1, up.count(k+"|alice"))
			ev, raw := adminEvent(t, "api_"+backend, idemStoredID(k, "alice"))
			require.Equal(t, "completed", ev.State)
			require.Equal(t, &ResponseJSON{BodyNotStored: "cut"}, ev.Response, raw)
		})

		t.Run(backend+"/key expired after retention runs again", func(t *testing.T) {
			k := key()
			require.Equal(t, http.StatusCreated, do(t, apiRequest(t, url, k, "alice", `{"amount":3}`)).status)
			require.True(t, do(t, apiRequest(t, url, k, "alice", `{"amount":3}`)).replayed())
			// retention 3s, swept every 750ms; the cached answer lives at
			// most the retention too.
			require.Eventually(t, func() bool {
				r, err := tryDo(apiRequest(t, url, k, "alice", `{"amount":3}`))
				return err == nil && r.status == http.StatusCreated && !r.replayed()
			}, 10*time.Second, 250*time.Millisecond)
			require.Equal(t, 2, up.count(k+"|alice"))
		})
	}
	logs := readFile(t, logPath)
	require.NotContains(t, logs, "Bearer alice", "client identities are hashed, never logged")
	require.NotContains(t, logs, `"order":`, "stored bodies never reach the log")
}

// requireReplayedAnswer asserts the upstream's default answer (see
// requireRelayed) replayed to a duplicate (replay response).
func requireReplayedAnswer(t *testing.T, a answer) {
	t.Helper()
	require.Equal(t, http.StatusOK, a.status, "body %s", a.body)
	require.Equal(t, "ok", string(a.body))
	require.Equal(t, "text/plain", a.header.Get("Content-Type"))
	require.Equal(t, "true", a.header.Get("Idempotent-Replayed"))
}
