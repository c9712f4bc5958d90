package caddymodule

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zapcore"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// TestBodyBudgetCaddyfile: body_budget parses as a size, once; its default
// is 1 GiB, or twice max_body plus 64 KiB when that is larger; below that
// the config is refused with what to write instead (equal to max_body, a
// gzip delivery of max_body was refused 503 on every try); a negative JSON
// value is refused.
func TestBodyBudgetCaddyfile(t *testing.T) {
	t.Parallel()
	parse := func(t *testing.T, lines string) (*Handler, error) {
		t.Helper()
		h := new(Handler)
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("webhook_idempotency {\nprovider github\nsecret s\n" + lines + "}"))
		return h, err
	}

	h, err := parse(t, "body_budget 512MiB\n")
	require.NoError(t, err)
	require.Equal(t, int64(512<<20), h.BodyBudget)
	require.NoError(t, h.prepareConfig())
	require.Equal(t, int64(512<<20), h.BodyBudget)

	_, err = parse(t, "body_budget lots\n")
	require.ErrorContains(t, err, `body_budget: invalid size "lots"`)
	require.ErrorContains(t, err, "Testfile:")
	_, err = parse(t, "body_budget 1MiB 2MiB\n")
	require.ErrorContains(t, err, "wrong argument count")
	_, err = parse(t, "body_budget 4MiB\nbody_budget 8MiB\n")
	require.ErrorContains(t, err, "body_budget already specified")

	h, err = parse(t, "")
	require.NoError(t, err)
	require.NoError(t, h.prepareConfig())
	require.Equal(t, int64(1<<30), h.BodyBudget, "default 1 GiB")
	h, err = parse(t, "max_body 2GiB\n")
	require.NoError(t, err)
	require.NoError(t, h.prepareConfig())
	require.Equal(t, int64(4<<30+64<<10), h.BodyBudget, "a max_body over 512 MiB raises the default to twice it and 64 KiB")

	h, err = parse(t, "max_body 2MiB\nbody_budget 4160KiB\n")
	require.NoError(t, err)
	require.NoError(t, h.prepareConfig(), "twice max_body and 64 KiB is enough")
	for _, budget := range []string{"2MiB", "4MiB"} {
		h, err = parse(t, "max_body 2MiB\nbody_budget "+budget+"\n")
		require.NoError(t, err)
		require.ErrorContains(t, h.prepareConfig(), "write body_budget 4160KiB or more", budget)
	}

	h, err = parse(t, "max_body 2MiB\nbody_budget 1MiB\n")
	require.NoError(t, err, "a rule on values, not syntax")
	err = h.prepareConfig()
	require.EqualError(t, err, `body_budget: 1048576 bytes (1MiB) is less than twice max_body (2097152 bytes (2MiB)) and 64 KiB, what one gzip delivery of max_body holds (its compressed and its decoded bytes), so such a delivery would be answered 503 every time; write body_budget 4160KiB or more (JSON "body_budget": 4259840), or lower max_body`)

	// github's default max_body is 25 MiB.
	h, err = parse(t, "body_budget 20MB\n")
	require.NoError(t, err)
	require.ErrorContains(t, h.prepareConfig(), "write body_budget 51264KiB or more")

	h = &Handler{Provider: "stripe", Secrets: []string{"whsec_x"}, BodyBudget: -1}
	require.EqualError(t, h.prepareConfig(), "body_budget: must be positive")
	// A max_body no Caddyfile accepts (JSON) does not overflow the check.
	h = &Handler{Provider: "stripe", Secrets: []string{"whsec_x"}, MaxBody: 1 << 62, BodyBudget: 1 << 20}
	require.ErrorContains(t, h.prepareConfig(), "body_budget: 1048576 bytes (1MiB) is less than twice max_body")
	require.ErrorContains(t, provisionErr(t, "webhook_idempotency {\nprovider stripe\nsecret whsec_x\nmax_body 5MB\nbody_budget 4MB\n}"),
		"body_budget: 4000000 bytes is less than twice max_body (5000000 bytes)")
}

