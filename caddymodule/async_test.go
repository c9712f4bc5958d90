package caddymodule

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	pgstore "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// Tests of async mode (store-and-forward): real Handlers provisioned from
// Caddyfile snippets on the real PostgreSQL, called through ServeHTTP, with
// their dispatchers delivering to an httptest upstream on 127.0.0.1. Two
// "instances" are two handlers whose DSNs differ (application_name): each
// has its own pool, queue backend and dispatcher, as two processes would.
// No ports of their own; they run one after another (no t.Parallel) to
// leave the shared CPUs to the dispatchers.

const asyncSecret = "whsec_async_test"

// asyncDSN returns the test database's DSN for one gateway instance, or
// skips under -short when PostgreSQL is unreachable.
func asyncDSN(t *testing.T, instance string) string {
	t.Helper()
	dsn := os.Getenv("TEST_DATABASE_URL")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		if testing.Short() {
			t.Skipf("PostgreSQL unreachable, skipped under -short: %v", err)
		}
		t.Fatalf("PostgreSQL unreachable (set TEST_DATABASE_URL): %v", err)
	}
	_ = conn.Close(ctx)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + "application_name=" + instance
}

func asyncToken() string {
	b := make([]byte, 5)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}

// asyncTable is a fresh events table (and queue tables) for one test,
// dropped after every handler of the test is cleaned up.
func asyncTable(t *testing.T) string {
	t.Helper()
	table := "aq_" + asyncToken()
	dsn := asyncDSN(t, "cleanup")
	t.Cleanup(func() { dropTable(dsn, table) })
	return table
}

// asyncGateway is one provisioned async Handler.
type asyncGateway struct {
	t    *testing.T
	h    *Handler
	stop func()
}

// newAsyncGateway provisions a Handler from a Caddyfile block (without
// storage) on table, as gateway instance, and cleans it up at the end.
func newAsyncGateway(t *testing.T, table, instance, snippet string) *asyncGateway {
	t.Helper()
	h := new(Handler)
	require.NoError(t, h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(snippet)), "Caddyfile")
	h.Storage = &Storage{Backend: "postgres", DSN: asyncDSN(t, instance), Table: table}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	var once sync.Once
	g := &asyncGateway{t: t, h: h}
	g.stop = func() {
		once.Do(func() {
			cancel()
			_ = h.Cleanup()
		})
	}
	err := h.Provision(ctx)
	t.Cleanup(g.stop)
	require.NoError(t, err, "Provision")
	require.NoError(t, h.Validate(), "Validate")
	return g
}

// asyncEvent is the body of a test event.
type asyncEvent struct {
	ID       string `json:"id"`
	Object   string `json:"object"`
	Customer string `json:"customer,omitempty"`
	Seq      int    `json:"seq,omitempty"`
}

