package caddymodule

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/cli"
)

// A correctly signed body the scheme refuses is answered with the real
// reason, "body is not JSON", counted bad_request, and never forwarded; the
// same body under a wrong secret still gets "no matching signature", so the
// reason tells a prober nothing about the secret.
func TestSignedBodyNotJSONNamesTheReason(t *testing.T) {
	t.Parallel()
	secret := "whsec_" + randomHex(8)
	g := newGateway(t, "webhook_idempotency {\n provider stripe\n secret "+secret+"\n scope "+uniqueScope("notjson")+"\n}")
	now := g.clock.Unix()
	for _, body := range []string{"not json", "", `["a"]`, `{"id":"evt_1"`} {
		a := g.serve(g.stripe(secret, []byte(body), now))
		requireRefused(t, a, http.StatusBadRequest, `"body is not JSON"`)
		a = g.serve(g.stripe("whsec_wrong_"+randomHex(4), []byte(body), now))
		requireRefused(t, a, http.StatusBadRequest, `"no matching signature"`)
	}
	require.Equal(t, 0, g.up.count())
	require.Empty(t, g.rows())
	require.Equal(t, 4.0, g.outcomes(outcomeBadRequest))
	require.Equal(t, 4.0, g.outcomes(outcomeInvalidSignature))
}

// Twilio signs the form's parameters: a body that is not a form cannot be
// verified at all, and the answer says so instead of blaming the signature.
func TestTwilioBodyNotFormNamesTheReason(t *testing.T) {
	t.Parallel()
	g := newGateway(t, "webhook_idempotency {\n provider twilio\n secret tw_"+randomHex(4)+"\n url https://hooks.example.test/tw\n}")
	req := newDelivery("http://gateway.test/tw", []byte("a=%zz"), "Content-Type", "application/x-www-form-urlencoded",
		"I-Twilio-Idempotency-Token", "idem-1", "X-Twilio-Signature", b64Of(make([]byte, 20)))
	requireRefused(t, g.serve(req), http.StatusBadRequest, `"body is not a form"`)
	require.Equal(t, 0, g.up.count())
}

// Two routes of one config that share a scope on different storages are
// refused at load, naming the scope and both storages (never a DSN
// password); on one storage they load, and so do distinct scopes.
func TestScopeOnTwoStoragesRefused(t *testing.T) {
	dir := t.TempDir()
	route := func(path, scope, storage string) string {
		return "\thandle " + path + " {\n\t\twebhook_idempotency {\n\t\t\tprovider stripe\n\t\t\tsecret whsec_x\n\t\t\tscope " + scope +
			"\n\t\t\tstorage " + storage + "\n\t\t}\n\t\trespond 200\n\t}\n"
	}
	a, b := "sqlite "+filepath.Join(dir, "a.db"), "sqlite "+filepath.Join(dir, "b.db")
	pg := "postgres postgres://gw:S3CRETPW@127.0.0.1:1/none?sslmode=disable"

	_, err := validateCaddyfile(t, ":18080 {\n"+route("/a", "shop", a)+route("/b", "shop", b)+"}\n")
	require.Error(t, err)
	require.Contains(t, err.Error(), `scope: "shop" is already used by another route on sqlite`)
	require.Contains(t, err.Error(), "give them the same storage, or distinct scopes")

	// Postgres is checked before it is dialled (nothing listens on port 1;
	// one site, so its routes are provisioned in order).
	_, err = validateCaddyfile(t, ":18080 {\n"+route("/a", "shop", a)+route("/b", "shop", pg)+"}\n")
	require.Error(t, err)
	require.Contains(t, err.Error(), "postgres postgres://gw:xxxxx@127.0.0.1:1/none")
	require.NotContains(t, err.Error(), "S3CRETPW")

	configs := func() int {
		configScopes.Lock()
		defer configScopes.Unlock()
		return len(configScopes.m)
	}
	before := configs()
	_, err = validateCaddyfile(t, ":18080 {\n"+route("/a", "shop", a)+route("/b", "shop", a)+route("/c", "other", b)+"}\n")
	require.NoError(t, err)
	require.Equal(t, before, configs(), "cleanup forgets the config")
}