// heldBytes is the scope's body_budget_held_bytes.
func heldBytes(t *testing.T, scope string) float64 {
	t.Helper()
	return gaugeValue(t, metrics.budgetHeld.WithLabelValues(scope))
}

// budgetAnswer is what one raw connection got back.
type budgetAnswer struct {
	i      int
	status int
	retry  string
	ctype  string
	body   string
	err    error
}

// announced is a delivery whose headers were sent, its body not yet.
type announced struct {
	c    net.Conn
	size int
}

// announce opens a connection to the in-process Caddy and sends a POST's
// headers announcing size bytes, without the body; its answer, whenever
// it comes, is sent on answers with index i.
func announce(t *testing.T, path, headers string, size, i int, answers chan<- budgetAnswer) *announced {
	t.Helper()
	c, err := net.DialTimeout("tcp", "127.0.0.1:9080", 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(60*time.Second)))
	_, err = fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: localhost:9080\r\nContent-Length: %d\r\n%s\r\n", path, size, headers)
	require.NoError(t, err)
	go func() {
		a := budgetAnswer{i: i}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			a.err = err
			answers <- a
			return
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		a.status, a.retry, a.ctype, a.body = resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("Content-Type"), string(b)
		answers <- a
	}()
	return &announced{c: c, size: size}
}

// budgetCase is one route of TestBodyBudget: a provider that spills
// (github) or keeps bodies in memory (stripe).
type budgetCase struct {
	provider string
	spills   bool
	// unsigned is the header lines of delivery i with a zero signature;
	// body a body of exactly n bytes; signed a correctly signed request
	// of body.
	unsigned func(i int) string
	body     func(n int) []byte
	signed   func(t *testing.T, secret string, body []byte) *http.Request
}

// TestBodyBudget is the reproduction of the unbounded-body fault, scaled
// down: a real Caddy route with max_body 2 MiB and body_budget 4160 KiB gets
// six unsigned deliveries announcing 2 MiB each, all at once. Two are read
// (two temporary files on the route that spills) and refused for their
// signature; the four beyond the budget are answered 503 with Retry-After:
// 1 before a byte of their body is read, nothing claimed, the upstream
// never called, counted in body_budget_refused_total. Once they are
// answered the held bytes are back to 0, and a signed delivery of max_body
// is forwarded once.
func TestBodyBudget(t *testing.T) {
	for _, c := range []budgetCase{
		{
			provider: "github", spills: true,
			unsigned: func(i int) string {
				return fmt.Sprintf("Content-Type: application/json\r\nX-GitHub-Event: push\r\nX-GitHub-Delivery: flood-%d\r\nX-Hub-Signature-256: sha256=%s\r\n", i, strings.Repeat("0", 64))
			},
			body: bigPush,
			signed: func(t *testing.T, secret string, body []byte) *http.Request {
				req := githubDelivery(secret, body, "signed-1")
				return httpRequest(t, req)
			},
		},
		{
			provider: "stripe",
			unsigned: func(int) string {
				return fmt.Sprintf("Content-Type: application/json\r\nStripe-Signature: t=%d,v1=%s\r\n", time.Now().Unix(), strings.Repeat("0", 64))
			},
			body: func(n int) []byte {
				return stripeBody("evt_budget", strings.Repeat("x", n-len(stripeBody("evt_budget", ""))))
			},
			signed: func(t *testing.T, secret string, body []byte) *http.Request {
				return stripeRequest(t, gatewayBase+"/hook", secret, body, time.Now(), "evt_budget")
			},
		},
	} {
		t.Run(c.provider, func(t *testing.T) { testBodyBudget(t, c) })
	}
}

// httpRequest turns a handler-test request into one a client sends to the
// in-process Caddy's route.
func httpRequest(t *testing.T, r *http.Request) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, gatewayBase+"/hook", r.Body)
	require.NoError(t, err)
	req.ContentLength = r.ContentLength
	req.Header = r.Header
	return req
}