// signedDelivery is a Stripe-signed POST of ev to /webhooks/stripe?src=test.
func signedDelivery(ev asyncEvent) *http.Request {
	ev.Object = "event"
	body, _ := json.Marshal(ev)
	req := httptest.NewRequest(http.MethodPost, "/webhooks/stripe?src=test", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Stripe-Signature", stripeHeader(asyncSecret, body, time.Now().Unix()))
	req.Header.Set("Connection", "keep-alive")
	req.RemoteAddr = "192.0.2.7:4242"
	repl := caddy.NewReplacer()
	return req.WithContext(context.WithValue(req.Context(), caddy.ReplacerCtxKey, repl))
}

type asyncAnswer struct {
	status int
	header http.Header
	body   string
}

func (g *asyncGateway) send(ev asyncEvent) asyncAnswer {
	g.t.Helper()
	rec := httptest.NewRecorder()
	next := nextFunc(func(http.ResponseWriter, *http.Request) error {
		g.t.Error("async mode called the next handler")
		return nil
	})
	require.NoError(g.t, g.h.ServeHTTP(rec, signedDelivery(ev), next))
	return asyncAnswer{rec.Code, rec.Header(), rec.Body.String()}
}

type nextFunc func(http.ResponseWriter, *http.Request) error

func (f nextFunc) ServeHTTP(w http.ResponseWriter, r *http.Request) error { return f(w, r) }

func requireQueued(t *testing.T, a asyncAnswer) {
	t.Helper()
	require.Equal(t, http.StatusOK, a.status, a.body)
	require.JSONEq(t, `{"received":true,"queued":true}`, a.body)
	require.Empty(t, a.header.Get("Idempotent-Replayed"))
}

func requireReplayed(t *testing.T, a asyncAnswer) {
	t.Helper()
	require.Equal(t, http.StatusOK, a.status, a.body)
	require.Equal(t, "true", a.header.Get("Idempotent-Replayed"))
	require.JSONEq(t, `{"received":true,"duplicate":true}`, a.body)
}

// pool is the gateway's database pool, for assertions.
func (g *asyncGateway) pool() *pgxpool.Pool {
	return g.h.backend.Store.(*pgstore.Store).Pool()
}

func (g *asyncGateway) queued(id string) (queue.Event, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return g.h.async.qb.q.Get(ctx, g.h.Scope, id)
}

func (g *asyncGateway) stats() queue.Stats {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := g.h.async.qb.q.Stats(ctx, g.h.Scope)
	require.NoError(g.t, err)
	return st
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// legacyUpstream is the slow legacy handler queued events are delivered
// to. It counts calls and 2xx answers per event, its concurrency overall
// and per order key, and the order of answered events per key.
type legacyUpstream struct {
	srv *httptest.Server

	mu       sync.Mutex
	calls    map[string]int
	answered map[string]int // 2xx answers
	order    map[string][]int
	keyBusy  map[string]int
	keyPeak  int
	lastReq  *http.Request
	lastBody []byte

	inFlight, peak atomic.Int32
	total, failed  atomic.Int32
	status         atomic.Int32 // 0 = 200
	delay          atomic.Int64
	// failFirst: the first call of events whose seq is a multiple fails.
	failFirst int
	// entered, when set, receives each event ID as its call begins; block,
	// when set, holds calls until closed.
	entered chan string
	block   chan struct{}
}

func newLegacyUpstream(t *testing.T) *legacyUpstream {
	u := &legacyUpstream{calls: map[string]int{}, answered: map[string]int{}, order: map[string][]int{}, keyBusy: map[string]int{}}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *legacyUpstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var ev asyncEvent
	_ = json.Unmarshal(body, &ev)
	n := u.inFlight.Add(1)
	defer u.inFlight.Add(-1)
	for p := u.peak.Load(); n > p && !u.peak.CompareAndSwap(p, n); p = u.peak.Load() {
	}
	u.total.Add(1)
	u.mu.Lock()
	u.calls[ev.ID]++
	call := u.calls[ev.ID]
	u.lastReq, u.lastBody = r.Clone(context.Background()), body
	if ev.Customer != "" {
		u.keyBusy[ev.Customer]++
		u.keyPeak = max(u.keyPeak, u.keyBusy[ev.Customer])
	}
	u.mu.Unlock()
	if u.entered != nil {
		u.entered <- ev.ID
	}
	if u.block != nil {
		<-u.block
	}
	if d := u.delay.Load(); d > 0 {
		time.Sleep(time.Duration(d)) // the legacy handler is slow
	}
	status := int(u.status.Load())
	if status == 0 {
		status = http.StatusOK
	}
	if u.failFirst > 0 && ev.Seq%u.failFirst == 0 && call == 1 {
		status = http.StatusInternalServerError
	}
	u.mu.Lock()
	if ev.Customer != "" {
		u.keyBusy[ev.Customer]--
	}
	if status < 300 {
		u.answered[ev.ID]++
		if ev.Customer != "" {
			u.order[ev.Customer] = append(u.order[ev.Customer], ev.Seq)
		}
	} else {
		u.failed.Add(1)
	}
	u.mu.Unlock()
	w.WriteHeader(status)
	_, _ = io.WriteString(w, `{"legacy":true}`)
}

func (u *legacyUpstream) answeredEvents() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.answered)
}

// asyncSnippet is a Stripe async block delivering to u, with extra lines.
func asyncSnippet(scope string, u *legacyUpstream, extra string) string {
	return fmt.Sprintf(`webhook_idempotency {
		provider stripe
		secret %s
		scope %s
		mode async
		deliver_to %s
		%s
	}`, asyncSecret, scope, u.srv.URL, extra)
}

// attemptsByOutcome counts the attempts table's rows of a scope by outcome.
func (g *asyncGateway) attemptsByOutcome(table string) map[string]int {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := g.pool().Query(ctx, `SELECT outcome, count(*) FROM `+pgx.Identifier{table + "_attempts"}.Sanitize()+
		` WHERE scope = $1 GROUP BY outcome`, g.h.Scope)
	require.NoError(g.t, err)
	out := map[string]int{}
	for rows.Next() {
		var (
			o string
			n int
		)
		require.NoError(g.t, rows.Scan(&o, &n))
		out[o] = n
	}
	require.NoError(g.t, rows.Err())
	return out
}