// A webhook route reachable only under host matchers is warned about at
// load: Caddy would answer a delivery with another Host an empty 200. A
// site address without a host, or a catch-all site on the same listener,
// is not.
func TestHostOnlySiteWarns(t *testing.T) {
	dir := t.TempDir()
	hook := func(path string) string {
		return "\thandle " + path + " {\n\t\twebhook_idempotency {\n\t\t\tprovider stripe\n\t\t\tsecret whsec_x\n\t\t\tstorage sqlite " +
			filepath.Join(dir, "e.db") + "\n\t\t}\n\t\trespond 200\n\t}\n"
	}
	const warning = "server answers requests for other hosts with an empty 200"
	for _, tc := range []struct {
		name, caddyfile string
		warns           bool
	}{
		{"ip site", "http://127.0.0.1:18080 {\n" + hook("/webhooks/stripe") + "}\n", true},
		{"named site, two routes", "http://hooks.example.com:18080 {\n" + hook("/a") + hook("/b") + "}\n", true},
		{"port only", ":18080 {\n" + hook("/webhooks/stripe") + "}\n", false},
		{"catch-all beside", "http://hooks.example.com:18080 {\n" + hook("/a") + "}\n:18080 {\n\trespond 404\n}\n", false},
		{"host site on another server", "http://hooks.example.com:18081 {\n\trespond 200\n}\n:18080 {\n" + hook("/a") + "}\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs, err := validateCaddyfile(t, tc.caddyfile)
			require.NoError(t, err)
			if !tc.warns {
				require.NotContains(t, logs, warning)
				return
			}
			require.Equal(t, 1, strings.Count(logs, warning), "once per server:\n%s", logs)
			require.Contains(t, logs, `"level":"warn"`)
			require.Contains(t, logs, `"listen":[":18080"]`)
		})
	}
}

// A client trickling the body a byte every 100ms over a real socket is cut
// off at read_timeout with 408, nothing is recorded or forwarded, and the
// next request on a fresh connection is served normally.
func TestReadTimeoutSlowBody(t *testing.T) {
	t.Parallel()
	secret := "whsec_" + randomHex(8)
	scope := uniqueScope("slow")
	g := newGateway(t, "webhook_idempotency {\n provider stripe\n secret "+secret+"\n scope "+scope+"\n read_timeout 500ms\n}")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = g.h.ServeHTTP(w, withReplacer(r), g.up)
	}))
	t.Cleanup(srv.Close)

	body := stripeBody("evt_slow_1", "x")
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "POST /webhooks/stripe HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\nStripe-Signature: %s\r\n\r\n",
		len(body), stripeHeader(secret, body, g.clock.Unix()))
	require.NoError(t, err)
	start := time.Now()
	answered := make(chan string, 1)
	go func() {
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, _ := bufio.NewReader(conn).ReadString('\n')
		answered <- line
	}()
	var status string
trickle:
	for i := 0; i < len(body)-1 && i < 50; i++ { // bounded: at most 5s of trickling
		select {
		case status = <-answered:
			break trickle
		case <-time.After(100 * time.Millisecond):
			_, _ = conn.Write(body[i : i+1]) // fails once the gateway closed it
		}
	}
	if status == "" {
		status = <-answered
	}
	require.Contains(t, status, "408", "answer: %q", status)
	require.Less(t, time.Since(start), 3*time.Second, "cut off at read_timeout, not at the end of the trickle")
	require.Equal(t, 0, g.up.count())
	require.Empty(t, g.rows())
	require.Equal(t, 1.0, g.outcomes(outcomeReadTimeout))

	// A delivery that arrives at once goes through.
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/webhooks/stripe", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Stripe-Signature", stripeHeader(secret, body, g.clock.Unix()))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, 1, g.up.count())
}

