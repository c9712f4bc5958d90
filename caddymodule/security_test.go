package caddymodule

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// TestSecurity_NoSecretsSignaturesOrBodiesInLogs drives valid, duplicate,
// forged, tampered, oversized, undecodable, ID-less, failing, timed-out and
// store-failing deliveries through several providers with real secrets,
// and checks that no secret, signature, DSN password or body byte appears
// in any field of any log entry, nor in any answer the gateway wrote itself.
func TestSecurity_NoSecretsSignaturesOrBodiesInLogs(t *testing.T) {
	t.Parallel()
	canary := "CANARY-" + randomHex(8)
	stripeSecret := "whsec_LOGSECRET_" + randomHex(8)
	ghSecret := "gh_LOGSECRET_" + randomHex(8)
	gitlabToken := "glpat-LOGSECRET-" + randomHex(8)
	swSecret := "whsec_" + b64Of([]byte("LOGSECRET-sw-"+randomHex(9)))
	slackSecret := "slack_LOGSECRET_" + randomHex(8)
	pgPassword := "PGPASSWORD-" + randomHex(8)
	forbidden := []string{canary, stripeSecret, ghSecret, gitlabToken, swSecret, strings.TrimPrefix(swSecret, "whsec_"), slackSecret, pgPassword}
	var answers []answer
	var gateways []*gateway
	// note records what a sender sent, so it is looked for in the logs.
	note := func(values ...string) { forbidden = append(forbidden, values...) }
	serve := func(g *gateway, req *http.Request) answer {
		for _, name := range []string{"Stripe-Signature", "X-Hub-Signature-256", "X-Hub-Signature", "X-Gitlab-Token",
			"webhook-signature", "X-Slack-Signature"} {
			for _, v := range req.Header.Values(name) {
				note(v)
				if _, sig, ok := strings.Cut(v, "v1="); ok && len(sig) >= 16 {
					note(sig[:16])
				}
			}
		}
		a := g.serve(req)
		answers = append(answers, a)
		return a
	}
	up := newUpstream()
	up.respond = func(w http.ResponseWriter, r *http.Request, n int) error {
		body := up.call(t, n-1).Body
		switch {
		case bytes.Contains(body, []byte("SLOW")):
			return blockUntilDone(w, r, n)
		case bytes.Contains(body, []byte("FAIL")):
			return answerWith(http.StatusInternalServerError, "text/plain", "upstream failed")(w, r, n)
		}
		return answerWith(http.StatusOK, "text/plain", "ok")(w, r, n)
	}

	// Stripe on PostgreSQL, with a password in the DSN.
	st := newGateway(t, `webhook_idempotency {
		provider stripe
		secret `+stripeSecret+`
		max_body 2KB
		forward_timeout 200ms
	}`, onPostgres(), withDSNPassword(pgPassword), withUpstream(up))
	gateways = append(gateways, st)
	stripeBody := func(id, extra string) []byte {
		return []byte(`{"id":"` + id + `","object":"event","note":"` + canary + extra + `"}`)
	}
	now := st.clock.Unix()
	requireRelayed(t, serve(st, st.stripe(stripeSecret, stripeBody("evt_log_1", ""), now)))
	requireDuplicate(t, serve(st, st.stripe(stripeSecret, stripeBody("evt_log_1", ""), now)))
	requireRefused(t, serve(st, st.stripe("whsec_forged_"+canary, stripeBody("evt_log_2", ""), now)), http.StatusBadRequest, "no matching signature")
	tampered := st.stripe(stripeSecret, stripeBody("evt_log_3", ""), now)
	tampered.Body = io.NopCloser(bytes.NewReader(stripeBody("evt_log_3", "-tampered")))
	tampered.ContentLength = int64(len(stripeBody("evt_log_3", "-tampered")))
	requireRefused(t, serve(st, tampered), http.StatusBadRequest, "no matching signature")
	requireRefused(t, serve(st, st.stripe(stripeSecret, stripeBody("evt_log_4", ""), now-3600)), http.StatusBadRequest, "timestamp")
	big := stripeBody("evt_log_5", strings.Repeat(canary, 200))
	requireRefused(t, serve(st, st.stripe(stripeSecret, big, now)), http.StatusRequestEntityTooLarge, "max_body")
	br := st.stripe(stripeSecret, stripeBody("evt_log_6", ""), now, "Content-Encoding", "br")
	requireRefused(t, serve(st, br), http.StatusUnsupportedMediaType, "Content-Encoding")
	requireRefused(t, serve(st, st.stripe(stripeSecret, []byte(`{"object":"`+canary+`"}`), now)), http.StatusBadRequest, "event id missing")
	require.Equal(t, http.StatusInternalServerError, serve(st, st.stripe(stripeSecret, stripeBody("evt_log_7", "FAIL"), now)).status)
	require.Equal(t, http.StatusGatewayTimeout, serve(st, st.stripe(stripeSecret, stripeBody("evt_log_8", "SLOW"), now)).status)
	gz := st.stripe(stripeSecret, stripeBody("evt_log_9", ""), now, "Content-Encoding", "gzip")
	gz.Body = io.NopCloser(bytes.NewReader([]byte("not gzip " + canary)))
	requireRefused(t, serve(st, gz), http.StatusBadRequest, "gzip")
	// The store fails: its error is logged, never the body or the DSN.
	dropTable(pgDSN(t), st.storage.Table)
	a := serve(st, st.stripe(stripeSecret, stripeBody("evt_log_10", ""), now))
	requireRefused(t, a, http.StatusServiceUnavailable, "event store unavailable")
	require.NotEmpty(t, st.logged("claiming event failed"), "the store error is logged")
	for _, internal := range []string{"SQLSTATE", st.storage.Table, "relation", "pgx", "postgres"} {
		require.NotContains(t, string(a.body), internal, "no internal error text in the answer")
	}

	// GitHub: replays and mismatches are warned about, with the ID only.
	gh := newGateway(t, "webhook_idempotency {\n provider github\n secret "+ghSecret+"\n allow_sha1\n}", withUpstream(up))
	gateways = append(gateways, gh)
	ghBody := []byte(`{"zen":"` + canary + `"}`)
	requireRelayed(t, serve(gh, githubDelivery(ghSecret, ghBody, "log-1")))
	requireDuplicate(t, serve(gh, githubDelivery(ghSecret, ghBody, "log-2")))                               // body replay
	requireDuplicate(t, serve(gh, githubDelivery(ghSecret, []byte(`{"zen":"other-`+canary+`"}`), "log-1"))) // mismatch
	requireRefused(t, serve(gh, githubDelivery("gh_forged_"+canary, ghBody, "log-3")), http.StatusBadRequest, "no matching")
	sha1Only := newDelivery("http://gateway.test/gh", ghBody, "X-GitHub-Delivery", "log-4",
		"X-Hub-Signature", "sha1="+hexOf(mac1([]byte(ghSecret), ghBody)))
	requireDuplicate(t, serve(gh, sha1Only))
	require.NotEmpty(t, gh.logged("body already delivered"))
	require.NotEmpty(t, gh.logged("different body"))

	// GitLab sends the secret token itself.
	gl := newGateway(t, "webhook_idempotency {\n provider gitlab\n secret "+gitlabToken+"\n}", withUpstream(up))
	gateways = append(gateways, gl)
	glBody := []byte(`{"object_kind":"push","note":"` + canary + `"}`)
	glReq := func(token, id string) *http.Request {
		return newDelivery("http://gateway.test/gl", glBody, "Content-Type", "application/json",
			"X-Gitlab-Token", token, "Idempotency-Key", id)
	}
	requireRelayed(t, serve(gl, glReq(gitlabToken, "gl-1")))
	requireRefused(t, serve(gl, glReq("glpat-WRONG-"+canary, "gl-2")), http.StatusBadRequest, "no matching")
	requireRefused(t, serve(gl, glReq(gitlabToken, "")), http.StatusBadRequest, "event id empty")

	// Standard Webhooks and Slack (a handshake and an on_missing_id forward).
	sw := newGateway(t, "webhook_idempotency {\n provider standard\n secret "+swSecret+"\n}", withUpstream(up))
	gateways = append(gateways, sw)
	swBody := []byte(`{"type":"` + canary + `"}`)
	swReq := func(id string, key []byte) *http.Request {
		return newDelivery("http://gateway.test/sw", swBody, "Content-Type", "application/json", "webhook-id", id,
			"webhook-timestamp", strconv.FormatInt(now, 10), "webhook-signature", "v1,"+swSig(key, id, now, swBody))
	}
	requireRelayed(t, serve(sw, swReq("msg_log_1", swKey(t, swSecret))))
	requireRefused(t, serve(sw, swReq("msg_log_2", []byte(swSecret))), http.StatusBadRequest, "no matching")

	sl := newGateway(t, "webhook_idempotency {\n provider slack\n secret "+slackSecret+"\n on_missing_id forward\n handshake forward\n}", withUpstream(up))
	gateways = append(gateways, sl)
	for _, b := range [][]byte{
		[]byte(`{"type":"url_verification","challenge":"` + canary + `"}`),
		[]byte(`command=%2F` + canary + `&text=x`),
		[]byte(`{"type":"event_callback","event_id":"Ev0LOG","text":"` + canary + `"}`),
	} {
		requireRelayed(t, serve(sl, newDelivery("http://gateway.test/slack", b,
			append([]string{"Content-Type", "application/json"}, slackHeaders(slackSecret, b, now)...)...)))
	}

	// Every entry, every field.
	var entries []observer.LoggedEntry
	for _, g := range gateways {
		entries = append(entries, g.logs.All()...)
	}
	require.Greater(t, len(entries), 25)
	for _, e := range entries {
		text := e.Message + "\n" + e.LoggerName + "\n" + e.Stack + "\n" + fmt.Sprint(e.ContextMap())
		for _, f := range e.Context {
			text += "\n" + f.Key + "=" + f.String + fmt.Sprint(f.Interface)
		}
		for _, secret := range forbidden {
			require.NotContains(t, text, secret, "log entry %q", e.Message)
		}
	}
	for _, a := range answers {
		if a.header.Get("Content-Type") != "application/json" {
			continue // the upstream's own answer
		}
		for _, secret := range forbidden {
			require.NotContains(t, string(a.body), secret)
		}
	}

	// A DSN the server refuses (an unknown role: authentication fails at
	// load, unlike an unreachable server, which the gateway waits for):
	// the error names the problem, never the password.
	u, err := url.Parse(pgDSN(t))
	require.NoError(t, err)
	u.User = url.UserPassword("no_such_role_sec", pgPassword)
	err = provisionErr(t, `webhook_idempotency {
		provider stripe
		secret x
		storage postgres "`+u.String()+`"
	}`)
	require.Error(t, err)
	require.NotContains(t, err.Error(), pgPassword)
}