// TestAsyncQueuesAndDelivers: the provider is answered before the upstream
// is called; the upstream gets the delivery as it arrived; duplicates of a
// queued or delivered event are answered at the edge.
func TestAsyncQueuesAndDelivers(t *testing.T) {
	u := newLegacyUpstream(t)
	u.block = make(chan struct{})
	u.entered = make(chan string, 1)
	table := asyncTable(t)
	g := newAsyncGateway(t, table, "a", asyncSnippet(uniqueScope("stripe"), u, "cache 0"))
	enqueued := enqueueBatchSum(t)

	requireQueued(t, g.send(asyncEvent{ID: "evt_1"}))
	require.Equal(t, "evt_1", <-u.entered, "delivered from the queue")
	requireReplayed(t, g.send(asyncEvent{ID: "evt_1"})) // while in delivery
	ev, err := g.queued("evt_1")
	require.NoError(t, err)
	require.Equal(t, queue.StateDelivering, ev.State)
	close(u.block)
	waitFor(t, 10*time.Second, "delivery", func() bool {
		ev, err := g.queued("evt_1")
		return err == nil && ev.State == queue.StateDelivered
	})
	requireReplayed(t, g.send(asyncEvent{ID: "evt_1"}))

	u.mu.Lock()
	req, body := u.lastReq, u.lastBody
	calls := u.calls["evt_1"]
	u.mu.Unlock()
	require.Equal(t, 1, calls)
	require.Equal(t, http.MethodPost, req.Method)
	require.Equal(t, "/webhooks/stripe?src=test", req.URL.RequestURI(), "deliver_to without a path keeps the delivery's")
	want, _ := io.ReadAll(signedDelivery(asyncEvent{ID: "evt_1"}).Body)
	require.Equal(t, want, body, "the exact bytes")
	require.Equal(t, "application/json", req.Header.Get("Content-Type"))
	require.True(t, strings.HasPrefix(req.Header.Get("Stripe-Signature"), "t="))
	require.Equal(t, "192.0.2.7", req.Header.Get("X-Forwarded-For"))
	require.Equal(t, "example.com", req.Header.Get("X-Forwarded-Host"))
	require.Empty(t, req.Header.Get("Keep-Alive"))

	// The claim is in the events table too: sync routes and the events
	// admin API see the event as accepted.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	row, err := g.h.backend.Get(ctx, g.h.Scope, "evt_1")
	require.NoError(t, err)
	require.Equal(t, store.StateCompleted, row.State)
	require.Equal(t, http.StatusAccepted, row.Status)
	require.Equal(t, 1.0, counterValue(t, metrics.deliveries.WithLabelValues(g.h.Scope, "stripe", outcomeQueued)))
	require.Equal(t, 2.0, counterValue(t, metrics.deliveries.WithLabelValues(g.h.Scope, "stripe", outcomeDuplicate)))
	// The three deliveries reached the queue (cache 0) in its batches.
	require.GreaterOrEqual(t, enqueueBatchSum(t)-enqueued, 3.0)
}

// enqueueBatchSum is store_batch_size{op="enqueue"}'s sum: the enqueues
// the queues of this process wrote in batches.
func enqueueBatchSum(t *testing.T) float64 {
	t.Helper()
	var m dto.Metric
	h, ok := batchSizes.WithLabelValues("enqueue").(prometheus.Metric)
	require.True(t, ok)
	require.NoError(t, h.Write(&m))
	return m.GetHistogram().GetSampleSum()
}

// TestAsyncUpstreamDownThenBack: 1,000 events accepted while the upstream
// is down are all delivered exactly once after it comes back.
func TestAsyncUpstreamDownThenBack(t *testing.T) {
	const events = 1000
	u := newLegacyUpstream(t)
	u.status.Store(http.StatusServiceUnavailable)
	table := asyncTable(t)
	g := newAsyncGateway(t, table, "a", asyncSnippet(uniqueScope("down"), u, `
		retry_schedule 100ms 200ms 400ms
		max_attempts 1000
		max_concurrency 16`))

	var wg sync.WaitGroup
	ids := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ids {
				a := g.send(asyncEvent{ID: fmt.Sprintf("evt_%04d", i)})
				if a.status != http.StatusOK || !strings.Contains(a.body, `"queued":true`) {
					t.Errorf("event %d: %d %s", i, a.status, a.body)
				}
			}
		}()
	}
	for i := range events {
		ids <- i
	}
	close(ids)
	wg.Wait()
	require.Zero(t, u.answeredEvents())
	waitFor(t, 60*time.Second, "a failed attempt per event", func() bool { return u.failed.Load() >= events })
	require.Zero(t, u.answeredEvents(), "nothing was delivered while the upstream was down")

	u.status.Store(0)
	waitFor(t, 120*time.Second, "every event delivered", func() bool {
		st := g.stats()
		return u.answeredEvents() == events && st.Queued == 0 && st.Delivering == 0
	})
	u.mu.Lock()
	for i := range events {
		id := fmt.Sprintf("evt_%04d", i)
		require.Equal(t, 1, u.answered[id], "event %s answered 2xx once", id)
	}
	u.mu.Unlock()
	require.Zero(t, g.stats().Dead)
	out := g.attemptsByOutcome(table)
	require.Equal(t, events, out[queue.AttemptDelivered])
	require.GreaterOrEqual(t, out[queue.AttemptRetry], events)
	requireReplayed(t, g.send(asyncEvent{ID: "evt_0042"}))
}