// A delivery refused before its body is read to the end (a declared
// length over max_body, an unsupported Content-Encoding, a missing
// Idempotency-Key) is answered within drainAtMost to a sender that sends
// nothing more, and the connection closed: Caddy's server reads up to 256
// KiB of the unread body first, and waited for it (a trial's stalled 6 MB
// post had no 413 after 15 s). A refusal after the whole body keeps the
// connection; one to a sender still writing a large body reaches it (a
// close at once would reset the connection under it: TestBigGitHubDelivery).
// Behind the in-process Caddy: its server, unlike a bare net/http one,
// drains a large unread body too.
func TestRefusalBeforeBodyAnsweredAtOnce(t *testing.T) {
	secret := "whsec_" + randomHex(8)
	up, forwards := countingUpstream(t)
	startCaddy(t, fmt.Sprintf(`{
`+caddyTestGlobals+`}
http://localhost:9080 {
	handle /hook {
		webhook_idempotency {
			provider stripe
			secret %q
			storage sqlite %q
			scope %s
			max_body 1MB
		}
		reverse_proxy %s
	}
	handle /keyed {
		webhook_idempotency {
			provider idempotency_key
			storage sqlite %q
			scope %s
		}
		reverse_proxy %s
	}
}`, secret, filepath.Join(t.TempDir(), "hook.db"), uniqueScope("early"), up.Listener.Addr().String(),
		filepath.Join(t.TempDir(), "keyed.db"), uniqueScope("earlykey"), up.Listener.Addr().String()))
	body := stripeBody("evt_early_1", "x")
	sig := stripeHeader(secret, body, time.Now().Unix())
	for _, tc := range []struct {
		name, path, head string
		sent             []byte // of the body, before the sender stalls
		status           string
		closes           bool
	}{
		{"over max_body", "/hook", "Content-Length: 6000000\r\nStripe-Signature: " + sig, nil, "413", true},
		{"over max_body, Expect: 100-continue", "/hook", "Content-Length: 6000000\r\nExpect: 100-continue\r\nStripe-Signature: " + sig, nil, "413", true},
		{"unsupported encoding", "/hook", "Content-Length: 1000\r\nContent-Encoding: br\r\nStripe-Signature: " + sig, []byte("{}"), "415", true},
		{"no Idempotency-Key", "/keyed", "Content-Length: 100000", []byte(`{"a":`), "400", true},
		{"bad signature, whole body", "/hook", fmt.Sprintf("Content-Length: %d\r\nStripe-Signature: t=1,v1=00", len(body)), body, "400", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", "127.0.0.1:9080")
			require.NoError(t, err)
			defer conn.Close()
			_, err = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: localhost:9080\r\nContent-Type: application/json\r\n%s\r\n\r\n%s", tc.path, tc.head, tc.sent)
			require.NoError(t, err)
			start := time.Now()
			require.NoError(t, conn.SetReadDeadline(start.Add(5*time.Second)))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			require.NoError(t, err, "no answer while the sender waits")
			resp.Body.Close()
			require.Contains(t, resp.Status, tc.status)
			require.Less(t, time.Since(start), 2*time.Second)
			if strings.Contains(tc.head, "100-continue") {
				// Nothing read, no 100 Continue sent: the sender sends no
				// body, so nothing is waited for (drainAtMost was).
				require.Less(t, time.Since(start), drainAtMost)
			}
			require.Equal(t, tc.closes, resp.Close, "Connection: close")
		})
	}
	require.Zero(t, forwards.Load())
}