// TestSecurity_HostileEventIDs: IDs with quotes, SQL, NULs, invalid UTF-8,
// unicode and 10 KB are either stored exactly or refused 400 with a reason
// that holds no internal error text; the store is unaffected.
func TestSecurity_HostileEventIDs(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, backend gatewayOption) {
		const secret = "whsec_hostile"
		g := newGateway(t, "webhook_idempotency {\n provider stripe\n secret "+secret+"\n}", backend)
		gh := newGateway(t, "webhook_idempotency {\n provider github\n secret gh_hostile\n}", sharingStore(g), withUpstream(newUpstream()))
		check := "✓"
		accepted := map[string]string{ // JSON spelling -> the ID stored
			`"evt_\"quoted'"`:                     `evt_"quoted'`,
			`"'); DROP TABLE webhook_events; --"`: `'); DROP TABLE webhook_events; --`,
			`"évt_✓_😀_\u202ertl"`:                 "évt_✓_😀_\u202ertl",
			`"evt_\\back\\slash%00%27"`:           `evt_\back\slash%00%27`,
			`"evt_\u0001\u001f\t"`:                "evt_\x01\x1f\t",
			`"` + strings.Repeat(check, 85) + `"`: strings.Repeat(check, 85), // exactly 255 bytes
			`123456789012345678901234567890`:      "123456789012345678901234567890",
			`"$1; SELECT pg_sleep(10)"`:           "$1; SELECT pg_sleep(10)",
			`"evt_` + "\u00a0\u2028\u2029" + `"`:  "evt_\u00a0\u2028\u2029",
			`"evt_*?[]{}.#|@"`:                    "evt_*?[]{}.#|@",
		}
		refused := map[string]string{ // JSON spelling -> the reason
			`"evt_\u0000nul"`:                       "not text (a NUL byte or invalid UTF-8)",
			`"evt_\ud800_lone_surrogate"`:           "not text (a NUL byte or invalid UTF-8)", // would merge with \udbff etc. as U+FFFD
			"\"evt_\xff\xfe\"":                      "not text (a NUL byte or invalid UTF-8)",
			`"` + strings.Repeat(check, 85) + `x"`:  "longer than 255 bytes",
			`"` + strings.Repeat("A", 10<<10) + `"`: "longer than 255 bytes",
			`"` + strings.Repeat(`\"`, 5<<10) + `"`: "longer than 255 bytes",
			`{"$ne":null}`:                          "not a string or number",
			`["evt_a","evt_b"]`:                     "not a string or number",
		}
		body := func(idJSON string) []byte { return []byte(`{"id":` + idJSON + `,"object":"event"}`) }
		internal := []string{"SQL", "sqlite", "pgx", "pq:", "panic", "goroutine", "runtime error", "webhook_events"}
		if g.storage.Table != "" {
			internal = append(internal, g.storage.Table)
		}

		for spelling, want := range accepted {
			requireRelayed(t, g.serve(g.stripe(secret, body(spelling), g.clock.Unix())))
			g.requireRow("stripe", want, store.StateCompleted)
			requireDuplicate(t, g.serve(g.stripe(secret, body(spelling), g.clock.Unix())))
		}
		for spelling, reason := range refused {
			a := g.serve(g.stripe(secret, body(spelling), g.clock.Unix()))
			requireRefused(t, a, http.StatusBadRequest, reason)
			require.Less(t, len(a.body), 200, "the reason, not the ID, is echoed")
			for _, s := range internal {
				require.NotContains(t, string(a.body), s)
			}
		}
		require.Equal(t, len(accepted), g.up.count())
		require.Len(t, g.rows(), len(accepted))

		// Header IDs (GitHub's delivery GUID).
		ghBody := func(n int) []byte { return []byte(fmt.Sprintf(`{"hook_id":%d}`, n)) }
		for n, guid := range []string{"guid-\xff\xfe", strings.Repeat("g", 10<<10), "guid-\x00"} {
			a := gh.serve(githubDelivery("gh_hostile", ghBody(n), guid))
			require.Equal(t, http.StatusBadRequest, a.status, "%q: %s", guid, a.body)
			for _, s := range internal {
				require.NotContains(t, string(a.body), s)
			}
		}
		requireRelayed(t, gh.serve(githubDelivery("gh_hostile", ghBody(10), `guid-"quoted'`)))
		gh.requireRow("github", `guid-"quoted'`, store.StateCompleted)
		require.Equal(t, 1, gh.up.count())

		// The store is unaffected: every row is there, a plain delivery works.
		requireRelayed(t, g.serve(g.stripe(secret, body(`"evt_plain_after"`), g.clock.Unix())))
		g.requireRow("stripe", "evt_plain_after", store.StateCompleted)
		require.Len(t, g.rows(), len(accepted)+1+2) // + github's ID and body-hash rows
	})
}