func testBodyBudget(t *testing.T, c budgetCase) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	secret := "whsec_" + randomHex(8)
	up, forwards := countingUpstream(t)
	dsn := pgDSN(t)
	table := "budget_" + randomHex(6)
	t.Cleanup(func() { dropTable(dsn, table) })
	scope := uniqueScope("budget_" + c.provider)
	startCaddy(t, fmt.Sprintf(`{
`+caddyTestGlobals+`}
http://localhost:9080 {
	handle /hook {
		webhook_idempotency {
			provider %s
			secret %q
			storage postgres %q
			table %s
			scope %s
			spool off
			max_body 2MiB
			body_budget 4160KiB
			read_timeout 30s
		}
		reverse_proxy %s
	}
}`, c.provider, secret, dsn, table, scope, up.Listener.Addr().String()))
	refusedBefore := counterValue(t, metrics.budgetRefuse.WithLabelValues(scope))

	const n, size = 6, 2 << 20
	answers := make(chan budgetAnswer, n)
	held := make([]*announced, n)
	for i := range held {
		held[i] = announce(t, "/hook", c.unsigned(i), size, i, answers)
	}

	// Four answered at once, without their bodies.
	answered := map[int]bool{}
	for range n - 2 {
		select {
		case a := <-answers:
			require.NoError(t, a.err)
			require.Equal(t, http.StatusServiceUnavailable, a.status, a.body)
			require.Equal(t, "1", a.retry)
			require.Equal(t, "application/json", a.ctype)
			require.JSONEq(t, `{"error":"body budget spent; retry later"}`, a.body)
			answered[a.i] = true
		case <-time.After(20 * time.Second):
			t.Fatalf("only %d deliveries were answered before their bodies; want %d", len(answered), n-2)
		}
	}
	select {
	case a := <-answers:
		t.Fatalf("a fifth delivery was answered before its body: %+v", a)
	case <-time.After(300 * time.Millisecond):
	}
	require.Equal(t, float64(4<<20), heldBytes(t, scope), "the two read hold all but 64 KiB of the budget")
	files := spilledFiles(t, tmp)
	if c.spills {
		require.Len(t, files, 2, "one temporary file per delivery read, none for those refused")
	} else {
		require.Empty(t, files)
	}
	t.Logf("%s: %d deliveries of %d bytes announced at once: %d answered 503 unread, %d held (%d temporary files, %.0f bytes held)",
		c.provider, n, size, len(answered), n-len(answered), len(files), heldBytes(t, scope))

	// The two read get their bodies and are refused for the signature.
	body := c.body(size)
	require.Len(t, body, size)
	for i, h := range held {
		if answered[i] {
			continue
		}
		go func() { _, _ = h.c.Write(body) }()
	}
	for range 2 {
		select {
		case a := <-answers:
			require.NoError(t, a.err)
			require.False(t, answered[a.i])
			require.Equal(t, http.StatusBadRequest, a.status, a.body)
			require.Contains(t, a.body, "no matching signature")
		case <-time.After(20 * time.Second):
			t.Fatal("a delivery read in full was not answered")
		}
	}
	require.Eventually(t, func() bool { return heldBytes(t, scope) == 0 }, 5*time.Second, 10*time.Millisecond,
		"every byte reserved is returned once the requests end")
	requireNoSpill(t, tmp)
	require.Equal(t, float64(n-2), counterValue(t, metrics.budgetRefuse.WithLabelValues(scope))-refusedBefore)
	require.Equal(t, float64(n-2), counterValue(t, metrics.deliveries.WithLabelValues(scope, c.provider, outcomeBodyBudget)))
	require.Zero(t, forwards.Load(), "nothing forwarded")
	s, err := postgres.New(t.Context(), postgres.Options{DSN: dsn, Table: table})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	rows, err := s.List(ctx, store.ListQuery{Limit: 10})
	require.NoError(t, err)
	require.Empty(t, rows, "nothing claimed")

	// The whole budget is back: a signed delivery of max_body goes through, once.
	signedBody := c.body(size)
	res := send(t, c.signed(t, secret, signedBody))
	require.Equal(t, http.StatusOK, res.status, res.body)
	require.False(t, res.replayed)
	require.Equal(t, int32(1), forwards.Load(), "forwarded once")
	res = send(t, c.signed(t, secret, signedBody))
	require.Equal(t, http.StatusOK, res.status, res.body)
	require.True(t, res.replayed, "its redelivery is a duplicate")
	require.Equal(t, int32(1), forwards.Load())
	require.Eventually(t, func() bool { return heldBytes(t, scope) == 0 }, 5*time.Second, 10*time.Millisecond)
	requireNoSpill(t, tmp)
}