// The queue and event commands call the admin API paths the admin modules
// serve, and the destructive ones carry the confirmation the guard wants.
func TestQueueAndForgetCommandsSendConfirmation(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.RequestURI())
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(srv.Close)
	admin := srv.Listener.Addr().String()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"queue", "list"}, "GET /webhook_idempotency/queue/"},
		{[]string{"queue", "list", "--scope", "stripe", "--state", "dead", "--limit", "5"}, "GET /webhook_idempotency/queue/stripe/events?limit=5&state=dead"},
		{[]string{"queue", "get", "--scope", "stripe", "--id", "evt/1"}, "GET /webhook_idempotency/queue/stripe/event?id=evt%2F1"},
		{[]string{"queue", "retry", "--scope", "stripe"}, "POST /webhook_idempotency/queue/stripe/retry"},
		{[]string{"queue", "retry", "--scope", "stripe", "--id", "evt_1"}, "POST /webhook_idempotency/queue/stripe/event/retry?id=evt_1"},
		{[]string{"queue", "purge", "--scope", "stripe", "--id", "evt/1"}, "DELETE /webhook_idempotency/queue/stripe/event?confirm=evt%2F1&id=evt%2F1"},
		{[]string{"queue", "purge", "--scope", "stripe", "--state", "dead"}, "DELETE /webhook_idempotency/queue/stripe/events?confirm=dead&state=dead"},
		{[]string{"event", "forget", "--scope", "stripe", "--id", "evt 1"}, "DELETE /webhook_idempotency/event?confirm=evt+1&id=evt+1&scope=stripe"},
	} {
		got = nil
		_, err := runCLI(t, append(tc.args, "--admin", admin)...)
		require.NoError(t, err, tc.args)
		require.Equal(t, []string{tc.want}, got, tc.args)
	}
	_, err := runCLI(t, "queue", "purge", "--scope", "stripe", "--admin", admin)
	require.ErrorContains(t, err, "exactly one of --id and --state")

	// The guard accepts what the CLI sends: the confirmation decoded is the ID.
	for _, uri := range []string{"/webhook_idempotency/queue/stripe/events/evt%2F1?confirm=evt%2F1",
		"/webhook_idempotency/events/stripe/evt%201?confirm=evt+1", "/webhook_idempotency/queue/stripe/events?confirm=dead&state=dead"} {
		r := httptest.NewRequest(http.MethodDelete, uri, nil)
		want, _ := confirmationFor(r)
		require.NotEmpty(t, want, uri)
		require.Equal(t, want, r.URL.Query().Get("confirm"), uri)
	}
}

// log-filter prints, for each provider, every header that carries its
// signature or token, in the form Caddy's logs print them.
func TestLogFilterCommand(t *testing.T) {
	out, err := runCLI(t, "log-filter", "--provider", "stripe,gitlab", "--provider", "standard", "--provider", "github")
	require.NoError(t, err)
	for _, h := range []string{"Stripe-Signature", "X-Gitlab-Token", "Webhook-Signature", "Svix-Signature", "X-Hub-Signature-256", "X-Hub-Signature",
		"Webhook-Claim"} {
		require.Contains(t, out, "\t\t\t\trequest>headers>"+h+" delete\n")
	}
	require.True(t, strings.HasPrefix(out, "{\n\tlog default {\n\t\tformat filter {\n\t\t\twrap json\n"), out)
	// Gitea and Forgejo send the one HMAC under every name the forges used.
	for _, p := range []string{"gitea", "forgejo"} {
		out, err := runCLI(t, "log-filter", "--provider", p)
		require.NoError(t, err)
		for _, h := range []string{"X-Gitea-Signature", "X-Gogs-Signature", "X-Hub-Signature-256", "X-Hub-Signature"} {
			require.Contains(t, out, "\t\t\t\trequest>headers>"+h+" delete\n", p)
		}
	}
	out, err = runCLI(t, "log-filter", "--provider", "hmac", "--header", "x-acme-signature", "--site", "--wrap", "console")
	require.NoError(t, err)
	require.Equal(t, "log {\n\tformat filter {\n\t\twrap console\n\t\tfields {\n\t\t\trequest>headers>Webhook-Claim delete\n"+
		"\t\t\trequest>headers>X-Acme-Signature delete\n\t\t}\n\t}\n}\n", out)
	_, err = runCLI(t, "log-filter", "--provider", "hmac")
	require.ErrorContains(t, err, "--header")
	_, err = runCLI(t, "log-filter", "--provider", "nosuch")
	require.ErrorContains(t, err, "unknown provider")
}

