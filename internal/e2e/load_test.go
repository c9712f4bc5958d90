package e2e_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// sentDelivery is one delivery a test sent and what it got.
type sentDelivery struct {
	id  string
	gw  int
	r   e2e.Result
	err error
}

// providerLoad sends deliveries from its workers to gateways picked at
// random, as providers do during an outage: 3 in 10 are redeliveries of an
// event already sent, and a worker backs off 50ms after an answer that is
// not a 2xx. It runs until halt (or ctx ends, each delivery bounded by 15s
// and each worker by 20,000 deliveries).
type providerLoad struct {
	mu    sync.Mutex
	sent  []sentDelivery
	known []string // every event ID sent, once
	stop  chan struct{}
	wg    sync.WaitGroup
}

func startLoad(ctx context.Context, b *bundle, gws []*e2e.Gateway, workers int) *providerLoad {
	l := &providerLoad{stop: make(chan struct{})}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for range 20_000 {
				select {
				case <-l.stop:
					return
				default:
				}
				l.mu.Lock()
				id := e2e.NewEventID()
				if len(l.known) > 0 && rng.IntN(10) < 3 {
					id = l.known[rng.IntN(len(l.known))] // a redelivery
				} else {
					l.known = append(l.known, id)
				}
				l.mu.Unlock()
				gi := rng.IntN(len(gws))
				dctx, dcancel := context.WithTimeout(ctx, 15*time.Second)
				r, err := e2e.Deliver(dctx, b.client, gws[gi].URL(), b.secret, id)
				dcancel()
				l.mu.Lock()
				l.sent = append(l.sent, sentDelivery{id: id, gw: gi, r: r, err: err})
				l.mu.Unlock()
				if err != nil || !r.OK() {
					time.Sleep(50 * time.Millisecond) // a provider backs off
				}
			}
		}()
	}
	return l
}

// outage takes the database down, waits gap, brings it up again, and
// returns when each step began and ended; a step's error fails the test.
func outage(t *testing.T, down func() error, gap time.Duration, up func() error) (downBegin, downEnd, upBegin, upEnd time.Time) {
	t.Helper()
	downBegin = time.Now()
	require.NoError(t, down())
	downEnd = time.Now()
	time.Sleep(gap)
	upBegin = time.Now()
	require.NoError(t, up())
	return downBegin, downEnd, upBegin, time.Now()
}

// resumedAfter waits at most 30s for a delivery started after t to be
// forwarded and returns the earliest end of one, or the zero time.
func (l *providerLoad) resumedAfter(t time.Time) time.Time {
	resumed := time.Time{}
	for deadline := time.Now().Add(30 * time.Second); resumed.IsZero() && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		l.mu.Lock()
		for _, s := range l.sent {
			if s.r.Start.After(t) && s.r.Forwarded() && (resumed.IsZero() || s.r.End.Before(resumed)) {
				resumed = s.r.End
			}
		}
		l.mu.Unlock()
	}
	return resumed
}

// haltAfterResume waits (resumedAfter) for service to resume after t, keeps
// the load on for 2s more, then halts it; it returns resumedAfter's time.
func (l *providerLoad) haltAfterResume(t time.Time) time.Time {
	resumed := l.resumedAfter(t)
	time.Sleep(2 * time.Second)
	l.halt()
	return resumed
}

// halt stops the load and waits for its workers; sent and known are then
// the test's to read.
func (l *providerLoad) halt() {
	close(l.stop)
	l.wg.Wait()
}

// unanswered returns the events answered 2xx (with also, answered
// elsewhere) and, in the order sent, those that were not. No delivery may
// have failed in transport: the gateways stay up throughout.
func (l *providerLoad) unanswered(t *testing.T, also ...string) (map[string]bool, []string) {
	t.Helper()
	ok := map[string]bool{}
	for _, s := range l.sent {
		require.NoError(t, s.err, "transport error: the gateways stay up throughout")
		if s.r.OK() {
			ok[s.id] = true
		}
	}
	for _, id := range also {
		ok[id] = true
	}
	var pending []string
	for _, id := range l.known {
		if !ok[id] {
			pending = append(pending, id)
		}
	}
	return ok, pending
}

// redeliverUntilOK sends each event, as a provider retries, to the gateways
// in turn every 200ms until one answers 2xx, for at most the lease plus 20s
// an event, eight events at a time, and returns every delivery sent.
func redeliverUntilOK(t *testing.T, ctx context.Context, b *bundle, gws []*e2e.Gateway, ids []string, lease time.Duration) []sentDelivery {
	t.Helper()
	var (
		mu    sync.Mutex
		out   []sentDelivery
		next  = make(chan string)
		wg    sync.WaitGroup
		tries = int((lease+20*time.Second)/(200*time.Millisecond)) + 1
	)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range next {
				for i := range tries {
					g := (w + i) % len(gws)
					r, err := e2e.Deliver(ctx, b.client, gws[g].URL(), b.secret, id)
					mu.Lock()
					out = append(out, sentDelivery{id: id, gw: g, r: r, err: err})
					mu.Unlock()
					if err == nil && r.OK() {
						break
					}
					time.Sleep(200 * time.Millisecond)
				}
			}
		}()
	}
	for _, id := range ids {
		next <- id
	}
	close(next)
	wg.Wait()
	return out
}
