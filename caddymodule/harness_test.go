package caddymodule

import (
	"bytes"
	"context"
	"crypto/rand"
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
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// The module's shared test harness: one in-process Caddy (startCaddy, with
// its two gateways: startOpsGateway, one PostgreSQL route and /metrics, and
// startGateway, one route per backend), one fake upstream for it
// (webhookUpstream), one Stripe signer (stripeHeader, stripeRequest), and
// the config checks (provisionHandler and provisionErr for one handler,
// validateCaddyfile for a whole config). The in-process Handler without
// Caddy is newGateway (handler_test.go) with its upstream next handler;
// async mode's provisioned Handler is newAsyncGateway, its slow ordered
// upstream legacyUpstream (async_test.go).

// gatewayBase is the address of the in-process Caddy's HTTP server.
const gatewayBase = "http://localhost:9080"

// caddyTestGlobals are the global options of every in-process Caddy test:
// caddytest's admin port, fixed HTTP ports, no trust store, no grace period.
const caddyTestGlobals = "\tskip_install_trust\n\tadmin localhost:2999\n\thttp_port 9080\n\thttps_port 9443\n\tgrace_period 1ns\n"

// startCaddy loads a Caddyfile into the process's Caddy (caddytest), whose
// global options block must begin with caddyTestGlobals. Caddy's config and
// ports are global: its tests do not run in parallel, and skip under -short.
func startCaddy(t *testing.T, caddyfile string) {
	t.Helper()
	if testing.Short() {
		t.Skip("in-process Caddy: skipped with -short")
	}
	caddytest.NewTester(t).InitServer(caddyfile, "caddyfile")
	require.False(t, t.Failed(), "caddy config did not load")
}

// webhookUpstream is the fake upstream behind an in-process Caddy. It counts
// forwarded deliveries and keeps their bodies by their X-Test-Event header,
// answers 200 JSON, or the status set for the event (answer) or for all
// (status), after delay, and can hold an event's forwards until released.
type webhookUpstream struct {
	*httptest.Server
	mu      sync.Mutex
	calls   map[string]int
	bodies  map[string][][]byte
	answers map[string]int
	gates   map[string]chan struct{}
	entered chan string  // receives each held event's ID as it waits
	status  atomic.Int32 // answer status of every event; 0 = 200
	delay   atomic.Int64 // nanoseconds to wait before answering
}

func newWebhookUpstream(t *testing.T) *webhookUpstream {
	u := &webhookUpstream{
		calls:   map[string]int{},
		bodies:  map[string][][]byte{},
		answers: map[string]int{},
		gates:   map[string]chan struct{}{},
		entered: make(chan string, 16),
	}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		id := r.Header.Get("X-Test-Event")
		u.mu.Lock()
		u.calls[id]++
		u.bodies[id] = append(u.bodies[id], body)
		st, gate := u.answers[id], u.gates[id]
		u.mu.Unlock()
		if gate != nil {
			u.entered <- id
			<-gate
		}
		if d := u.delay.Load(); d > 0 {
			time.Sleep(time.Duration(d))
		}
		if st == 0 {
			st = int(u.status.Load())
		}
		if st == 0 {
			st = http.StatusOK
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(st)
		_, _ = io.WriteString(w, `{"upstream":true}`)
	}))
	t.Cleanup(u.Close)
	return u
}

// count is how many times the event was forwarded.
func (u *webhookUpstream) count(id string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[id]
}

// answer makes the upstream answer the event's forwards with status.
func (u *webhookUpstream) answer(id string, status int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.answers[id] = status
}

// hold makes the forwards of id wait until the returned func is called.
func (u *webhookUpstream) hold(id string) (release func()) {
	gate := make(chan struct{})
	u.mu.Lock()
	u.gates[id] = gate
	u.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(gate) }) }
}

// provisionHandler provisions h as Caddy does (on a fresh SQLite file
// unless h names a storage), cleans it up, and returns Provision's error,
// else Validate's.
func provisionHandler(t testing.TB, h *Handler) error {
	t.Helper()
	if h.Storage == nil {
		h.Storage = &Storage{Backend: "sqlite", Path: filepath.Join(t.TempDir(), "events.db")}
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	err := h.Provision(ctx)
	cancel()
	_ = h.Cleanup()
	if err != nil {
		return err
	}
	return h.Validate()
}

// provisionErr is provisionHandler of a Handler parsed from a Caddyfile
// snippet, or the parser's error.
func provisionErr(t testing.TB, snippet string) error {
	t.Helper()
	h := new(Handler)
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(snippet)); err != nil {
		return err
	}
	return provisionHandler(t, h)
}

// validateCaddyfile adapts a whole Caddyfile and provisions it as
// `caddy validate` does (no listener, no admin endpoint), then cleans it up.
// The handler's log lines go to the returned logs (a named log: the default
// logger, which is process-wide, is left alone).
func validateCaddyfile(t *testing.T, body string) (logs string, err error) {
	t.Helper()
	dir := t.TempDir()
	logFile := filepath.Join(dir, "caddy.log")
	global := "{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n\tstorage file_system " + filepath.Join(dir, "data") +
		"\n\tlog gateway {\n\t\tinclude http.handlers.webhook_idempotency\n\t\toutput file " + logFile + "\n\t\tformat json\n\t\tlevel DEBUG\n\t}\n}\n"
	cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(global+body), map[string]any{"filename": "Caddyfile"})
	require.NoError(t, err, "adapting")
	var cfg caddy.Config
	require.NoError(t, json.Unmarshal(cfgJSON, &cfg))
	err = caddy.Validate(&cfg)
	b, _ := os.ReadFile(logFile)
	return string(b), err
}

