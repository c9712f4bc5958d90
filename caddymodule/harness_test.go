package caddymodule

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha1" //nolint:gosec // SIG-GH1 and SIG-TWILIO are HMAC-SHA1
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
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
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/cli"
	pgqueue "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue/postgres"
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

// countingUpstream is an upstream that reads each request's body, answers
// 200 and counts the requests.
func countingUpstream(t *testing.T) (*httptest.Server, *atomic.Int32) {
	forwards := new(atomic.Int32)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		forwards.Add(1)
	}))
	t.Cleanup(up.Close)
	return up, forwards
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
	t.Cleanup(func() { dropTable(g.dsn, g.table) })
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

// ---- The handler harness: a Handler on a real store with an upstream
// double as its next handler (newGateway). ----

// The harness of the handler tests: a real Handler provisioned from a
// Caddyfile snippet on a real store (SQLite in t.TempDir(), or a fresh table
// of the test PostgreSQL), called through ServeHTTP with an upstream double
// as next. No ports, so these tests run in parallel.

// upstreamCall is one request the upstream double received, exactly as the
// handler passed it on.
type upstreamCall struct {
	Method        string
	URL           string
	Proto         int
	Header        http.Header
	Body          []byte
	ContentLength int64
	// Deadline is the forward's context deadline (zero if none).
	Deadline time.Time
	// CtxErr is the forward context's error when the call returned.
	CtxErr error
	// Entered and Returned are when the call began and answered.
	Entered, Returned time.Time
}

// upstream is the next handler: it records every call and answers 200 "ok"
// (text/plain) unless respond says otherwise.
type upstream struct {
	mu    sync.Mutex
	calls []upstreamCall
	// respond answers call n (1-based); nil: 200 "ok".
	respond func(w http.ResponseWriter, r *http.Request, n int) error
	// entered receives the call number when a call begins, if not nil.
	entered chan int
}

func newUpstream() *upstream { return &upstream{} }

// ServeHTTP implements caddyhttp.Handler.
func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	c := upstreamCall{
		Method: r.Method, URL: r.URL.String(), Proto: r.ProtoMajor,
		Header: r.Header.Clone(), ContentLength: r.ContentLength, Entered: time.Now(),
	}
	if r.Body != nil {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return err
		}
		c.Body = b
	}
	if d, ok := r.Context().Deadline(); ok {
		c.Deadline = d
	}
	u.mu.Lock()
	u.calls = append(u.calls, c)
	n := len(u.calls)
	respond := u.respond
	u.mu.Unlock()
	if u.entered != nil {
		u.entered <- n
	}
	var err error
	if respond != nil {
		err = respond(w, r, n)
	} else {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "ok")
	}
	u.mu.Lock()
	u.calls[n-1].Returned = time.Now()
	u.calls[n-1].CtxErr = r.Context().Err()
	u.mu.Unlock()
	return err
}

// count is how many calls the upstream received.
func (u *upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.calls)
}

// call returns call i (0-based).
func (u *upstream) call(t testing.TB, i int) upstreamCall {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	require.Greater(t, len(u.calls), i, "upstream call %d", i+1)
	return u.calls[i]
}

// answerWith returns a respond func writing status, content type and body.
func answerWith(status int, contentType, body string) func(http.ResponseWriter, *http.Request, int) error {
	return func(w http.ResponseWriter, _ *http.Request, _ int) error {
		w.Header().Set("Content-Type", contentType)
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
		return nil
	}
}

// blockUntilDone is an upstream that never answers on its own: it waits for
// the forward's context to end (forward_timeout) or for 30s, and then fails
// the way reverse_proxy does, without writing a response.
func blockUntilDone(w http.ResponseWriter, r *http.Request, _ int) error {
	select {
	case <-r.Context().Done():
		return caddyhttp.Error(http.StatusGatewayTimeout, r.Context().Err())
	case <-time.After(30 * time.Second):
		w.WriteHeader(http.StatusOK)
		return nil
	}
}

// gateway is one provisioned Handler with its upstream, logs and clock.
type gateway struct {
	t    testing.TB
	h    *Handler
	up   *upstream
	logs *observer.ObservedLogs
	// storage is the store configuration, to open a second gateway on it.
	storage Storage
	clock   *testClock
	// family is every gateway on this store (sharingStore), whose
	// completions a read of the store waits for.
	family *gatewayFamily
}