// Every example ships the log filter for every provider it configures, and
// none uses a site address with a host (a delivery with another Host would
// get Caddy's empty 200).
func TestExamplesShipLogFilterAndCatchAllSites(t *testing.T) {
	files, err := filepath.Glob("../examples/*.Caddyfile")
	require.NoError(t, err)
	files = append(files, "../examples/Caddyfile")
	providerLine := regexp.MustCompile(`(?m)^\s*provider\s+(\S+)`)
	siteLine := regexp.MustCompile(`(?m)^([^\s#{][^{\n]*)\{[ \t]*$`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		var providers []string
		for _, m := range providerLine.FindAllStringSubmatch(string(b), -1) {
			providers = append(providers, m[1])
		}
		require.NotEmpty(t, providers, f)
		headers, err := cli.SecretHeaders(providers)
		require.NoError(t, err, f)
		for _, h := range headers {
			require.Contains(t, string(b), "request>headers>"+h+" delete", "%s: log filter for %s", f, h)
		}
		for _, m := range siteLine.FindAllStringSubmatch(string(b), -1) {
			addr := strings.TrimSpace(m[1])
			require.True(t, strings.HasPrefix(addr, ":"), "%s: site address %q has a host", f, addr)
		}
	}
}

// A reverse_proxy that re-sends written requests (lb_retry_match with
// lb_retries or lb_try_duration) after webhook_idempotency is refused at
// load, in the same site, a subroute or a later route; without
// lb_retry_match (reverse_proxy then re-sends only what it could not
// connect for), in another handle group, or before the handler, it loads.
func TestProxyRetriesRefused(t *testing.T) {
	dir := t.TempDir()
	hook := func() string {
		return "\t\twebhook_idempotency {\n\t\t\tprovider stripe\n\t\t\tsecret whsec_x\n\t\t\tstorage sqlite " +
			filepath.Join(dir, randomHex(4)+".db") + "\n\t\t}\n"
	}
	proxy := func(lb string) string {
		return "\t\treverse_proxy 127.0.0.1:1 {\n" + lb + "\t\t}\n"
	}
	retryPOST := "\t\t\tlb_retries 2\n\t\t\tlb_retry_match {\n\t\t\t\tmethod POST\n\t\t\t}\n"
	retryStatus := "\t\t\tlb_try_duration 5s\n\t\t\tlb_retry_match {\n\t\t\t\texpression `{rp.status_code} in [502, 503]`\n\t\t\t}\n"
	for _, tc := range []struct {
		name, site, refused string
	}{
		{"same site, method matcher", ":18081 {\n" + hook() + proxy(retryPOST) + "}\n", "lb_retries 2 with lb_retry_match"},
		{"same site, response matcher", ":18081 {\n" + hook() + proxy(retryStatus) + "}\n", "lb_try_duration with lb_retry_match"},
		{"handle block", ":18081 {\n\thandle /hooks {\n" + hook() + proxy(retryPOST) + "\t}\n}\n", "lb_retries 2"},
		{"route then a later proxy", ":18081 {\n\troute /hooks {\n" + hook() + "\t}\n" + proxy(retryPOST) + "}\n", "lb_retries 2"},
		{"retries without match", ":18081 {\n" + hook() + proxy("\t\t\tlb_retries 2\n") + "}\n", ""},
		{"other handle group", ":18081 {\n\thandle /hooks {\n" + hook() + "\t\trespond 200\n\t}\n\thandle /api {\n" +
			proxy(retryPOST) + "\t}\n}\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			requireRefusedAtLoad(t, tc.site, tc.refused, "remove lb_retry_match")
		})
	}
}