// TestSecurity_ScopesIsolated: two routes with different scopes on one
// store each forward the same event ID (and, with dedupe_body, the same
// body) once; the same scope shares deduplication.
func TestSecurity_ScopesIsolated(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, backend gatewayOption) {
		const secret = "whsec_scopes"
		a := newGateway(t, "webhook_idempotency {\n provider stripe\n secret "+secret+"\n scope shop-a\n}", backend)
		b := newGateway(t, "webhook_idempotency {\n provider stripe\n secret "+secret+"\n scope shop-b\n}",
			sharingStore(a), withUpstream(newUpstream()))
		a2 := newGateway(t, "webhook_idempotency {\n provider stripe\n secret "+secret+"\n scope shop-a\n}",
			sharingStore(a), withUpstream(newUpstream()))
		body := []byte(`{"id":"evt_shared_id","object":"event"}`)
		requireRelayed(t, a.serve(a.stripe(secret, body, a.clock.Unix())))
		requireRelayed(t, b.serve(b.stripe(secret, body, b.clock.Unix())))
		requireDuplicate(t, a.serve(a.stripe(secret, body, a.clock.Unix())))
		requireDuplicate(t, b.serve(b.stripe(secret, body, b.clock.Unix())))
		requireDuplicate(t, a2.serve(a2.stripe(secret, body, a2.clock.Unix())))
		require.Equal(t, 1, a.up.count())
		require.Equal(t, 1, b.up.count())
		require.Equal(t, 0, a2.up.count(), "same scope, shared dedupe")
		a.requireRow("shop-a", "evt_shared_id", store.StateCompleted)
		a.requireRow("shop-b", "evt_shared_id", store.StateCompleted)

		// dedupe_body is per scope too.
		ga := newGateway(t, "webhook_idempotency {\n provider github\n secret gh_scopes\n scope repo-a\n}", sharingStore(a), withUpstream(newUpstream()))
		gb := newGateway(t, "webhook_idempotency {\n provider github\n secret gh_scopes\n scope repo-b\n}", sharingStore(a), withUpstream(newUpstream()))
		ghBody := []byte(`{"zen":"scopes"}`)
		requireRelayed(t, ga.serve(githubDelivery("gh_scopes", ghBody, "s-1")))
		requireRelayed(t, gb.serve(githubDelivery("gh_scopes", ghBody, "s-2")))
		requireDuplicate(t, gb.serve(githubDelivery("gh_scopes", ghBody, "s-3")))
		require.Equal(t, 1, ga.up.count())
		require.Equal(t, 1, gb.up.count())
	})
}