// randomHex is n random bytes in hex: unique names, secrets and IDs.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// stripeSig is SIG-STRIPE's v1 value for body at ts (Unix seconds, as text).
func stripeSig(secret string, body []byte, ts string) string {
	return hexOf(mac256([]byte(secret), []byte(ts+"."), body))
}

// stripeHeader is a Stripe-Signature header with one v1 signature.
func stripeHeader(secret string, body []byte, ts int64) string {
	tsText := strconv.FormatInt(ts, 10)
	return "t=" + tsText + ",v1=" + stripeSig(secret, body, tsText)
}

// stripeRequest is a Stripe-signed POST of body to url, signed at ts, as
// Stripe sends one; webhookUpstream counts it under testID.
func stripeRequest(t *testing.T, url, secret string, body []byte, ts time.Time, testID string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Stripe-Signature", stripeHeader(secret, body, ts.Unix()))
	req.Header.Set("X-Test-Event", testID)
	return req
}

// ---- The in-process Caddy gateways, on startCaddy. ----

// opsConfig configures startOpsGateway.
type opsConfig struct {
	secrets []string
	extra   string // more lines of the webhook_idempotency block
	logFile string // when set, Caddy's default log is JSON in this file
}

// opsGateway is an in-process Caddy with one stripe route in front of an
// webhookUpstream, storing claims in a fresh PostgreSQL table, and a /metrics
// route.
type opsGateway struct {
	url   string // the webhook route
	scope string
	dsn   string
	table string
	up    *webhookUpstream
}

func startOpsGateway(t *testing.T, cfg opsConfig) *opsGateway {
	t.Helper()
	g := &opsGateway{
		url:   gatewayBase + "/hook",
		scope: "ops_" + randomHex(6),
		dsn:   pgDSN(t),
		table: "ops_" + randomHex(6),
		up:    newWebhookUpstream(t),
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, g.dsn)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, "DROP TABLE IF EXISTS "+g.table+", "+g.table+"_goose_version, "+g.table+"_secrets, "+g.table+"_secrets_goose_version")
	})
	var secrets, global strings.Builder
	for _, s := range cfg.secrets {
		fmt.Fprintf(&secrets, "\t\t\tsecret %q\n", s)
	}
	if cfg.logFile != "" {
		fmt.Fprintf(&global, "\tlog {\n\t\toutput file %q\n\t\tformat json\n\t\tlevel INFO\n\t}\n", cfg.logFile)
	}
	startCaddy(t, fmt.Sprintf(`{
`+caddyTestGlobals+`%[1]s}
http://localhost:9080 {
	handle /metrics {
		metrics
	}
	handle /hook {
		webhook_idempotency {
			provider stripe
%[2]s			scope %[3]s
			storage postgres %[4]q
			table %[5]s
			lease 2s
			%[6]s
		}
		reverse_proxy %[7]s
	}
}`, global.String(), secrets.String(), g.scope, g.dsn, g.table, cfg.extra, g.up.Listener.Addr().String()))
	return g
}

// store opens the gateway's table directly, as another gateway instance
// would: the tests use it to leave claims behind as a gateway that died.
func (g *opsGateway) store(t *testing.T) store.Store {
	t.Helper()
	s, err := postgres.New(t.Context(), postgres.Options{DSN: g.dsn, Table: g.table})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// stripeBody is a Stripe-shaped event body carrying extra in a field.
func stripeBody(id, extra string) []byte {
	return []byte(fmt.Sprintf(`{"id":%q,"object":"event","type":"payment_intent.succeeded","data":{"object":{"description":%q}}}`, id, extra))
}

// stripeDelivery builds a Stripe-signed delivery the way Stripe sends one.
func stripeDelivery(t *testing.T, url, secret, id string, ts time.Time) *http.Request {
	t.Helper()
	body := []byte(fmt.Sprintf("{\n  \"id\": %q,\n  \"object\": \"event\",\n  \"type\": \"payment_intent.succeeded\"\n}\n", id))
	return stripeRequest(t, url, secret, body, ts, id)
}

type result struct {
	status   int
	body     string
	replayed bool
	retry    string
}

func send(t *testing.T, req *http.Request) result {
	t.Helper()
	c := &http.Client{Timeout: 20 * time.Second}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed") == "true", resp.Header.Get("Retry-After")}
}

// startGateway loads a Caddy config with one route per backend, both in
// front of a new webhookUpstream with a new secret, and returns the secret,
// the upstream and the route URL of each backend. The routes have scopes of
// their own: one scope on two storages is refused at load.
func startGateway(t *testing.T, extra string) (secret string, up *webhookUpstream, routes map[string]string) {
	secret = "whsec_" + randomHex(16)
	up = newWebhookUpstream(t)
	dsn := pgDSN(t)
	table := "it_" + randomHex(6)
	t.Cleanup(func() { dropTable(dsn, table) })
	dbPath := filepath.Join(t.TempDir(), "events.db")
	startCaddy(t, fmt.Sprintf(`{
`+caddyTestGlobals+`}
http://localhost:9080 {
	handle /postgres/* {
		webhook_idempotency {
			provider stripe
			secret %[1]q
			storage postgres %[2]q
			table %[3]s
			scope stripe_pg
			%[5]s
		}
		reverse_proxy %[6]s
	}
	handle /sqlite/* {
		webhook_idempotency {
			provider stripe
			secret %[1]q
			storage sqlite %[4]q
			scope stripe_lite
			%[5]s
		}
		reverse_proxy %[6]s
	}
}`, secret, dsn, table, dbPath, extra, up.Listener.Addr().String()))
	return secret, up, map[string]string{"postgres": gatewayBase + "/postgres/hook", "sqlite": gatewayBase + "/sqlite/hook"}
}