// A scope is shared only by routes of the same trust (issue 22): with
// provider stripe on /webhooks/stripe and an unverified provider
// idempotency_key route on /api/* in scope stripe, an unsigned POST /api/x
// with Idempotency-Key: evt_future_1 would claim the real Stripe event
// evt_future_1, later answered as a duplicate and never forwarded. Such a
// config is refused at load, naming both verifiers and the fix; so are
// other secrets, another event_id source and on_missing_id forward. Routes
// that verify the same way share a scope, and the admin API lists each
// scope's verifier without a secret.
func TestScopeSharedOnlyBySameTrust(t *testing.T) {
	dir := t.TempDir()
	route := func(path, lines string) string {
		return "\thandle " + path + " {\n\t\twebhook_idempotency {\n" + lines + "\t\t\tscope stripe\n\t\t\tstorage sqlite " +
			filepath.Join(dir, "events.db") + "\n\t\t}\n\t\trespond 200\n\t}\n"
	}
	stripe := "\t\t\tprovider stripe\n\t\t\tsecret whsec_AAAA\n"
	for _, tc := range []struct{ name, other, want string }{
		{"unverified route", "\t\t\tprovider idempotency_key\n", "no signature (provider idempotency_key)"},
		{"other secret", "\t\t\tprovider stripe\n\t\t\tsecret whsec_BBBB\n", "provider stripe, secrets pbkdf2:"},
		{"other provider", "\t\t\tprovider github\n\t\t\tsecret whsec_AAAA\n", "provider github"},
		{"header event ID", stripe + "\t\t\tevent_id header X-Event-Id\n", "event_id header X-Event-Id"},
		{"on_missing_id forward", stripe + "\t\t\ton_missing_id forward\n", "on_missing_id forward"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := validateCaddyfile(t, ":18083 {\n"+route("/webhooks/stripe", stripe)+route("/api/*", tc.other)+"}\n")
			require.Error(t, err)
			require.Contains(t, err.Error(), `scope: "stripe" is already used by a route that verifies with provider stripe, secrets pbkdf2:`)
			require.Contains(t, err.Error(), tc.want)
			require.Contains(t, err.Error(), "give each route its own scope")
			require.NotContains(t, err.Error(), "whsec_")
		})
	}
	t.Run("same trust", func(t *testing.T) {
		_, err := validateCaddyfile(t, ":18083 {\n"+route("/a", stripe)+route("/b", stripe)+"}\n")
		require.NoError(t, err)
	})
	// Each route's sweep deletes the scope's rows after its own retention:
	// a verification trial's capture, 2 minutes old against a tolerance of
	// 5, was forwarded again once the other route's 1-minute retention
	// swept its row.
	t.Run("other retention or tolerance", func(t *testing.T) {
		for _, other := range []string{stripe + "\t\t\tretention 40d\n", stripe + "\t\t\ttolerance 20m\n"} {
			_, err := validateCaddyfile(t, ":18083 {\n"+route("/a", stripe)+route("/b", other)+"}\n")
			require.ErrorContains(t, err, `scope: routes of scope "stripe" keep its rows for retention 720h0m0s, replay_window 9600h0m0s, tolerance 5m0s and for `)
			require.ErrorContains(t, err, "write the same retention, replay_window and tolerance in each")
		}
	})
	t.Run("admin API shows the verifier", func(t *testing.T) {
		g := newGateway(t, "webhook_idempotency {\n\tprovider stripe\n\tsecret whsec_CCCC\n\tscope trust_"+randomHex(4)+"\n}")
		rec := httptest.NewRecorder()
		require.NoError(t, new(Admin).serve(rec, httptest.NewRequest(http.MethodGet, "/webhook_idempotency/scopes", nil)))
		require.Equal(t, http.StatusOK, rec.Code)
		require.Contains(t, rec.Body.String(), `{"scope":"`+g.h.Scope+`","verifiers":["provider stripe, secrets pbkdf2:`)
		require.NotContains(t, rec.Body.String(), "whsec_")
	})
}

// The secrets' fingerprint is the same for the same secrets in any order,
// differs for others, and is not a plain hash: a secret an operator chose
// (provider hmac) is not guessed from the admin API or a refused config's
// error at the speed of SHA-256.
func TestSecretsFingerprint(t *testing.T) {
	a := secretsFingerprint([]string{"hunter2", "whsec_AAAA"})
	require.Equal(t, a, secretsFingerprint([]string{"whsec_AAAA", "hunter2"}))
	require.NotEqual(t, a, secretsFingerprint([]string{"hunter2"}))
	require.Regexp(t, `^pbkdf2:[0-9a-f]{16}$`, a)
	plain := sha256.Sum256([]byte("hunter2\x00whsec_AAAA"))
	require.NotContains(t, hex.EncodeToString(plain[:]), strings.TrimPrefix(a, "pbkdf2:"))
}