// TestSecurity_DecompressionBomb: gzip bodies that decode far beyond
// max_body are cut off at max_body with 413, never forwarded or recorded,
// with memory bounded by a few times max_body: a bomb of unknown length
// (chunked), and an endless stream. Not parallel: it measures the
// process's allocations.
func TestSecurity_DecompressionBomb(t *testing.T) {
	const maxBody = defaultMaxBody // no max_body line: the default 5MB
	const secret = "gen_bomb"
	g := newGateway(t, `webhook_idempotency {
		provider hmac
		secret gen_bomb
		event_id json id
		hmac {
			header X-Signature
		}
	}`)
	require.EqualValues(t, maxBody, g.h.MaxBody)
	bomb, sig := gzipBomb(t, `{"id":"bomb-1","pad":"`, 256<<20, `"}`, secret)

	measure := func(body io.Reader) answer {
		pr, pw := io.Pipe()
		go func() {
			_, err := io.Copy(pw, body)
			pw.CloseWithError(err)
		}()
		req := newDelivery("http://gateway.test/hook", nil,
			"Content-Type", "application/json", "Content-Encoding", "gzip", "X-Signature", sig)
		req.Body, req.ContentLength = pr, -1 // chunked: the size is unknown up front
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		a := g.serve(req)
		runtime.ReadMemStats(&after)
		_ = pr.CloseWithError(io.ErrClosedPipe) // stop the sender
		requireBoundedAlloc(t, after.TotalAlloc-before.TotalAlloc, maxBody)
		return a
	}

	t.Run("256 MiB decoded, unknown length", func(t *testing.T) {
		start := time.Now()
		a := measure(bytes.NewReader(bomb))
		requireRefused(t, a, http.StatusRequestEntityTooLarge, "max_body")
		require.Less(t, time.Since(start), 20*time.Second)
	})
	t.Run("endless gzip stream", func(t *testing.T) {
		a := measure(endlessGzip(t))
		requireRefused(t, a, http.StatusRequestEntityTooLarge, "max_body")
	})
	require.Equal(t, 0, g.up.count())
	require.Empty(t, g.rows())
}