// gatewayFamily is the handlers sharing one store in a test.
type gatewayFamily struct {
	mu       sync.Mutex
	handlers []*Handler
}

// settled waits for the completions every handler of the family is still
// writing after its answers (settle.go), as a reader of the store after
// the deliveries' answers must.
func (f *gatewayFamily) settled() {
	f.mu.Lock()
	hs := slices.Clone(f.handlers)
	f.mu.Unlock()
	for _, h := range hs {
		if h.claims != nil {
			h.claims.Settled()
		}
	}
}

// testClock is the verifier's clock: NOW of CASES.md, moved by the test.
type testClock struct{ ns atomic.Int64 }

func newTestClock(t time.Time) *testClock {
	c := &testClock{}
	c.ns.Store(t.UnixNano())
	return c
}

func (c *testClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *testClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// NOW is the clock in Unix seconds.
func (c *testClock) Unix() int64 { return c.Now().Unix() }

type gatewayOptions struct {
	postgres bool
	dsnExtra string // appended to the DSN: a distinct pool, as another instance
	password string // set as the DSN's password (the test server trusts local connections)
	via      string // host:port the DSN names instead of the server's (a relay)
	shared   *gateway
	clock    *testClock
	up       *upstream
}

type gatewayOption func(*gatewayOptions)

// onPostgres stores claims in a fresh table of the test PostgreSQL, dropped
// when the test ends.
func onPostgres() gatewayOption { return func(o *gatewayOptions) { o.postgres = true } }

// sharingStore opens the same store as g (another route, or with
// asInstance, another gateway instance), with the same clock and upstream
// unless given.
func sharingStore(g *gateway) gatewayOption { return func(o *gatewayOptions) { o.shared = g } }

// asInstance makes a Postgres gateway open its own connection pool and
// cache, as a second gateway process on the same database would.
func asInstance(name string) gatewayOption {
	return func(o *gatewayOptions) { o.dsnExtra = "&application_name=" + name }
}

// withDSNPassword puts password in the PostgreSQL DSN, to check it never
// surfaces.
func withDSNPassword(password string) gatewayOption {
	return func(o *gatewayOptions) { o.password = password }
}

// through makes a Postgres gateway reach the server through addr (an
// e2e.Link the test cuts and restores).
func through(addr string) gatewayOption { return func(o *gatewayOptions) { o.via = addr } }

func withClock(c *testClock) gatewayOption   { return func(o *gatewayOptions) { o.clock = c } }
func withUpstream(u *upstream) gatewayOption { return func(o *gatewayOptions) { o.up = u } }

// newGateway provisions a Handler from a webhook_idempotency Caddyfile block
// (without storage: the harness adds it), validates it, and cleans it up
// when the test ends.
func newGateway(t testing.TB, caddyfileSnippet string, opts ...gatewayOption) *gateway {
	t.Helper()
	var o gatewayOptions
	for _, opt := range opts {
		opt(&o)
	}
	g := &gateway{t: t, up: o.up, clock: o.clock, family: new(gatewayFamily)}
	if o.shared != nil {
		if o.shared.family != nil { // nil: a gateway not made here
			g.family = o.shared.family
		}
		g.storage = o.shared.storage
		if o.dsnExtra != "" {
			g.storage.DSN += o.dsnExtra
		}
		if g.clock == nil {
			g.clock = o.shared.clock
		}
		if g.up == nil {
			g.up = o.shared.up
		}
	} else if o.postgres {
		dsn := pgDSN(t)
		table := "ct_" + randomHex(8)
		g.storage = Storage{Backend: "postgres", DSN: dsn + o.dsnExtra, Table: table}
		if o.password != "" {
			u, err := url.Parse(g.storage.DSN)
			require.NoError(t, err)
			u.User = url.UserPassword(u.User.Username(), o.password)
			g.storage.DSN = u.String()
		}
		if o.via != "" {
			u, err := url.Parse(g.storage.DSN)
			require.NoError(t, err)
			u.Host = o.via
			g.storage.DSN = u.String()
		}
		t.Cleanup(func() { dropTable(dsn, table) })
	} else {
		g.storage = Storage{Backend: "sqlite", Path: filepath.Join(t.TempDir(), "events.db")}
	}
	if g.up == nil {
		g.up = newUpstream()
	}
	if g.clock == nil {
		g.clock = newTestClock(time.Now())
	}

	h := new(Handler)
	d := caddyfile.NewTestDispenser(caddyfileSnippet)
	require.NoError(t, h.UnmarshalCaddyfile(d), "Caddyfile")
	st := g.storage
	h.Storage = &st
	h.now = g.clock.Now

	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	err := h.Provision(ctx)
	// One cleanup, in order: end the config's context (the sweeper stops),
	// then Cleanup (waits for it, releases the pooled store).
	t.Cleanup(func() {
		cancel()
		_ = h.Cleanup()
	})
	require.NoError(t, err, "Provision")
	require.NoError(t, h.Validate(), "Validate")

	core, logs := observer.New(zapcore.DebugLevel)
	h.logger = zap.New(core)
	g.h, g.logs = h, logs
	g.family.mu.Lock()
	g.family.handlers = append(g.family.handlers, h)
	g.family.mu.Unlock()
	return g
}

// answer is what the provider got back.
type answer struct {
	status int
	header http.Header
	body   []byte
	// err is what ServeHTTP returned (Caddy turns it into the status).
	err error
}

// writeTracker notes whether a status line was written at all.
type writeTracker struct {
	*httptest.ResponseRecorder
	wrote bool
}

func (w *writeTracker) WriteHeader(code int) {
	w.wrote = true
	w.ResponseRecorder.WriteHeader(code)
}

func (w *writeTracker) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseRecorder.Write(b)
}