// A webhook_idempotency that never runs is refused at load (a new user's
// trial: in a route block, which keeps its written order, a reverse_proxy
// before the directive forwarded every delivery unverified and each
// redelivery again, with no warning and no log line). So is one after an
// earlier route with no matcher that answers everything. What may pass a
// request on, or may not run, does not count: a proxy with a matcher, a
// file_server with pass_thru, a subroute, or anything after the handler.
func TestHandlerThatNeverRunsRefused(t *testing.T) {
	dir := t.TempDir()
	hook := func() string {
		return "\t\twebhook_idempotency {\n\t\t\tprovider stripe\n\t\t\tsecret whsec_x\n\t\t\tstorage sqlite " +
			filepath.Join(dir, randomHex(4)+".db") + "\n\t\t}\n"
	}
	proxy := "\t\treverse_proxy 127.0.0.1:1\n"
	for _, tc := range []struct {
		name, site, refused string
	}{
		{"route block, proxy first", ":18081 {\n\troute {\n" + proxy + hook() + "\t}\n}\n", "reverse_proxy (before it in the same route)"},
		{"route block, respond first", ":18081 {\n\troute /hooks {\n\t\trespond 200\n" + hook() + proxy + "\t}\n}\n",
			"static_response (before it in the same route)"},
		{"route block, file_server first", ":18081 {\n\troute {\n\t\tfile_server\n" + hook() + proxy + "\t}\n}\n", "file_server"},
		{"earlier route answers everything", ":18081 {\n\troute {\n\t\trespond 404\n\t\troute /hooks {\n" + hook() + proxy + "\t\t}\n\t}\n}\n",
			"static_response (in an earlier route with no matcher)"},
		{"later route blocks sort by matcher", ":18081 {\n\troute {\n\t\trespond 404\n\t}\n\troute /hooks {\n" + hook() + proxy + "\t}\n}\n", ""},
		{"route block, directive first", ":18081 {\n\troute {\n" + hook() + proxy + "\t}\n}\n", ""},
		{"route block, matched proxy first", ":18081 {\n\troute {\n\t\treverse_proxy /other/* 127.0.0.1:1\n" + hook() + proxy + "\t}\n}\n", ""},
		{"file_server pass_thru first", ":18081 {\n\troute {\n\t\tfile_server {\n\t\t\tpass_thru\n\t\t}\n" + hook() + proxy + "\t}\n}\n", ""},
		{"earlier handle, other path", ":18081 {\n\thandle /api/* {\n" + proxy + "\t}\n\thandle /hooks {\n" + hook() + proxy + "\t}\n}\n", ""},
		{"top level, written after", ":18081 {\n" + proxy + hook() + "}\n", ""},
		// A verification trial's false positives: what passes a request on.
		{"forward_auth first", ":18081 {\n\tforward_auth 127.0.0.1:1 {\n\t\turi /verify\n\t\tcopy_headers X-User\n\t}\n" + hook() + proxy + "}\n", ""},
		{"forward_auth, then handle blocks", ":18081 {\n\tforward_auth 127.0.0.1:1 {\n\t\turi /verify\n\t}\n\thandle /v1/* {\n" + hook() + proxy +
			"\t}\n\thandle {\n\t\trespond 404\n\t}\n}\n", ""},
		{"route block, forward_auth first", ":18081 {\n\troute {\n\t\tforward_auth 127.0.0.1:1 {\n\t\t\turi /verify\n\t\t}\n" + hook() + proxy + "\t}\n}\n", ""},
		{"route block, acme_server first", ":18081 {\n\troute {\n\t\tacme_server\n" + hook() + proxy + "\t}\n}\n", ""},
		{"route block, early hints first", ":18081 {\n\troute {\n\t\trespond 103\n" + hook() + proxy + "\t}\n}\n", ""},
		// Another trial's: a handle block that does not answer lets the
		// requests it matches skip the rest of its group, the catch-all too.
		{"fall-through handle, catch-all, then a route", ":18081 {\n\thandle /hooks/* {\n\t\trequest_header X-Hook 1\n\t}\n\thandle {\n\t\trespond 404\n\t}\n\troute {\n" +
			hook() + proxy + "\t}\n}\n", ""},
		{"route block, fall-through handle_path, catch-all", ":18081 {\n\troute {\n\t\thandle_path /hooks/* {\n\t\t\theader X-Hook 1\n\t\t}\n\t\thandle {\n\t\t\trespond 404\n\t\t}\n" +
			hook() + proxy + "\t}\n}\n", ""},
		{"answering handles, catch-all, then a route", ":18081 {\n\thandle /api/* {\n" + proxy + "\t}\n\thandle {\n\t\trespond 404\n\t}\n\troute /hooks/* {\n" +
			hook() + proxy + "\t}\n}\n", "static_response (in an earlier route with no matcher)"},
		// Its false negatives: a catch-all in a subroute answers first.
		{"catch-all handle before a route", ":18081 {\n\troute /hooks/* {\n" + hook() + proxy + "\t}\n\thandle {\n" + proxy + "\t}\n}\n",
			"reverse_proxy (in an earlier route with no matcher)"},
		{"route block, catch-all handle first", ":18081 {\n\troute {\n\t\thandle {\n\t\t\trespond 404\n\t\t}\n\t\thandle /hooks/* {\n" + hook() + proxy + "\t\t}\n\t}\n}\n",
			"static_response (in an earlier route with no matcher)"},
		{"route in route answers first", ":18081 {\n\troute {\n\t\troute {\n\t\t\trespond 404\n\t\t}\n" + hook() + proxy + "\t}\n}\n",
			"static_response"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			requireRefusedAtLoad(t, tc.site, tc.refused, "webhook_idempotency never runs: "+tc.refused, "put webhook_idempotency before it")
		})
	}
}