// endlessGzip is a gzip stream of spaces that never ends.
func endlessGzip(t testing.TB) io.Reader {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	require.NoError(t, err)
	_, err = zw.Write(bytes.Repeat([]byte(" "), 1<<20))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	member := buf.Bytes()
	return readerFunc(func(p []byte) (int, error) {
		n := 0
		for n < len(p) {
			n += copy(p[n:], member)
		}
		return n, nil
	})
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// FuzzServeHTTP throws random bodies, signature headers, encodings and extra
// headers at a Stripe and a GitHub route with real SQLite stores. The
// signatures that verify are computed over one fixed body per route, so the
// upstream must only ever see that body (decoded when gzip): next is never
// called for bytes nobody signed, and nothing panics.
func FuzzServeHTTP(f *testing.F) {
	clock := newTestClock(time.Unix(1_700_000_000, 0)) // fixed: corpus signatures stay valid
	const stripeSecret, ghSecret = "whsec_fuzz", "gh_fuzz"
	stripeBody := []byte(`{"id":"evt_fuzz_0001","object":"event","type":"invoice.paid"}`)
	ghBody := []byte(`{"zen":"fuzz","hook_id":1}`)
	stripeSigned := stripeHeader(stripeSecret, stripeBody, clock.Unix())
	ghSigned := "sha256=" + hexOf(mac256([]byte(ghSecret), ghBody))
	routes := []struct {
		g      *gateway
		header string
		body   []byte
	}{
		{newGateway(f, "webhook_idempotency {\n provider stripe\n secret "+stripeSecret+"\n max_body 4KB\n}", withClock(clock)), "Stripe-Signature", stripeBody},
		{newGateway(f, "webhook_idempotency {\n provider github\n secret "+ghSecret+"\n max_body 4KB\n}", withClock(clock)), "X-Hub-Signature-256", ghBody},
	}
	for _, r := range routes {
		r.g.h.logger = zap.NewNop() // millions of runs: keep no entries
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(stripeBody)
	_ = zw.Close()

	f.Add(uint8(0), stripeBody, stripeSigned, "", "", "")
	f.Add(uint8(0), append([]byte(nil), stripeBody[:len(stripeBody)-1]...), stripeSigned, "", "", "")
	f.Add(uint8(0), append(append([]byte(nil), stripeBody...), '\n'), stripeSigned, "", "", "")
	f.Add(uint8(0), gz.Bytes(), stripeSigned, "gzip", "", "")
	f.Add(uint8(0), stripeBody, stripeSigned, "br", "", "")
	f.Add(uint8(0), stripeBody, stripeSigned, "", "Stripe-Signature", "t=1,v1=00")
	f.Add(uint8(0), stripeBody, stripeSigned+",t=1", "", "", "")
	f.Add(uint8(0), stripeBody, strings.Replace(stripeSigned, "v1=", "v0=", 1), "", "", "")
	f.Add(uint8(1), ghBody, ghSigned, "", "X-GitHub-Delivery", "fuzz-2")
	f.Add(uint8(1), ghBody, strings.ToUpper(ghSigned), "", "", "")
	f.Add(uint8(1), []byte(`{"zen":"fuzz","hook_id":2}`), ghSigned, "", "X-Hub-Signature", "sha1=00")
	f.Add(uint8(1), ghBody, "", "", "x-hub-signature-256", ghSigned)
	f.Add(uint8(1), []byte{}, ghSigned, "gzip", "", "")
	f.Fuzz(func(t *testing.T, which uint8, body []byte, sig, encoding, extraName, extraValue string) {
		r := routes[int(which)%len(routes)]
		g := *r.g // the same handler, reporting to this run's t
		g.t = t
		req := withReplacer(httptestRequest(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-GitHub-Delivery", "fuzz-1")
		if sig != "" {
			req.Header[r.header] = []string{sig}
		}
		if encoding != "" {
			req.Header["Content-Encoding"] = []string{encoding}
		}
		if validHeaderName(extraName) {
			req.Header[extraName] = append(req.Header[extraName], extraValue)
		}
		before := g.up.count()
		a := g.serve(req)
		require.Contains(t, []int{200, 400, 409, 413, 415, 503}, a.status, "%s", a.body)
		if g.up.count() == before {
			return
		}
		c := g.up.call(t, before)
		got := c.Body
		if strings.EqualFold(strings.TrimSpace(c.Header.Get("Content-Encoding")), "gzip") {
			zr, err := gzip.NewReader(bytes.NewReader(got))
			require.NoError(t, err)
			got, err = io.ReadAll(zr)
			require.NoError(t, err)
		}
		require.Equal(t, r.body, got, "forwarded bytes nobody signed")
		require.Equal(t, body, c.Body, "forwarded exactly as received")
	})
}

func httptestRequest(body []byte) *http.Request {
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://gateway.test/fuzz", bytes.NewReader(body))
	return req
}

// validHeaderName reports whether name is an HTTP token.
func validHeaderName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