// TestAsyncMaxConcurrencyAcrossInstances: two instances deliver a burst of
// 500 events to an upstream that never sees more than max_concurrency 4.
func TestAsyncMaxConcurrencyAcrossInstances(t *testing.T) {
	const events = 500
	u := newLegacyUpstream(t)
	u.delay.Store(int64(10 * time.Millisecond))
	table := asyncTable(t)
	scope := uniqueScope("conc")
	ga := newAsyncGateway(t, table, "a", asyncSnippet(scope, u, "max_concurrency 4"))
	gb := newAsyncGateway(t, table, "b", asyncSnippet(scope, u, "max_concurrency 4"))
	require.NotSame(t, ga.h.async.qb.d, gb.h.async.qb.d, "two dispatchers")

	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < events; i += 4 {
				g := ga
				if i%2 == 1 {
					g = gb
				}
				if a := g.send(asyncEvent{ID: fmt.Sprintf("evt_%03d", i)}); a.status != http.StatusOK {
					t.Errorf("event %d: %d %s", i, a.status, a.body)
				}
			}
		}()
	}
	wg.Wait()
	waitFor(t, 120*time.Second, "every event delivered", func() bool { return u.answeredEvents() == events })
	require.LessOrEqual(t, u.peak.Load(), int32(4), "the upstream never saw more than 4 at once")
	require.GreaterOrEqual(t, u.peak.Load(), int32(2))
	require.Equal(t, int32(events), u.total.Load(), "each event delivered once")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := ga.pool().Query(ctx, `SELECT worker, count(*) FROM `+pgx.Identifier{table + "_attempts"}.Sanitize()+` GROUP BY worker`)
	require.NoError(t, err)
	byWorker := map[string]int{}
	for rows.Next() {
		var (
			w string
			n int
		)
		require.NoError(t, rows.Scan(&w, &n))
		byWorker[w] = n
	}
	require.NoError(t, rows.Err())
	t.Logf("attempts by dispatcher: %v (peak concurrency %d)", byWorker, u.peak.Load())
	require.Len(t, byWorker, 2, "both dispatchers delivered")
}

// TestAsyncKilledDispatcher: a dispatcher killed mid-delivery (no settle,
// no release) loses nothing; its events are taken back when their leases
// expire, and only those it had in flight may reach the upstream twice.
func TestAsyncKilledDispatcher(t *testing.T) {
	const events = 200
	u := newLegacyUpstream(t)
	// Slow enough that the 200 events are queued long before they are
	// delivered (8 at a time: 80/s), so the kill finds deliveries in flight.
	u.delay.Store(int64(100 * time.Millisecond))
	table := asyncTable(t)
	scope := uniqueScope("kill")
	extra := "lease 1s\nmax_concurrency 8\nretry_schedule 50ms"
	ga := newAsyncGateway(t, table, "a", asyncSnippet(scope, u, extra))
	for i := range events {
		requireQueued(t, ga.send(asyncEvent{ID: fmt.Sprintf("evt_%03d", i)}))
	}
	waitFor(t, 30*time.Second, "deliveries under way", func() bool { return u.total.Load() >= 40 })
	ga.h.async.qb.d.Kill()
	killedAt := u.answeredEvents()
	require.Less(t, killedAt, events, "killed mid-way")

	gb := newAsyncGateway(t, table, "b", asyncSnippet(scope, u, extra))
	waitFor(t, 60*time.Second, "every event delivered", func() bool {
		st := gb.stats()
		return u.answeredEvents() == events && st.Queued == 0 && st.Delivering == 0
	})

	// Which events had an attempt cut off by the kill?
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := gb.pool().Query(ctx, `SELECT q.event_id FROM `+pgx.Identifier{table + "_attempts"}.Sanitize()+` a
		JOIN `+pgx.Identifier{table + "_queue"}.Sanitize()+` q ON q.id = a.queue_id WHERE a.outcome = 'lost'`)
	require.NoError(t, err)
	lost := map[string]bool{}
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		lost[id] = true
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, lost, "the kill cut deliveries off")
	require.LessOrEqual(t, len(lost), 8, "at most the killed dispatcher's in-flight deliveries")

	u.mu.Lock()
	defer u.mu.Unlock()
	twice := 0
	for i := range events {
		id := fmt.Sprintf("evt_%03d", i)
		require.GreaterOrEqual(t, u.answered[id], 1, "event %s delivered", id)
		if u.calls[id] > 1 {
			twice++
			require.True(t, lost[id], "event %s reached the upstream twice without a lost attempt", id)
		}
	}
	t.Logf("killed with %d events answered; %d lost attempts, %d events reached the upstream twice", killedAt, len(lost), twice)
	out := gb.attemptsByOutcome(table)
	require.Equal(t, events, out[queue.AttemptDelivered], "one delivered attempt per event")
}