// TestBodyBudgetUnknownLength: in-process, on an in-memory route (stripe,
// max_body 2 MiB, body_budget 4160 KiB, the least max_body allows). A body of unknown length (chunked)
// reserves 64 KiB at a time as it arrives, and is refused 503 (Retry-After:
// 1, the connection closed) once the budget is spent, mid-body; a gzip
// body's decoded bytes are reserved too, so a small compressed body that
// decodes to max_body is refused while the budget is held and read when it
// is free; and whatever ends a request (a refusal, a panic of the next
// handler) returns its bytes: the count is 0 at the end.
func TestBodyBudgetUnknownLength(t *testing.T) {
	t.Parallel()
	const secret = "whsec_budget"
	g := newGateway(t, "webhook_idempotency {\nprovider stripe\nsecret "+secret+"\nscope "+uniqueScope("budget")+"\nmax_body 2MiB\nbody_budget 4160KiB\n}")
	held := func() int64 { return g.h.budget.held.Load() }
	unsigned := func(body io.Reader, length int64, headers ...string) *http.Request {
		req := newDelivery("http://gateway.test/webhooks/stripe", nil, append([]string{"Content-Type", "application/json",
			"Stripe-Signature", fmt.Sprintf("t=%d,v1=%s", g.clock.Unix(), strings.Repeat("0", 64))}, headers...)...)
		req.Body, req.ContentLength = io.NopCloser(body), length
		return req
	}
	serve := func(req *http.Request) <-chan answer {
		ch := make(chan answer, 1)
		go func() { ch <- g.serve(req) }()
		return ch
	}
	wait := func(ch <-chan answer) answer {
		t.Helper()
		select {
		case a := <-ch:
			return a
		case <-time.After(20 * time.Second):
			t.Fatal("no answer")
			return answer{}
		}
	}
	requireHeld := func(want int64) {
		t.Helper()
		require.Eventually(t, func() bool { return held() == want }, 5*time.Second, time.Millisecond,
			"held %d, want %d", held(), want)
	}
	requireBudgetRefusal := func(a answer) {
		t.Helper()
		requireRefused(t, a, http.StatusServiceUnavailable, "body budget spent; retry later")
		require.Equal(t, "1", a.header.Get("Retry-After"))
	}
	body := stripeBody("evt_unsigned", strings.Repeat("x", 2<<20-len(stripeBody("evt_unsigned", ""))))

	// A announces max_body and holds it before sending a byte.
	ar, aw := io.Pipe()
	aDone := serve(unsigned(ar, 2<<20))
	requireHeld(2 << 20)

	// B, chunked, has sent 1 MiB: 16 chunks, and the next reserved while
	// it waits for more.
	br, bw := io.Pipe()
	bDone := serve(unsigned(br, -1))
	_, err := bw.Write(body[:1<<20])
	require.NoError(t, err)
	requireHeld(3<<20 + budgetChunk)

	// C, chunked, gets the 960 KiB left and is refused at the next chunk.
	cr, cw := io.Pipe()
	cDone := serve(unsigned(cr, -1))
	go func() { _, _ = cw.Write(body) }()
	requireBudgetRefusal(wait(cDone))
	_ = cw.CloseWithError(io.ErrClosedPipe)
	requireHeld(3<<20 + budgetChunk)

	// B ends: refused for its signature, its bytes returned.
	go func() { _, _ = bw.Write(body[1<<20:]); _ = bw.Close() }()
	requireRefused(t, wait(bDone), http.StatusBadRequest, "no matching signature")
	requireHeld(2 << 20)

	// D: 2 MiB that compress to a few KiB, decoded while A holds 2 MiB and
	// E 128 KiB: the decoded bytes do not fit.
	er, ew := io.Pipe()
	eDone := serve(unsigned(er, 128<<10))
	requireHeld(2<<20 + 128<<10)
	zipped := gzipped(t, body)
	require.Less(t, len(zipped), 64<<10)
	requireBudgetRefusal(g.serve(unsigned(bytes.NewReader(zipped), int64(len(zipped)), "Content-Encoding", "gzip")))
	requireHeld(2<<20 + 128<<10)

	// A and E end; then D fits, alone in the smallest budget max_body
	// allows, and is refused for its signature.
	go func() { _, _ = aw.Write(body); _ = aw.Close() }()
	go func() { _, _ = ew.Write(body[:128<<10]); _ = ew.Close() }()
	requireRefused(t, wait(aDone), http.StatusBadRequest, "no matching signature")
	requireRefused(t, wait(eDone), http.StatusBadRequest, "no matching signature")
	requireHeld(0)
	requireRefused(t, g.serve(unsigned(bytes.NewReader(zipped), int64(len(zipped)), "Content-Encoding", "gzip")),
		http.StatusBadRequest, "no matching signature")
	requireHeld(0)
	require.Equal(t, 2.0, g.outcomes(outcomeBodyBudget))
	warned := g.logged("body_budget spent")
	require.NotEmpty(t, warned)
	var counted int64
	for _, e := range warned {
		require.Equal(t, zapcore.WarnLevel, e.Level)
		for k := range e.ContextMap() {
			require.Contains(t, []string{"scope", "times", "content_length", "held", "body_budget"}, k, "sizes only, nothing the sender sent")
		}
		counted += e.ContextMap()["times"].(int64)
	}
	require.LessOrEqual(t, counted, int64(2), "the warnings count the refusals")
	require.Positive(t, counted)
	require.Zero(t, g.up.count(), "nothing forwarded")
	require.Empty(t, g.rows(), "nothing claimed")

	// A signed delivery whose next handler panics returns its bytes too.
	g.up.respond = func(http.ResponseWriter, *http.Request, int) error { panic("upstream handler panics") }
	signed := stripeBody("evt_signed", "x")
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		g.serve(g.stripe(secret, signed, g.clock.Unix()))
	}()
	require.Equal(t, "upstream handler panics", recovered)
	require.Equal(t, 1, g.up.count())
	requireHeld(0)
}

