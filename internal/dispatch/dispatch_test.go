package dispatch_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/dispatch"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
	pgqueue "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue/postgres"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue/queuetest"
	pgstore "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// These tests drive the dispatcher against the real PostgreSQL queue
// (TEST_DATABASE_URL), on fresh tables dropped at the end, and an httptest
// upstream; no Caddy.

func newQueue(t *testing.T) *pgqueue.Queue {
	t.Helper()
	return queuetest.New(t, "dt_", pgstore.Options{}, pgqueue.Options{}).Queue
}

// upstream answers each event (by the "id" of its JSON body) with the
// statuses of its script in turn, the last one repeating (200 without one),
// and records what it got.
type upstream struct {
	*httptest.Server
	mu      sync.Mutex
	script  map[string][]int
	calls   map[string]int
	uris    map[string]string
	headers map[string]http.Header
	bodies  map[string]string
	block   chan struct{} // when set, every request waits for it
	entered chan string
}

func newUpstream(t *testing.T, script map[string][]int) *upstream {
	u := &upstream{script: script, calls: map[string]int{}, uris: map[string]string{},
		headers: map[string]http.Header{}, bodies: map[string]string{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var ev struct{ ID string }
		_ = json.Unmarshal(b, &ev)
		u.mu.Lock()
		n := u.calls[ev.ID]
		u.calls[ev.ID]++
		u.uris[ev.ID], u.headers[ev.ID], u.bodies[ev.ID] = r.URL.RequestURI(), r.Header.Clone(), string(b)
		status := http.StatusOK
		if s := u.script[ev.ID]; len(s) > 0 {
			status = s[min(n, len(s)-1)]
		}
		block, entered := u.block, u.entered
		u.mu.Unlock()
		if entered != nil {
			entered <- ev.ID
		}
		if block != nil {
			select {
			case <-block:
			case <-r.Context().Done():
				return
			}
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) callsOf(id string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[id]
}

func enqueue(t *testing.T, q queue.Queue, scope, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := q.Enqueue(ctx, queue.Entry{
		Scope: scope, EventID: id,
		Request: queue.Request{
			Method: http.MethodPost, URI: "/hooks/stripe?x=1",
			Header: http.Header{"Content-Type": {"application/json"}, "Stripe-Signature": {"t=1,v1=ab"}},
			Body:   []byte(`{"id":"` + id + `"}`),
		},
		Claims:      []queue.Key{{Scope: scope, EventID: id}},
		ClaimStatus: http.StatusAccepted,
	})
	require.NoError(t, err)
	require.Equal(t, queue.Queued, out.Outcome)
}

func get(t *testing.T, q queue.Queue, scope, id string) queue.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev, err := q.Get(ctx, scope, id)
	require.NoError(t, err)
	return ev
}

func attempts(t *testing.T, q queue.Queue, id int64) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	as, err := q.Attempts(ctx, id)
	require.NoError(t, err)
	var out []string
	for _, a := range as {
		out = append(out, a.Outcome)
	}
	return out
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func testMetrics() dispatch.Metrics {
	return dispatch.Metrics{
		Depth:    prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "test_queue_depth", Help: "Queue depth."}, []string{"scope", "state"}),
		Oldest:   prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "test_queue_oldest_age_seconds", Help: "Oldest age."}, []string{"scope"}),
		Attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_queue_attempts_total", Help: "Attempts."}, []string{"scope", "outcome"}),
		Dead:     prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "test_queue_dead_letters", Help: "Dead letters."}, []string{"scope"}),
		Store:    prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "test_store_duration_seconds", Help: "Store latency."}, []string{"operation"}),
	}
}