// TestAsyncOrderKeyAcrossInstances: events sharing an order key reach the
// upstream one at a time and in arrival order, with two dispatchers and
// failed first attempts in between.
func TestAsyncOrderKeyAcrossInstances(t *testing.T) {
	const keys, perKey = 4, 25
	u := newLegacyUpstream(t)
	u.delay.Store(int64(2 * time.Millisecond))
	u.failFirst = 5
	table := asyncTable(t)
	scope := uniqueScope("order")
	extra := "order_key json customer\nretry_schedule 20ms\nmax_attempts 10"
	ga := newAsyncGateway(t, table, "a", asyncSnippet(scope, u, extra))
	gb := newAsyncGateway(t, table, "b", asyncSnippet(scope, u, extra))

	var wg sync.WaitGroup
	for k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := 1; s <= perKey; s++ {
				g := ga
				if s%2 == 0 {
					g = gb
				}
				a := g.send(asyncEvent{ID: fmt.Sprintf("evt_k%d_%02d", k, s), Customer: fmt.Sprintf("cus_%d", k), Seq: s})
				if a.status != http.StatusOK {
					t.Errorf("key %d seq %d: %d %s", k, s, a.status, a.body)
				}
			}
		}()
	}
	wg.Wait()
	waitFor(t, 60*time.Second, "every event delivered", func() bool { return u.answeredEvents() == keys*perKey })
	u.mu.Lock()
	defer u.mu.Unlock()
	require.Equal(t, 1, u.keyPeak, "one delivery per key at a time")
	for k := range keys {
		seq := u.order[fmt.Sprintf("cus_%d", k)]
		want := make([]int, perKey)
		for i := range want {
			want[i] = i + 1
		}
		require.Equal(t, want, seq, "key %d delivered in arrival order", k)
	}
	require.Positive(t, u.failed.Load(), "some first attempts failed")
}

// adminCall runs one request through the queue admin API.
func queueAdminCall(t *testing.T, method, path string) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	err := (&QueueAdmin{}).Routes()[0].Handler.ServeHTTP(rec, httptest.NewRequest(method, path, nil)) // through the guard
	if err != nil {
		apiErr, ok := err.(caddy.APIError)
		require.True(t, ok, "admin error %v", err)
		return apiErr.HTTPStatus, map[string]any{"error": apiErr.Message}
	}
	var out map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out), rec.Body.String())
	return rec.Code, out
}