// TestBodyBudgetSharedAcrossReload: the handler of a reloaded config (or
// another route of the scope) counts in the budget the replaced handler's
// requests still hold: a trial's reload let a route hold its old and its
// new budget at once. Here the first handler holds 2 MiB; the second, of
// the same scope, takes 2 MiB more and refuses a third body that would pass
// its 4160 KiB.
func TestBodyBudgetSharedAcrossReload(t *testing.T) {
	t.Parallel()
	const secret = "whsec_budget"
	cfg := "webhook_idempotency {\nprovider stripe\nsecret " + secret + "\nscope " + uniqueScope("budget") + "\nmax_body 2MiB\nbody_budget 4160KiB\n}"
	old := newGateway(t, cfg)
	unsigned := func(g *gateway, body io.Reader, length int64) *http.Request {
		req := newDelivery("http://gateway.test/webhooks/stripe", nil, "Content-Type", "application/json",
			"Stripe-Signature", fmt.Sprintf("t=%d,v1=%s", g.clock.Unix(), strings.Repeat("0", 64)))
		req.Body, req.ContentLength = io.NopCloser(body), length
		return req
	}
	serve := func(g *gateway, req *http.Request) <-chan answer {
		done := make(chan answer, 1)
		go func() { done <- g.serve(req) }()
		return done
	}
	held := func() int64 { return old.h.budget.held.Load() }
	body := stripeBody("evt_unsigned", strings.Repeat("x", 2<<20-len(stripeBody("evt_unsigned", ""))))

	ar, aw := io.Pipe()
	aDone := serve(old, unsigned(old, ar, 2<<20))
	require.Eventually(t, func() bool { return held() == 2<<20 }, 5*time.Second, time.Millisecond)

	renewed := newGateway(t, cfg, sharingStore(old))
	require.Same(t, old.h.budget, renewed.h.budget, "one budget per scope")
	br, bw := io.Pipe()
	bDone := serve(renewed, unsigned(renewed, br, 2<<20))
	require.Eventually(t, func() bool { return held() == 4<<20 }, 5*time.Second, time.Millisecond)
	a := renewed.serve(unsigned(renewed, bytes.NewReader(body), int64(len(body))))
	requireRefused(t, a, http.StatusServiceUnavailable, "body budget spent; retry later")

	go func() { _, _ = aw.Write(body); _ = aw.Close() }()
	go func() { _, _ = bw.Write(body); _ = bw.Close() }()
	for _, done := range []<-chan answer{aDone, bDone} {
		select {
		case a := <-done:
			requireRefused(t, a, http.StatusBadRequest, "no matching signature")
		case <-time.After(20 * time.Second):
			t.Fatal("no answer")
		}
	}
	require.Eventually(t, func() bool { return held() == 0 }, 5*time.Second, time.Millisecond)
}