// The check's route tree in JSON's shapes (a trial's false positives and
// negatives): a group that lets requests past its catch-all, one shared
// with a subroute, and an empty matcher set, which matches everything.
func TestUnreachableGroups(t *testing.T) {
	vars := hnode{}
	answer := hnode{answers: "static_response"}
	ours := hnode{ours: true}
	check := func(routes []rnode) string { return unreachable(routes, "", sharedGroups(routes)) }
	require.Empty(t, check([]rnode{
		{group: "g", matched: true, handlers: []hnode{vars}},
		{group: "g", handlers: []hnode{answer}},
		{handlers: []hnode{ours}},
	}), "requests /hooks/* match the first route of g and skip its catch-all")
	require.Empty(t, check([]rnode{
		{group: "g", matched: true, handlers: []hnode{vars}},
		{handlers: []hnode{{routes: []rnode{{group: "g", handlers: []hnode{answer}}}}}},
		{handlers: []hnode{ours}},
	}), "group g matched outside the subroute skips the catch-all in it")
	require.Contains(t, check([]rnode{
		{group: "g", matched: true, handlers: []hnode{answer}},
		{group: "g", handlers: []hnode{answer}},
		{handlers: []hnode{ours}},
	}), "static_response (in an earlier route with no matcher)")
	require.False(t, hasMatcher(json.RawMessage(`[{}]`)))
	require.False(t, hasMatcher(json.RawMessage("[ {\n} ]")))
	require.True(t, hasMatcher(json.RawMessage(`[{"path":["/hooks/*"]}]`)))
}

// requireRefusedAtLoad validates a Caddyfile: it loads when refused is "",
// else it is refused with an error holding refused and each of says.
func requireRefusedAtLoad(t *testing.T, site, refused string, says ...string) {
	t.Helper()
	_, err := validateCaddyfile(t, site)
	if refused == "" {
		require.NoError(t, err)
		return
	}
	require.Error(t, err)
	for _, want := range append([]string{refused}, says...) {
		require.Contains(t, err.Error(), want)
	}
}