// TestAsyncDeadThenAdminRetry: a delivery that always fails ends dead
// after max_attempts, each attempt recorded; the admin API lists it and
// retries it (one, then all), and purges.
func TestAsyncDeadThenAdminRetry(t *testing.T) {
	u := newLegacyUpstream(t)
	u.status.Store(http.StatusInternalServerError)
	table := asyncTable(t)
	scope := uniqueScope("dead")
	g := newAsyncGateway(t, table, "a", asyncSnippet(scope, u, "max_attempts 3\nretry_schedule 10ms"))

	requireQueued(t, g.send(asyncEvent{ID: "evt_dead"}))
	requireQueued(t, g.send(asyncEvent{ID: "evt/2"}))
	isDead := func(id string) func() bool {
		return func() bool {
			ev, err := g.queued(id)
			return err == nil && ev.State == queue.StateDead
		}
	}
	waitFor(t, 30*time.Second, "dead", isDead("evt_dead"))
	waitFor(t, 30*time.Second, "dead", isDead("evt/2"))
	requireReplayed(t, g.send(asyncEvent{ID: "evt_dead"}))
	u.mu.Lock()
	require.Equal(t, 3, u.calls["evt_dead"])
	u.mu.Unlock()

	status, out := queueAdminCall(t, http.MethodGet, "/webhook_idempotency/queue/"+scope+"/events?state=dead")
	require.Equal(t, http.StatusOK, status)
	require.Len(t, out["events"], 2)
	status, out = queueAdminCall(t, http.MethodGet, "/webhook_idempotency/queue/"+scope+"/events/evt_dead")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "dead", out["state"])
	require.Equal(t, "upstream answered 500", out["last_error"])
	history := out["history"].([]any)
	require.Len(t, history, 3)
	for i, h := range history {
		a := h.(map[string]any)
		require.EqualValues(t, 500, a["status"])
		require.NotEmpty(t, a["started_at"])
		want := queue.AttemptRetry
		if i == 2 {
			want = queue.AttemptDead
		}
		require.Equal(t, want, a["outcome"])
	}
	g.h.async.reg.RefreshStats()
	require.Equal(t, 2.0, gaugeValue(t, queueMetrics.dead.WithLabelValues(scope)))
	require.Equal(t, 2.0, counterValue(t, queueMetrics.attempts.WithLabelValues(scope, queue.AttemptDead)))

	status, out = queueAdminCall(t, http.MethodGet, "/webhook_idempotency/queue/")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, fmt.Sprint(out["scopes"]), scope)

	// The upstream is fixed: retry one now, then all.
	u.status.Store(0)
	status, _ = queueAdminCall(t, http.MethodPost, "/webhook_idempotency/queue/"+scope+"/events/evt_dead/retry")
	require.Equal(t, http.StatusOK, status)
	waitFor(t, 10*time.Second, "delivered", func() bool {
		ev, err := g.queued("evt_dead")
		return err == nil && ev.State == queue.StateDelivered
	})
	status, _ = queueAdminCall(t, http.MethodPost, "/webhook_idempotency/queue/"+scope+"/events/evt_dead/retry")
	require.Equal(t, http.StatusConflict, status, "a delivered event is not retried")
	status, out = queueAdminCall(t, http.MethodPost, "/webhook_idempotency/queue/"+scope+"/retry")
	require.Equal(t, http.StatusOK, status)
	require.EqualValues(t, 1, out["retried"])
	waitFor(t, 10*time.Second, "delivered", func() bool {
		ev, err := g.queued("evt/2")
		return err == nil && ev.State == queue.StateDelivered
	})

	// Purge: the queue rows go, the claims stay (still duplicates). Without
	// the confirmation nothing is purged.
	status, _ = queueAdminCall(t, http.MethodDelete, "/webhook_idempotency/queue/"+scope+"/events/evt%2F2")
	require.Equal(t, http.StatusPreconditionRequired, status)
	status, _ = queueAdminCall(t, http.MethodDelete, "/webhook_idempotency/queue/"+scope+"/events?state=delivered&confirm=dead")
	require.Equal(t, http.StatusPreconditionRequired, status)
	status, _ = queueAdminCall(t, http.MethodDelete, "/webhook_idempotency/queue/"+scope+"/events/evt%2F2?confirm=evt%2F2")
	require.Equal(t, http.StatusOK, status)
	status, out = queueAdminCall(t, http.MethodDelete, "/webhook_idempotency/queue/"+scope+"/events?state=delivered&confirm=delivered")
	require.Equal(t, http.StatusOK, status)
	require.EqualValues(t, 1, out["purged"])
	status, _ = queueAdminCall(t, http.MethodGet, "/webhook_idempotency/queue/"+scope+"/events/evt_dead")
	require.Equal(t, http.StatusNotFound, status)
	requireReplayed(t, g.send(asyncEvent{ID: "evt_dead"}))
	status, _ = queueAdminCall(t, http.MethodDelete, "/webhook_idempotency/queue/"+scope+"/events")
	require.Equal(t, http.StatusBadRequest, status, "purge needs a state")
	status, _ = queueAdminCall(t, http.MethodGet, "/webhook_idempotency/queue/nosuchscope/events")
	require.Equal(t, http.StatusNotFound, status)
}

// TestAsyncGracefulStop: a stopping dispatcher gives in-flight deliveries
// the grace period, then hands their events back; another instance
// delivers them (a restart loses nothing).
func TestAsyncGracefulStop(t *testing.T) {
	u := newLegacyUpstream(t)
	u.block = make(chan struct{})
	u.entered = make(chan string, 4)
	table := asyncTable(t)
	scope := uniqueScope("stop")
	ga := newAsyncGateway(t, table, "a", asyncSnippet(scope, u, ""))
	requireQueued(t, ga.send(asyncEvent{ID: "evt_1"}))
	require.Equal(t, "evt_1", <-u.entered)

	ga.h.async.qb.d.SetGrace(100 * time.Millisecond)
	ga.stop() // the last handler of the queue: its dispatcher stops

	gb := newAsyncGateway(t, table, "b", asyncSnippet(scope, u, ""))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var outcome string
	err := gb.pool().QueryRow(ctx, `SELECT outcome FROM `+pgx.Identifier{table + "_attempts"}.Sanitize()+
		` WHERE attempt = 1`).Scan(&outcome)
	require.NoError(t, err)
	require.Equal(t, queue.AttemptReleased, outcome, "handed back after the grace period")
	require.Equal(t, "evt_1", <-u.entered, "the other instance delivers it again (at least once)")
	close(u.block)
	waitFor(t, 10*time.Second, "settled", func() bool {
		ev, err := gb.queued("evt_1")
		return err == nil && ev.State == queue.StateDelivered
	})
	ev, err := gb.queued("evt_1")
	require.NoError(t, err)
	require.Equal(t, 1, ev.RoundAttempts, "the released attempt does not count")
	require.Equal(t, 2, ev.Attempts)
}