// serve runs one delivery through the handler. When the handler wrote
// nothing and returned a caddyhttp.HandlerError, the status is the error's,
// as Caddy's error handling would answer.
func (g *gateway) serve(req *http.Request) answer {
	g.t.Helper()
	rec := &writeTracker{ResponseRecorder: httptest.NewRecorder()}
	err := g.h.ServeHTTP(rec, req, g.up)
	a := answer{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes(), err: err}
	if !rec.wrote {
		a.status = 0
		var he caddyhttp.HandlerError
		if errors.As(err, &he) {
			a.status = he.StatusCode
		}
	}
	return a
}

// row returns the stored event, or store.ErrNotFound.
// It first waits for the completions the handler writes after its answers
// (settle.go), as a caller that reads the store after a delivery's answer
// must.
func (g *gateway) row(scope, id string) (store.Event, error) {
	g.family.settled()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return g.h.backend.Get(ctx, scope, id)
}

// requireRow asserts the event is stored in state.
func (g *gateway) requireRow(scope, id string, state store.State) store.Event {
	g.t.Helper()
	e, err := g.row(scope, id)
	require.NoError(g.t, err, "row (%s, %q)", scope, id)
	require.Equal(g.t, state, e.State, "state of (%s, %q)", scope, id)
	return e
}

// requireNoRow asserts nothing is stored for the event.
func (g *gateway) requireNoRow(scope, id string) {
	g.t.Helper()
	_, err := g.row(scope, id)
	require.ErrorIs(g.t, err, store.ErrNotFound, "no row for (%s, %q)", scope, id)
}

// rows lists every row of the gateway's store (each test has its own).
func (g *gateway) rows() []store.Event {
	g.t.Helper()
	g.family.settled()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	evs, err := g.h.backend.List(ctx, store.ListQuery{Limit: 1000})
	require.NoError(g.t, err)
	return evs
}

// requireForwarded asserts the upstream's call i got exactly these bytes,
// with the Content-Type and a Content-Length equal to the body's length.
func (g *gateway) requireForwarded(i int, body []byte, contentType string) upstreamCall {
	g.t.Helper()
	c := g.up.call(g.t, i)
	require.Equal(g.t, http.MethodPost, c.Method)
	require.Equal(g.t, body, c.Body, "upstream got the bytes as sent")
	require.Equal(g.t, int64(len(body)), c.ContentLength, "Content-Length")
	require.Equal(g.t, contentType, c.Header.Get("Content-Type"))
	return c
}

// requireDuplicate asserts the edge's duplicate answer.
func requireDuplicate(t *testing.T, a answer) {
	t.Helper()
	require.Equal(t, http.StatusOK, a.status, "body %s", a.body)
	require.Equal(t, "true", a.header.Get("Idempotent-Replayed"))
	require.JSONEq(t, `{"received":true,"duplicate":true}`, string(a.body))
}