// TestBodyBudgetLimitFollowsLiveConfigs: a scope's budget takes the value
// of its newest config still loaded. A trial found three ways around it: a
// reload refused after its route was provisioned changed the running
// limit for good; a route removed and added back while its requests held
// bytes got a fresh budget beside them; and two routes of one config with
// different values got whichever was provisioned last.
func TestBodyBudgetLimitFollowsLiveConfigs(t *testing.T) {
	t.Parallel()
	require.NoError(t, initMetrics(prometheus.NewRegistry()))
	scope := uniqueScope("budget")
	running := &Handler{Scope: scope, BodyBudget: 4 << 20}
	running.provisionBudget()
	b := running.budget
	require.True(t, b.take(3<<20), "the running config's requests hold 3 MiB")

	refused := &Handler{Scope: scope, BodyBudget: 8 << 20}
	refused.provisionBudget()
	require.Same(t, b, refused.budget, "one budget per scope")
	require.Equal(t, int64(8<<20), b.limit.Load(), "the newest config's value")
	refused.cleanupBudget() // its config was refused after it was provisioned
	require.Equal(t, int64(4<<20), b.limit.Load(), "the running config's value again")

	running.cleanupBudget() // the route removed while its requests hold 3 MiB
	back := &Handler{Scope: scope, BodyBudget: 4 << 20}
	back.provisionBudget()
	require.Same(t, b, back.budget, "added back: the same budget")
	require.False(t, b.take(2<<20), "the removed route's requests still hold 3 MiB")
	b.give(3 << 20)
	require.True(t, b.take(2<<20))
	b.give(2 << 20)
	require.Zero(t, b.held.Load())

	back.cleanupBudget()

	// Two routes of one config giving the scope different values.
	config, st := new(int), Storage{Backend: "sqlite", Path: "/tmp/budget.db"}
	require.NoError(t, useScopeStorage(config, scope, st, "stripe", 4<<20, ""))
	t.Cleanup(func() { releaseScopeStorage(config, scope) })
	require.EqualError(t, useScopeStorage(config, scope, st, "stripe", defaultBodyBudget, ""), fmt.Sprintf(
		"body_budget: routes of scope %q give it 4194304 bytes (4MiB) and 1073741824 bytes (1GiB); they share one budget (a default counts as given): write the same body_budget in each", scope))
	require.NoError(t, useScopeStorage(config, scope, st, "stripe", 4<<20, ""), "the same value")
	releaseScopeStorage(config, scope)
}