// TestAsyncReloadKeepsDispatcher: a new config of the same storage shares
// the dispatcher, takes the route over (its deliver_to wins), and the old
// config's cleanup doesn't stop it.
func TestAsyncReloadKeepsDispatcher(t *testing.T) {
	u1, u2 := newLegacyUpstream(t), newLegacyUpstream(t)
	table := asyncTable(t)
	scope := uniqueScope("reload")
	g1 := newAsyncGateway(t, table, "a", asyncSnippet(scope, u1, ""))
	g2 := newAsyncGateway(t, table, "a", asyncSnippet(scope, u2, ""))
	require.Same(t, g1.h.async.qb, g2.h.async.qb, "one dispatcher per storage per process")
	g1.stop()
	requireQueued(t, g2.send(asyncEvent{ID: "evt_after_reload"}))
	waitFor(t, 10*time.Second, "delivered to the new config's upstream", func() bool { return u2.answeredEvents() == 1 })
	require.Zero(t, u1.answeredEvents())
}

func TestAsyncConfig(t *testing.T) {
	h := new(Handler)
	require.NoError(t, h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`webhook_idempotency {
		provider stripe
		secret whsec_x
		mode async
		deliver_to http://127.0.0.1:9000/legacy
		max_attempts 5
		max_age 24h
		retry_schedule 1s 10s 1m
		max_concurrency 4
		rate 10/s
		order_key json data.object.customer
		keep_body 1h
	}`)))
	require.Equal(t, "async", h.Mode)
	require.Equal(t, "http://127.0.0.1:9000/legacy", h.DeliverTo)
	require.Equal(t, 5, h.MaxAttempts)
	require.Equal(t, caddy.Duration(24*time.Hour), h.MaxAge)
	require.Equal(t, []caddy.Duration{caddy.Duration(time.Second), caddy.Duration(10 * time.Second), caddy.Duration(time.Minute)}, h.RetrySchedule)
	require.Equal(t, 4, h.MaxConcurrency)
	require.Equal(t, &RateLimit{Events: 10, Window: caddy.Duration(time.Second)}, h.Rate)
	require.Equal(t, &eventid.Source{Kind: eventid.JSON, Name: "data.object.customer"}, h.OrderKey)
	require.Equal(t, caddy.Duration(time.Hour), h.KeepBody)
	b, err := json.Marshal(h)
	require.NoError(t, err)
	require.Contains(t, string(b), `"mode":"async"`)
	require.Contains(t, string(b), `"deliver_to":"http://127.0.0.1:9000/legacy"`)
	require.Contains(t, string(b), `"rate":{"events":10,"window":1000000000}`)

	for _, c := range []struct{ block, want string }{
		{"mode later", "mode: want sync or async"},
		{"mode async\nmode async", "mode already specified"},
		{"rate 10", "rate: want <n>/<duration>"},
		{"rate 0/1s", "rate: want a positive number"},
		{"retry_schedule", "retry_schedule: want one or more"},
		{"retry_schedule 1s -1s", "retry_schedule: invalid duration"},
		{"max_concurrency 0", "max_concurrency: want a positive number"},
		{"order_key form x", "order_key: want json <path> or header <name>"},
	} {
		h := new(Handler)
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("webhook_idempotency {\nprovider stripe\nsecret whsec_x\n" + c.block + "\n}"))
		if err == nil {
			err = h.prepareConfig() // a rule on values, not syntax
		}
		require.ErrorContains(t, err, c.want, c.block)
	}

	provision := func(snippet string, st *Storage) error {
		h := new(Handler)
		require.NoError(t, h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(snippet)))
		h.Storage = st
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		defer cancel()
		err := h.Provision(ctx)
		_ = h.Cleanup()
		return err
	}
	sqlite := &Storage{Backend: "sqlite", Path: t.TempDir() + "/events.db"}
	base := "webhook_idempotency {\nprovider stripe\nsecret whsec_x\n"
	require.ErrorContains(t, provision(base+"mode async\ndeliver_to http://127.0.0.1:9\n}", sqlite), "mode: async needs storage postgres")
	require.ErrorContains(t, provision(base+"deliver_to http://127.0.0.1:9\n}", sqlite), "deliver_to: only with mode async")
	table := asyncTable(t)
	pg := &Storage{Backend: "postgres", DSN: asyncDSN(t, "config"), Table: table}
	require.ErrorContains(t, provision(base+"mode async\n}", pg), "deliver_to: required in async mode")
	require.ErrorContains(t, provision(base+"mode async\ndeliver_to ftp://x\n}", pg), "deliver_to: want an absolute http or https URL")
	require.ErrorContains(t, provision(base+"mode async\ndeliver_to http://127.0.0.1:9\nmax_age 100d\n}", pg), "max_age: must be positive and at most retention")
	require.NoError(t, provision(base+"mode async\ndeliver_to http://127.0.0.1:9\n}", pg))
}

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, g.Write(&m))
	return m.GetGauge().GetValue()
}