// requireRefused asserts a JSON error answer with status whose reason
// contains want.
func requireRefused(t *testing.T, a answer, status int, want string) {
	t.Helper()
	require.Equal(t, status, a.status, "body %s", a.body)
	require.Equal(t, "application/json", a.header.Get("Content-Type"))
	require.Contains(t, string(a.body), `"error"`)
	require.Contains(t, string(a.body), want)
	require.Empty(t, a.header.Get("Idempotent-Replayed"))
}

// requireRelayed asserts the upstream's default answer reached the caller.
func requireRelayed(t *testing.T, a answer) {
	t.Helper()
	require.Equal(t, http.StatusOK, a.status, "body %s", a.body)
	require.Equal(t, "ok", string(a.body))
	require.Equal(t, "text/plain", a.header.Get("Content-Type"))
	require.Empty(t, a.header.Get("Idempotent-Replayed"))
	require.NoError(t, a.err)
}

// logged returns the log entries whose message contains msg.
func (g *gateway) logged(msg string) []observer.LoggedEntry {
	return g.logs.FilterMessageSnippet(msg).All()
}

// deliveryLog returns the per-delivery log lines.
func (g *gateway) deliveryLog() []map[string]any {
	var out []map[string]any
	for _, e := range g.logs.FilterMessage("delivery").All() {
		out = append(out, e.ContextMap())
	}
	return out
}

// newDelivery builds a POST request carrying a caddy.Replacer, as Caddy's
// server does. headers are set as given, in order (Add, so a name given
// twice is sent on two lines).
func newDelivery(target string, body []byte, headers ...string) *http.Request {
	if len(headers)%2 != 0 {
		panic("newDelivery: headers come in name, value pairs")
	}
	req := httptest.NewRequest(http.MethodPost, target, bytes.NewReader(body))
	for i := 0; i < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	return withReplacer(req)
}

func withReplacer(req *http.Request) *http.Request {
	repl := caddy.NewReplacer()
	ctx := context.WithValue(req.Context(), caddy.ReplacerCtxKey, repl)
	return req.WithContext(ctx)
}

// counterValue reads a counter of the package's metrics.
func counterValue(t testing.TB, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

// outcomes returns the deliveries counter of an outcome for the gateway's
// scope and provider.
func (g *gateway) outcomes(outcome string) float64 {
	g.t.Helper()
	return counterValue(g.t, metrics.deliveries.WithLabelValues(g.h.Scope, g.h.Provider, outcome))
}

// uniqueScope is a scope name no other test uses, so per-scope metrics are
// this test's own.
func uniqueScope(name string) string { return name + "_" + randomHex(4) }

var (
	pgOnce sync.Once
	pgErr  error
)

// pgDSN returns TEST_DATABASE_URL (or the local default) once the server
// answers; an unreachable server fails the test, or skips it under -short.
func pgDSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv("TEST_DATABASE_URL")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	pgOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			pgErr = err
			return
		}
		pgErr = conn.Ping(ctx)
		_ = conn.Close(ctx)
	})
	if pgErr != nil {
		if testing.Short() {
			t.Skipf("PostgreSQL unreachable, skipped under -short: %v", pgErr)
		}
		t.Fatalf("PostgreSQL unreachable (set TEST_DATABASE_URL): %v", pgErr)
	}
	if !strings.Contains(dsn, "?") {
		dsn += "?"
	}
	return dsn
}

// dropTable drops a test table and everything the store and the queue made
// next to it.
func dropTable(dsn, table string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tbl, err := store.ParseTable(table)
	if err != nil {
		return
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	_ = pgqueue.Drop(ctx, conn, tbl)
}

// eachBackend runs f once on SQLite and once on PostgreSQL.
func eachBackend(t *testing.T, f func(t *testing.T, backend gatewayOption)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		f(t, func(*gatewayOptions) {})
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		f(t, onPostgres())
	})
}