// value reads a counter or a gauge.
func value(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	if m.Counter != nil {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

func route(t *testing.T, scope, target string) *dispatch.Route {
	u, err := url.Parse(target)
	require.NoError(t, err)
	return &dispatch.Route{
		Scope: scope, Target: u, Schedule: []time.Duration{20 * time.Millisecond},
		MaxAttempts: 3, MaxAge: time.Hour, Lease: 5 * time.Second, Timeout: 5 * time.Second, Retention: 24 * time.Hour,
	}
}

// TestDeliveriesRetriesAndDeadLetters: an event answered 2xx is delivered
// once, as it arrived; one answered 500 twice is retried and delivered on
// the third attempt; one always answered 500 is dead after max_attempts 3,
// and the attempts, the counters and the dead-letter gauge say so.
func TestDeliveriesRetriesAndDeadLetters(t *testing.T) {
	q := newQueue(t)
	u := newUpstream(t, map[string][]int{
		"evt_flaky": {500, 503, 200},
		"evt_dead":  {500},
	})
	m := testMetrics()
	d := dispatch.New(q, dispatch.Options{Metrics: m, IdlePoll: 20 * time.Millisecond})
	t.Cleanup(d.Stop)

	const scope = "stripe"
	for _, id := range []string{"evt_ok", "evt_flaky", "evt_dead"} {
		enqueue(t, q, scope, id)
	}
	reg := d.Register(route(t, scope, u.URL))
	reg.Poke()

	settled := func(id string, want queue.State) func() bool {
		return func() bool { return get(t, q, scope, id).State == want }
	}
	waitFor(t, 20*time.Second, "evt_ok delivered", settled("evt_ok", queue.StateDelivered))
	waitFor(t, 20*time.Second, "evt_flaky delivered", settled("evt_flaky", queue.StateDelivered))
	waitFor(t, 20*time.Second, "evt_dead dead", settled("evt_dead", queue.StateDead))

	require.Equal(t, 1, u.callsOf("evt_ok"))
	require.Equal(t, 3, u.callsOf("evt_flaky"))
	require.Equal(t, 3, u.callsOf("evt_dead"), "max_attempts 3")

	u.mu.Lock()
	require.Equal(t, "/hooks/stripe?x=1", u.uris["evt_ok"], "deliver_to without a path gets the delivery's own URI")
	require.Equal(t, `{"id":"evt_ok"}`, u.bodies["evt_ok"])
	require.Equal(t, "t=1,v1=ab", u.headers["evt_ok"].Get("Stripe-Signature"))
	u.mu.Unlock()

	ok := get(t, q, scope, "evt_ok")
	require.Equal(t, []string{queue.AttemptDelivered}, attempts(t, q, ok.ID))
	flaky := get(t, q, scope, "evt_flaky")
	require.Equal(t, []string{queue.AttemptRetry, queue.AttemptRetry, queue.AttemptDelivered}, attempts(t, q, flaky.ID))
	dead := get(t, q, scope, "evt_dead")
	require.Equal(t, []string{queue.AttemptRetry, queue.AttemptRetry, queue.AttemptDead}, attempts(t, q, dead.ID))
	require.Equal(t, 500, dead.LastStatus)
	require.Equal(t, "upstream answered 500", dead.LastError)

	require.Equal(t, 2.0, value(t, m.Attempts.WithLabelValues(scope, queue.AttemptDelivered)))
	require.Equal(t, 4.0, value(t, m.Attempts.WithLabelValues(scope, queue.AttemptRetry)))
	require.Equal(t, 1.0, value(t, m.Attempts.WithLabelValues(scope, queue.AttemptDead)))
	reg.RefreshStats()
	require.Equal(t, 1.0, value(t, m.Dead.WithLabelValues(scope)))
	require.Equal(t, 0.0, value(t, m.Depth.WithLabelValues(scope, string(queue.StateQueued))))
	var settle dto.Metric
	require.NoError(t, m.Store.WithLabelValues("settle_queued").(prometheus.Histogram).Write(&settle))
	require.EqualValues(t, 7, settle.GetHistogram().GetSampleCount(), "each settle's latency observed")

	// An operator retries the dead event once the upstream is fixed: a new
	// round, delivered.
	u.mu.Lock()
	u.script["evt_dead"] = []int{200}
	u.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, q.Retry(ctx, scope, "evt_dead"))
	d.Poke(scope)
	waitFor(t, 20*time.Second, "evt_dead delivered after retry", settled("evt_dead", queue.StateDelivered))
	require.Equal(t, 4, u.callsOf("evt_dead"))
}

// TestStopReleasesAndAnotherDelivers: a stopping dispatcher gives the
// delivery in flight the grace period, then hands the event back without
// counting the attempt; another dispatcher delivers it.
func TestStopReleasesAndAnotherDelivers(t *testing.T) {
	q := newQueue(t)
	u := newUpstream(t, nil)
	u.block, u.entered = make(chan struct{}), make(chan string, 4)
	const scope = "github"
	enqueue(t, q, scope, "evt_1")

	a := dispatch.New(q, dispatch.Options{Grace: 50 * time.Millisecond, Worker: "a"})
	a.Register(route(t, scope, u.URL+"/legacy")).Poke()
	require.Equal(t, "evt_1", <-u.entered)
	a.Stop()

	ev := get(t, q, scope, "evt_1")
	require.Equal(t, queue.StateQueued, ev.State)
	require.Equal(t, []string{queue.AttemptReleased}, attempts(t, q, ev.ID))

	b := dispatch.New(q, dispatch.Options{Worker: "b"})
	t.Cleanup(b.Stop)
	b.Register(route(t, scope, u.URL+"/legacy")).Poke()
	require.Equal(t, "evt_1", <-u.entered, "the other dispatcher delivers it again (at least once)")
	close(u.block)
	waitFor(t, 20*time.Second, "delivered", func() bool { return get(t, q, scope, "evt_1").State == queue.StateDelivered })
	ev = get(t, q, scope, "evt_1")
	require.Equal(t, 1, ev.RoundAttempts, "the released attempt does not count")
	u.mu.Lock()
	require.Equal(t, "/legacy", u.uris["evt_1"], "deliver_to with a path is used as is")
	u.mu.Unlock()
}

// TestReloadHandsRouteOver: a second registration of a scope takes the
// route over (its target wins); dropping the first does not stop it.
func TestReloadHandsRouteOver(t *testing.T) {
	q := newQueue(t)
	u1, u2 := newUpstream(t, nil), newUpstream(t, nil)
	d := dispatch.New(q, dispatch.Options{IdlePoll: 20 * time.Millisecond})
	t.Cleanup(d.Stop)
	const scope = "shopify"
	r1 := d.Register(route(t, scope, u1.URL))
	r2 := d.Register(route(t, scope, u2.URL))
	d.Unregister(r1)
	enqueue(t, q, scope, "evt_after_reload")
	r2.Poke()
	waitFor(t, 20*time.Second, "delivered", func() bool {
		return get(t, q, scope, "evt_after_reload").State == queue.StateDelivered
	})
	require.Equal(t, 1, u2.callsOf("evt_after_reload"))
	require.Zero(t, u1.callsOf("evt_after_reload"))
}