// The Caddyfile's async subdirectives adapt to the handler's top-level
// JSON fields.
func TestAsyncAdapt(t *testing.T) {
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(`:8080 {
	webhook_idempotency /webhooks/stripe {
		provider stripe
		secret {env.STRIPE_WEBHOOK_SECRET}
		storage postgres {env.WEBHOOK_DATABASE_URL}
		mode async
		deliver_to http://127.0.0.1:9000
		max_concurrency 4
		rate 20/1s
		order_key json data.object.customer
		retry_schedule 5s 1m
	}
}`), nil)
	require.NoError(t, err)
	for _, want := range []string{`"mode":"async"`, `"deliver_to":"http://127.0.0.1:9000"`, `"max_concurrency":4`,
		`"rate":{"events":20,"window":1000000000}`, `"order_key":{"from":"json","name":"data.object.customer"}`,
		`"retry_schedule":[5000000000,60000000000]`} {
		require.Contains(t, string(out), want)
	}
}

// TestQueueAdminOddIDs: the queue admin's query form (which the CLI uses)
// names exactly the event, whatever its ID: "." and ".." (path cleaning
// would make them another resource), "a//b", "%".
func TestQueueAdminOddIDs(t *testing.T) {
	u := newLegacyUpstream(t)
	u.status.Store(http.StatusInternalServerError)
	table := asyncTable(t)
	scope := uniqueScope("odd")
	g := newAsyncGateway(t, table, "a", asyncSnippet(scope, u, "max_attempts 1\nretry_schedule 10ms"))
	ids := []string{".", "..", "a//b", "100%", "./x"}
	for _, id := range ids {
		requireQueued(t, g.send(asyncEvent{ID: id}))
	}
	for _, id := range ids {
		waitFor(t, 30*time.Second, "dead", func() bool {
			ev, err := g.queued(id)
			return err == nil && ev.State == queue.StateDead
		})
	}
	base := "/webhook_idempotency/queue/" + scope
	for _, id := range ids {
		q := url.Values{"id": {id}}.Encode()
		status, out := queueAdminCall(t, http.MethodGet, base+"/event?"+q)
		require.Equal(t, http.StatusOK, status, "%s: %v", id, out)
		require.Equal(t, id, out["event_id"])
		status, _ = queueAdminCall(t, http.MethodDelete, base+"/event?"+q)
		require.Equal(t, http.StatusPreconditionRequired, status, "unconfirmed")
		status, out = queueAdminCall(t, http.MethodDelete, base+"/event?"+url.Values{"id": {id}, "confirm": {id}}.Encode())
		require.Equal(t, http.StatusOK, status, "%s: %v", id, out)
		status, _ = queueAdminCall(t, http.MethodGet, base+"/event?"+q)
		require.Equal(t, http.StatusNotFound, status)
	}
}

// caddy validate provisions a config next to the gateway that runs the
// one in use, and cleans it up without serving it: an async route there
// must not deliver the queue (it registered with a dispatcher of its own,
// which delivered due events at once, to the validated config's
// deliver_to). Once the config runs, the event goes out.
func TestAsyncValidateDeliversNothing(t *testing.T) {
	table := asyncTable(t)
	scope := "validate_" + asyncToken()
	down := newLegacyUpstream(t)
	down.status.Store(http.StatusServiceUnavailable)
	g := newAsyncGateway(t, table, "running", asyncSnippet(scope, down, "retry_schedule 50ms"))
	requireQueued(t, g.send(asyncEvent{ID: "evt_validate_1"}))
	waitFor(t, 10*time.Second, "a failed attempt", func() bool { return down.total.Load() > 0 })
	g.stop() // the event stays queued, due again within 50ms

	up := newLegacyUpstream(t)
	args := os.Args
	os.Args = []string{"caddy", "validate", "--config", "Caddyfile"}
	v := newAsyncGateway(t, table, "validating", asyncSnippet(scope, up, ""))
	time.Sleep(time.Second)
	v.stop()
	os.Args = args
	require.Zero(t, up.total.Load(), "caddy validate delivered a queued event")

	newAsyncGateway(t, table, "next", asyncSnippet(scope, up, ""))
	waitFor(t, 10*time.Second, "the event delivered by the running config", func() bool { return up.answeredEvents() == 1 })
}