// TestHarness checks the harness itself: a delivery is forwarded with the
// request unchanged, its row completed, a duplicate answered at the edge.
func TestHarness(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, backend gatewayOption) {
		g := newGateway(t, `webhook_idempotency {
			provider stripe
			secret whsec_harness
		}`, backend)
		body := []byte(`{"id":"evt_harness","object":"event"}`)
		req := g.stripe("whsec_harness", body, g.clock.Unix())
		a := g.serve(req)
		requireRelayed(t, a)
		require.Equal(t, 1, g.up.count())
		c := g.requireForwarded(0, body, "application/json")
		require.NotEmpty(t, c.Header.Get("Stripe-Signature"))
		require.False(t, c.Deadline.IsZero(), "the forward is bounded by forward_timeout")
		e := g.requireRow("stripe", "evt_harness", store.StateCompleted)
		require.Equal(t, 200, e.Status)
		require.Equal(t, 1, e.Attempts)

		requireDuplicate(t, g.serve(g.stripe("whsec_harness", body, g.clock.Unix())))
		require.Equal(t, 1, g.up.count())
		require.Len(t, g.rows(), 1)
		require.Len(t, g.deliveryLog(), 2)
	})
}

// Signing recipes of CASES.md, computed here from the recipe rather than
// with the signature package, so the tests are an independent oracle.

func mac256(key []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

func mac1(key []byte, parts ...[]byte) []byte {
	m := hmac.New(sha1.New, key) //nolint:gosec // the legacy recipes (SIG-GH1, SIG-TWILIO) are HMAC-SHA1
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

func hexOf(b []byte) string { return hex.EncodeToString(b) }
func b64Of(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// stripe builds a SIG-STRIPE delivery of body signed at ts.
func (g *gateway) stripe(secret string, body []byte, ts int64, headers ...string) *http.Request {
	h := append([]string{"Content-Type", "application/json", "Stripe-Signature", stripeHeader(secret, body, ts)}, headers...)
	return newDelivery("http://gateway.test/webhooks/stripe", body, h...)
}

// signedFor builds a delivery of body signed for provider with secret, as
// the sign CLI would (buildDelivery), to http://gateway.test/<provider>.
func signedFor(t *testing.T, provider, secret, body string) *http.Request {
	t.Helper()
	d, err := cli.BuildDelivery(cli.SignParams{Provider: provider, Secret: secret, Body: []byte(body)})
	require.NoError(t, err)
	req := newDelivery("http://gateway.test/"+provider, d.Body)
	req.Header = d.Header
	return req
}

// githubDelivery builds a SIG-GH256 delivery.
func githubDelivery(secret string, body []byte, guid string, headers ...string) *http.Request {
	h := append([]string{
		"Content-Type", "application/json",
		"X-GitHub-Event", "push",
		"X-GitHub-Delivery", guid,
		"X-Hub-Signature-256", "sha256=" + hexOf(mac256([]byte(secret), body)),
	}, headers...)
	return newDelivery("http://gateway.test/webhooks/github", body, h...)
}

// slackHeaders are SIG-SLACK's two headers for body at ts.
func slackHeaders(secret string, body []byte, ts int64) []string {
	tsText := strconv.FormatInt(ts, 10)
	return []string{
		"X-Slack-Request-Timestamp", tsText,
		"X-Slack-Signature", "v0=" + hexOf(mac256([]byte(secret), []byte("v0:"+tsText+":"), body)),
	}
}

// swKey is the HMAC key of a Standard Webhooks whsec_ secret.
func swKey(t testing.TB, secret string) []byte {
	t.Helper()
	k, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	require.NoError(t, err)
	return k
}

// swSig is SIG-SW's signature for (id, ts, body) under key.
func swSig(key []byte, id string, ts int64, body []byte) string {
	return b64Of(mac256(key, []byte(id+"."+strconv.FormatInt(ts, 10)+"."), body))
}

// gzipped compresses b.
func gzipped(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, err := zw.Write(b)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return buf.Bytes()
}

// requireBoundedAlloc asserts that refusing an oversized body allocated a
// few times max_body at most (the decoded buffer grows by doubling): never
// in proportion to what the sender claims. The race detector's runtime does
// not elide bytes.Buffer's append-make copy, which doubles the figure.
func requireBoundedAlloc(t testing.TB, allocated uint64, maxBody int64) {
	t.Helper()
	limit := uint64(5 * maxBody)
	if raceEnabled() {
		limit *= 2
	}
	t.Logf("allocated %d MiB (limit %d MiB) refusing a body over max_body %d MiB", allocated>>20, limit>>20, maxBody>>20)
	require.Less(t, allocated, limit, "memory bounded by a few times max_body")
}

// raceEnabled reports whether the test binary was built with -race.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}
