package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zapcore"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/claim"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// TestForwardEndVerdict: what a forward's end means for its claims.
func TestForwardEndVerdict(t *testing.T) {
	t.Parallel()
	traced := func(connTried, wrote bool) *wireTrace {
		w := new(wireTrace)
		w.connTried.Store(connTried)
		w.wrote.Store(wrote)
		return w
	}
	eof := caddyhttp.Error(502, io.EOF)
	for _, tc := range []struct {
		name string
		end  forwardEnd
		want verdict
	}{
		{"200", forwardEnd{status: 200}, verdictComplete},
		{"204 then body cut (ErrAbortHandler)", forwardEnd{status: 204, panicked: true}, verdictComplete},
		{"200 then copy error", forwardEnd{status: 200, err: io.ErrUnexpectedEOF}, verdictComplete},
		{"500", forwardEnd{status: 500}, verdictRelease},
		{"500 then body cut", forwardEnd{status: 500, panicked: true}, verdictRelease},
		{"404", forwardEnd{status: 404, wire: traced(true, true)}, verdictRelease},
		{"EOF after the request", forwardEnd{err: eof, wire: traced(true, true)}, verdictAmbiguous},
		{"EOF, transport not used", forwardEnd{err: eof}, verdictAmbiguous},
		{"EOF, nothing written", forwardEnd{err: eof, wire: traced(true, false)}, verdictRelease},
		{"refused", forwardEnd{err: caddyhttp.Error(502, reverseproxy.NewDialError(syscall.ECONNREFUSED))}, verdictRelease},
		{"timeout after the request", forwardEnd{timedOut: true, wire: traced(true, true)}, verdictAmbiguous},
		{"timeout while dialing", forwardEnd{timedOut: true, err: context.DeadlineExceeded, wire: traced(true, false)}, verdictRelease},
		{"timeout, transport not used", forwardEnd{timedOut: true}, verdictAmbiguous},
		{"panic before a status", forwardEnd{panicked: true}, verdictAmbiguous},
		{"no status, no error", forwardEnd{}, verdictRelease},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tc.end.verdict())
		})
	}
}

// TestForwardSurvivesPanic: a next handler that panics (reverse_proxy's
// http.ErrAbortHandler when the upstream's body is cut, or any other
// value) still settles the claim exactly once, balances the in-flight
// gauge, logs the delivery with its outcome, and the panic is raised again
// with its own value. Also for passOn (on_missing_id forward).
func TestForwardSurvivesPanic(t *testing.T) {
	t.Parallel()
	const secret = "whsec_panic"
	type custom struct{ msg string }
	for _, tc := range []struct {
		name    string
		policy  string
		value   any
		status  int // written before the panic, 0 = none
		state   store.State
		outcome string
	}{
		{"abort after 200", "hold", http.ErrAbortHandler, 200, store.StateCompleted, outcomeCompleted},
		{"abort after 200 reforward", "reforward", http.ErrAbortHandler, 200, store.StateCompleted, outcomeCompleted},
		{"abort after 503", "hold", http.ErrAbortHandler, 503, store.StateReleased, outcomeReleased},
		{"abort before a status hold", "hold", http.ErrAbortHandler, 0, store.StateHeld, outcomeAmbiguous},
		{"abort before a status reforward", "reforward", http.ErrAbortHandler, 0, store.StateReleased, outcomeAmbiguousReleased},
		{"custom panic after 201", "hold", custom{"boom"}, 201, store.StateCompleted, outcomeCompleted},
		{"custom panic before a status", "hold", custom{"boom"}, 0, store.StateHeld, outcomeAmbiguous},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := newUpstream()
			up.respond = func(w http.ResponseWriter, _ *http.Request, _ int) error {
				if tc.status != 0 {
					w.WriteHeader(tc.status)
					_, _ = io.WriteString(w, "partial")
				}
				panic(tc.value)
			}
			scope := uniqueScope("panic")
			g := newGateway(t, `webhook_idempotency {
				provider stripe
				secret `+secret+`
				scope `+scope+`
				on_ambiguous `+tc.policy+`
			}`, withUpstream(up))
			id := "evt_panic_" + randomHex(4)
			body := []byte(`{"id":"` + id + `","object":"event"}`)

			var recovered any
			func() {
				defer func() { recovered = recover() }()
				g.serve(g.stripe(secret, body, g.clock.Unix()))
			}()
			require.Equal(t, tc.value, recovered, "the panic is raised again with its own value")
			require.Equal(t, 1, up.count())
			ev := g.requireRow(scope, id, tc.state)
			require.Equal(t, 1, ev.Attempts)
			if tc.state == store.StateHeld {
				require.Equal(t, "the next handler panicked before an upstream status arrived; the upstream may have run the event", ev.HoldReason)
			}
			require.Equal(t, 0.0, gaugeValue(t, metrics.inFlight.WithLabelValues(scope)), "claims_in_flight balanced")
			lines := g.deliveryLog()
			require.Len(t, lines, 1, "one delivery line")
			require.Equal(t, tc.outcome, lines[0]["outcome"])
			require.EqualValues(t, tc.status, lines[0]["status"])
			require.Equal(t, 1.0, g.outcomes(tc.outcome))
			// Settled exactly once: no settle was retried or refused.
			require.Empty(t, g.logged("lease lost"))
			require.Empty(t, g.logged("settling event failed"))

			// The provider's retry: completed → duplicate; held → 503;
			// released → forwarded again.
			up.respond = nil
			a := g.serve(g.stripe(secret, body, g.clock.Unix()))
			switch tc.state {
			case store.StateCompleted:
				requireDuplicate(t, a)
				require.Equal(t, 1, up.count())
			case store.StateHeld:
				requireRefused(t, a, http.StatusServiceUnavailable, "held")
				require.Equal(t, 1, up.count())
			default:
				requireRelayed(t, a)
				require.Equal(t, 2, up.count())
			}
		})
	}

	t.Run("passOn", func(t *testing.T) {
		t.Parallel()
		up := newUpstream()
		up.respond = func(w http.ResponseWriter, _ *http.Request, _ int) error {
			w.WriteHeader(http.StatusOK)
			panic(http.ErrAbortHandler)
		}
		g := newGateway(t, `webhook_idempotency {
			provider stripe
			secret `+secret+`
			on_missing_id forward
		}`, withUpstream(up))
		var recovered any
		func() {
			defer func() { recovered = recover() }()
			g.serve(g.stripe(secret, []byte(`{"object":"event"}`), g.clock.Unix()))
		}()
		require.Equal(t, http.ErrAbortHandler, recovered)
		require.Equal(t, 1, up.count())
		require.Empty(t, g.rows())
		lines := g.deliveryLog()
		require.Len(t, lines, 1)
		require.Equal(t, outcomeForwardedNoID, lines[0]["outcome"])
		require.EqualValues(t, 200, lines[0]["status"])
	})
}

// panicTransport is a RoundTripper that panics, as a faulty custom one would.

// TestCase_BR05_ConcurrentDuplicatesRace: 20 copies at once, alternating
// between two gateway instances (own pools, own caches) on one PostgreSQL:
// the database's unique key lets exactly one through.
//
// Origin: field case BR-05 of the project's case list (formerly cases_test.go,
// where the field cases were grouped by report).
func TestCase_BR05_ConcurrentDuplicatesRace(t *testing.T) {
	t.Parallel()
	const secret = "whsec_test_BR05"
	const cfg = `webhook_idempotency {
		provider stripe
		secret whsec_test_BR05
	}`
	body := []byte(`{"id":"evt_BR05_0001","object":"event","type":"checkout.session.completed"}`)
	up := newUpstream()
	up.respond = func(w http.ResponseWriter, _ *http.Request, _ int) error {
		time.Sleep(2 * time.Second) // the case's slow upstream
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "ok")
		return nil
	}
	g1 := newGateway(t, cfg, onPostgres(), withUpstream(up), asInstance("br05_gw1"))
	g2 := newGateway(t, cfg, sharingStore(g1), asInstance("br05_gw2"))
	require.NotSame(t, g1.h.backend, g2.h.backend, "two instances, two pools")

	type outcome struct {
		a    answer
		done time.Time
	}
	results := make([]outcome, 20)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range results {
		gw := g1
		if i%2 == 1 {
			gw = g2
		}
		req := gw.stripe(secret, body, gw.clock.Unix())
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i] = outcome{a: gw.serve(req), done: time.Now()}
		}()
	}
	close(start)
	wg.Wait()

	require.Equal(t, 1, up.count(), "exactly one forward")
	winner := up.call(t, 0)
	forwarded := 0
	for i, r := range results {
		switch {
		case r.a.status == http.StatusOK && r.a.header.Get("Idempotent-Replayed") == "":
			forwarded++
			require.Equal(t, "ok", string(r.a.body))
		case r.a.status >= 200 && r.a.status < 300:
			requireDuplicate(t, r.a)
			require.False(t, r.done.Before(winner.Returned), "copy %d got 2xx before the winner's upstream answered", i)
		default:
			require.Contains(t, []int{http.StatusConflict, http.StatusTooEarly, http.StatusServiceUnavailable}, r.a.status,
				"copy %d: %s", i, r.a.body)
			require.NotEmpty(t, r.a.header.Get("Retry-After"), "copy %d", i)
		}
	}
	require.Equal(t, 1, forwarded)
	rows := g1.rows()
	require.Len(t, rows, 1)
	require.Equal(t, "evt_BR05_0001", rows[0].EventID)
	require.Equal(t, store.StateCompleted, rows[0].State)
	require.Equal(t, 1, rows[0].Attempts)

	// The 21st copy, 10 s later, to the instance that did not forward.
	g1.clock.Advance(10 * time.Second)
	for _, gw := range []*gateway{g1, g2} {
		requireDuplicate(t, gw.serve(gw.stripe(secret, body, gw.clock.Unix())))
	}
	require.Equal(t, 1, up.count())
}

// TestCase_BR06_InFlightDuplicateAndFailedFirst: a duplicate of an event in
// flight is never acked 2xx; any non-2xx from the upstream releases the
// claim, so the provider's retry is forwarded.
//
// Origin: field case BR-06 of the project's case list (formerly cases_test.go,
// where the field cases were grouped by report).
func TestCase_BR06_InFlightDuplicateAndFailedFirst(t *testing.T) {
	t.Parallel()
	for _, first := range []int{http.StatusServiceUnavailable, http.StatusBadRequest} {
		t.Run(strconv.Itoa(first), func(t *testing.T) {
			t.Parallel()
			eachBackend(t, func(t *testing.T, backend gatewayOption) {
				const secret = "whsec_test_BR06"
				body := []byte(`{"id":"evt_BR06_0001","object":"event","type":"invoice.payment_failed"}`)
				up := newUpstream()
				up.entered = make(chan int, 10)
				release := make(chan struct{})
				up.respond = func(w http.ResponseWriter, r *http.Request, n int) error {
					if n == 1 {
						<-release
						return answerWith(first, "application/json", `{"error":"upstream says no"}`)(w, r, n)
					}
					return answerWith(http.StatusOK, "text/plain", "ok")(w, r, n)
				}
				g := newGateway(t, `webhook_idempotency {
					provider stripe
					secret whsec_test_BR06
				}`, backend, withUpstream(up))

				reqA := g.stripe(secret, body, g.clock.Unix())
				sigA := reqA.Header.Get("Stripe-Signature")
				aDone := make(chan answer, 1)
				go func() { aDone <- g.serve(reqA) }()
				require.Equal(t, 1, <-up.entered)

				// B: identical bytes while A is in flight.
				b := g.serve(newDelivery("http://gateway.test/webhooks/stripe", body,
					"Content-Type", "application/json", "Stripe-Signature", sigA))
				requireRefused(t, b, http.StatusConflict, "being processed")
				ra, err := strconv.Atoi(b.header.Get("Retry-After"))
				require.NoError(t, err)
				require.GreaterOrEqual(t, ra, 1)
				require.LessOrEqual(t, ra, 30, "at most the lease")
				g.requireRow("stripe", "evt_BR06_0001", store.StateProcessing)

				close(release)
				a := <-aDone
				require.Equal(t, first, a.status, "A gets the upstream's answer")
				require.JSONEq(t, `{"error":"upstream says no"}`, string(a.body))
				g.requireRow("stripe", "evt_BR06_0001", store.StateReleased)

				// C: fresh t, 5 s later: forwarded, 200.
				g.clock.Advance(5 * time.Second)
				requireRelayed(t, g.serve(g.stripe(secret, body, g.clock.Unix())))
				require.Equal(t, 2, up.count())
				g.requireForwarded(1, body, "application/json")
				e := g.requireRow("stripe", "evt_BR06_0001", store.StateCompleted)
				require.Equal(t, 2, e.Attempts)
				require.Equal(t, http.StatusOK, e.Status)

				requireDuplicate(t, g.serve(g.stripe(secret, body, g.clock.Unix())))
				require.Equal(t, 2, up.count())
			})
		})
	}
}

// TestCase_BR07_AmbiguousOutcome: (a) forward_timeout ends a forward whose
// upstream never answers, while the provider has gone away; (b) a gateway
// dies after claiming, before forwarding; (c) it dies after forwarding.
// reforward forwards the retry after the lease; hold parks the event.
//
// Origin: field case BR-07 of the project's case list (formerly cases_test.go,
// where the field cases were grouped by report).
func TestCase_BR07_AmbiguousOutcome(t *testing.T) {
	t.Parallel()
	const secret = "whsec_test_BR07"
	const id = "evt_BR07_0001"
	body := []byte(`{"id":"evt_BR07_0001","object":"event","type":"payment_intent.succeeded"}`)
	const lease = time.Second
	cfg := func(onAmbiguous string) string {
		return `webhook_idempotency {
			provider stripe
			secret whsec_test_BR07
			scope ` + uniqueScope("br07") + `
			lease 1s
			forward_timeout 300ms
			on_ambiguous ` + onAmbiguous + `
		}`
	}
	// firstBlocks: call 1 never answers (the upstream sleeps 30 s); later
	// calls answer 200.
	firstBlocks := func() *upstream {
		up := newUpstream()
		up.entered = make(chan int, 100)
		up.respond = func(w http.ResponseWriter, r *http.Request, n int) error {
			if n == 1 {
				return blockUntilDone(w, r, n)
			}
			return answerWith(http.StatusOK, "text/plain", "ok")(w, r, n)
		}
		return up
	}
	// untilNot409 retries until the answer is not 409, checking that no
	// 409 outlives the lease (measured from since) and nothing is
	// forwarded meanwhile.
	untilNot409 := func(t *testing.T, g *gateway, since time.Time, forwardedBefore int) answer {
		var a answer
		require.Eventually(t, func() bool {
			a = g.serve(g.stripe(secret, body, g.clock.Unix()))
			if a.status != http.StatusConflict {
				return true
			}
			ra, err := strconv.Atoi(a.header.Get("Retry-After"))
			require.NoError(t, err)
			require.LessOrEqual(t, ra, int(lease/time.Second))
			require.Equal(t, forwardedBefore, g.up.count(), "a 409 never forwards")
			return false
		}, lease+3*time.Second, 50*time.Millisecond)
		require.Less(t, time.Since(since), lease+3*time.Second, "409 for no longer than the lease")
		return a
	}

	t.Run("a forward_timeout", func(t *testing.T) {
		t.Parallel()
		for _, mode := range []string{"reforward", "hold"} {
			t.Run(mode, func(t *testing.T) {
				t.Parallel()
				eachBackend(t, func(t *testing.T, backend gatewayOption) {
					g := newGateway(t, cfg(mode), backend, withUpstream(firstBlocks()))
					scope := g.h.Scope
					// The provider gives up on its side mid-forward.
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					req := withReplacer(g.stripe(secret, body, g.clock.Unix()).WithContext(ctx))
					done := make(chan answer, 1)
					go func() { done <- g.serve(req) }()
					require.Equal(t, 1, <-g.up.entered)
					cancel()
					a := <-done
					ended := time.Now()
					require.Equal(t, http.StatusGatewayTimeout, a.status, "the proxy's own error")
					c := g.up.call(t, 0)
					require.ErrorIs(t, c.CtxErr, context.DeadlineExceeded,
						"the upstream call was ended by forward_timeout, not by the provider leaving")
					// The deadline started before the request reached the
					// upstream, so the upstream sees a little less than 300 ms;
					// a forward cut by the provider leaving would end at once.
					require.GreaterOrEqual(t, c.Returned.Sub(c.Entered), 150*time.Millisecond)
					require.Equal(t, 1.0, g.outcomes(outcomeAmbiguous)+g.outcomes(outcomeAmbiguousReleased))
					require.Zero(t, g.outcomes(outcomeReleased), "an ambiguous ending is never counted as a plain release")

					g.clock.Advance(60 * time.Second) // the provider's retry
					switch mode {
					case "reforward":
						require.Equal(t, 1.0, g.outcomes(outcomeAmbiguousReleased))
						require.Len(t, g.logged("forward ended with no known outcome; the event is released and its next delivery forwarded again (on_ambiguous reforward)"), 1)
						require.Equal(t, 1, g.requireRow(scope, id, store.StateReleased).Ambiguous)
						requireRelayed(t, g.serve(g.stripe(secret, body, g.clock.Unix())))
						require.Equal(t, 2, g.up.count(), "at-least-once edge: forwarded again")
						require.Len(t, g.logged(reforwardWarning), 1, "the re-forward is warned about")
						require.Equal(t, 1.0, counterValue(t, g.h.ambiguousReforwards))
						g.requireRow(scope, id, store.StateCompleted)
					case "hold":
						require.Equal(t, 1.0, g.outcomes(outcomeAmbiguous))
						a = untilNot409(t, g, ended, 1)
						requireRefused(t, a, http.StatusServiceUnavailable, "may still be running")
						require.Empty(t, a.header.Get("Retry-After"), "nothing changes by itself: no Retry-After")
						require.Contains(t, g.requireRow(scope, id, store.StateHeld).HoldReason, "may still be running")
						requireRefused(t, g.serve(g.stripe(secret, body, g.clock.Unix())), http.StatusServiceUnavailable, "held")
						require.Equal(t, 1, g.up.count(), "held: not forwarded")
						g.requireRow(scope, id, store.StateHeld)
						require.GreaterOrEqual(t, g.outcomes(outcomeHeld), 2.0)
						// An operator releases it: the next delivery is forwarded.
						require.NoError(t, g.h.backend.Resolve(context.Background(), scope, id, store.StateReleased))
						requireRelayed(t, g.serve(g.stripe(secret, body, g.clock.Unix())))
						require.Equal(t, 2, g.up.count())
						g.requireRow(scope, id, store.StateCompleted)
					}
				})
			})
		}
	})

	// deadGateway is what a gateway killed mid-delivery leaves: a claim
	// nobody renews, and (afterForward) a delivery the upstream received.
	deadGateway := func(t *testing.T, g *gateway, afterForward bool) time.Time {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := g.h.backend.Claim(ctx, store.ClaimParams{
			Scope: g.h.Scope, EventID: id, Lease: lease, HoldOnExpiry: g.h.OnAmbiguous == "hold",
		})
		require.NoError(t, err)
		require.Equal(t, store.Claimed, c.Outcome)
		claimed := time.Now()
		if afterForward {
			req := g.stripe(secret, body, g.clock.Unix())
			rec := httptest.NewRecorder()
			require.NoError(t, g.up.ServeHTTP(rec, req))
			<-g.up.entered
		}
		return claimed
	}

	t.Run("b killed before forwarding", func(t *testing.T) {
		t.Parallel()
		eachBackend(t, func(t *testing.T, backend gatewayOption) {
			up := newUpstream()
			g := newGateway(t, cfg("reforward"), backend, withUpstream(up))
			claimed := deadGateway(t, g, false)
			// A retry inside the lease: 409 with Retry-After, not forwarded.
			a := g.serve(g.stripe(secret, body, g.clock.Unix()))
			requireRefused(t, a, http.StatusConflict, "being processed")
			require.Equal(t, "1", a.header.Get("Retry-After"))
			require.Equal(t, 0, up.count())
			// After the lease, concurrent retries: exactly one takes over.
			waitLeaseOver(t, g, g.h.Scope, id, claimed.Add(lease))
			var wg sync.WaitGroup
			answers := make([]answer, 8)
			for i := range answers {
				req := g.stripe(secret, body, g.clock.Unix())
				wg.Add(1)
				go func() { defer wg.Done(); answers[i] = g.serve(req) }()
			}
			wg.Wait()
			relayed := 0
			for _, a := range answers {
				switch {
				case a.status == http.StatusOK && a.header.Get("Idempotent-Replayed") == "":
					relayed++
				case a.status == http.StatusOK:
					requireDuplicate(t, a)
				default:
					require.Equal(t, http.StatusConflict, a.status, "%s", a.body)
				}
			}
			require.Equal(t, 1, relayed)
			require.Equal(t, 1, up.count(), "the dead gateway never sent it: one forward in total")
			e := g.requireRow(g.h.Scope, id, store.StateCompleted)
			require.Equal(t, 2, e.Attempts)
		})
	})

	t.Run("c killed after forwarding", func(t *testing.T) {
		t.Parallel()
		for _, mode := range []string{"reforward", "hold"} {
			t.Run(mode, func(t *testing.T) {
				t.Parallel()
				eachBackend(t, func(t *testing.T, backend gatewayOption) {
					up := newUpstream()
					up.entered = make(chan int, 100)
					g := newGateway(t, cfg(mode), backend, withUpstream(up))
					claimed := deadGateway(t, g, true)
					require.Equal(t, 1, up.count())
					a := untilNot409(t, g, claimed, 1)
					switch mode {
					case "reforward":
						requireRelayed(t, a)
						require.Equal(t, 2, up.count(), "documented at-least-once edge")
						require.Equal(t, 1, g.requireRow(g.h.Scope, id, store.StateCompleted).Ambiguous,
							"the expired lease counts as an ambiguous ending")
						require.Len(t, g.logged(reforwardWarning), 1, "the re-forward after an expired lease is warned about")
						require.Equal(t, 1.0, counterValue(t, g.h.ambiguousReforwards))
					case "hold":
						requireRefused(t, a, http.StatusServiceUnavailable, "held")
						require.Empty(t, a.header.Get("Retry-After"))
						require.Equal(t, 1, up.count())
						e := g.requireRow(g.h.Scope, id, store.StateHeld)
						require.Equal(t, store.HoldLeaseExpired, e.HoldReason)
						require.Len(t, g.logged(heldNowLog), 1, "a lease-expiry hold has its log line")
						// An operator completes it: later deliveries are duplicates.
						require.NoError(t, g.h.backend.Resolve(context.Background(), g.h.Scope, id, store.StateCompleted))
						requireDuplicate(t, g.serve(g.stripe(secret, body, g.clock.Unix())))
						require.Equal(t, 1, up.count())
					}
				})
			})
		}
	})
}

// The log lines of an event forwarded again after an ending that may have
// run it, and of a claim that held an event whose lease expired.
const (
	reforwardWarning = "forwarding an event again that an earlier forward may already have run (it ended with no known outcome, or its lease expired); the upstream may run it twice"
	heldNowLog       = "event held: its claim's lease expired before its forward settled; the upstream may have run it, or may still be running it (on_ambiguous hold)"
)

// An upstream slower than forward_timeout, under on_ambiguous reforward
// (issue 21, item 7: an 11 s app behind forward_timeout 8s ran once per
// delivery, 8 of 8): every forward ends ambiguously. The first is released
// and forwarded again once, with a warning; the second ambiguous ending
// holds the event: 2 executions for 8 deliveries, the hold's answer and
// reason saying the upstream may still be running, with no Retry-After.
func TestAmbiguousReforwardBound(t *testing.T) {
	t.Parallel()
	const secret = "whsec_bound"
	body := []byte(`{"id":"evt_bound_1","object":"event","type":"charge.succeeded"}`)
	eachBackend(t, func(t *testing.T, backend gatewayOption) {
		up := newUpstream()
		up.entered = make(chan int, 100)
		up.respond = func(w http.ResponseWriter, r *http.Request, n int) error {
			// Slower than forward_timeout: it finishes the work after the
			// gateway has given up (the upstream's side effect is counted
			// on entry, as the apps' databases counted theirs).
			return blockUntilDone(w, r, n)
		}
		scope := uniqueScope("bound")
		g := newGateway(t, `webhook_idempotency {
			provider stripe
			secret `+secret+`
			scope `+scope+`
			forward_timeout 200ms
			on_ambiguous reforward
		}`, backend, withUpstream(up))
		var statuses []int
		for range 8 {
			g.clock.Advance(time.Minute) // the provider's next retry
			a := g.serve(g.stripe(secret, body, g.clock.Unix()))
			statuses = append(statuses, a.status)
			if a.status == http.StatusServiceUnavailable {
				requireRefused(t, a, http.StatusServiceUnavailable, "may still be running")
				require.Empty(t, a.header.Get("Retry-After"))
			}
		}
		require.Equal(t, 2, up.count(), "upstream executions for 8 deliveries")
		require.Equal(t, []int{504, 504, 503, 503, 503, 503, 503, 503}, statuses)
		e := g.requireRow(scope, "evt_bound_1", store.StateHeld)
		require.Equal(t, 2, e.Ambiguous)
		require.Contains(t, e.HoldReason, "a second forward ended with no known outcome")
		require.Contains(t, e.HoldReason, "may still be running")
		require.Equal(t, 1.0, g.outcomes(outcomeAmbiguousReleased))
		require.Equal(t, 1.0, g.outcomes(outcomeAmbiguous))
		require.Equal(t, 6.0, g.outcomes(outcomeHeld))
		require.Zero(t, g.outcomes(outcomeReleased))
		require.Equal(t, 1.0, counterValue(t, g.h.ambiguousReforwards))
		require.Len(t, g.logged(reforwardWarning), 1)
		// An operator who releases it gives it one more forward, which may
		// end ambiguously once before it is held again.
		require.NoError(t, g.h.backend.Resolve(context.Background(), scope, "evt_bound_1", store.StateReleased))
		require.Equal(t, http.StatusGatewayTimeout, g.serve(g.stripe(secret, body, g.clock.Unix())).status)
		require.Equal(t, 3, up.count())
		g.requireRow(scope, "evt_bound_1", store.StateHeld)
	})
}

// waitLeaseOver waits until the claim's lease has passed by the database's
// clock (the store judges expiry with now(); the database runs on this
// host, so its clock is ours).
func waitLeaseOver(t *testing.T, g *gateway, scope, id string, notBefore time.Time) {
	t.Helper()
	e, err := g.row(scope, id)
	require.NoError(t, err)
	until := e.LeaseUntil
	if until.IsZero() {
		until = notBefore
	}
	time.Sleep(time.Until(until.Add(50 * time.Millisecond))) // the database's clock cannot be injected
}

// TestCase_BR10_UnsignedDeliveryIDReplay: a captured GitHub delivery
// resent under a fresh X-GitHub-Delivery is caught by dedupe_body; the
// controls show the ID is safe where the signature covers it.
//
// Origin: field case BR-10 of the project's case list (formerly cases_test.go,
// where the field cases were grouped by report).
func TestCase_BR10_UnsignedDeliveryIDReplay(t *testing.T) {
	t.Parallel()
	const secret = "gh_BR10"
	scope := uniqueScope("br10")
	g := newGateway(t, `webhook_idempotency {
		provider github
		secret gh_BR10
		scope `+scope+`
	}`)
	// D1: a valid SIG-GH256 delivery.
	d1 := []byte(`{"ref":"refs/heads/main","after":"0000000000000000000000000000000000bb1010","repository":{"full_name":"octo/br10"}}`)
	requireRelayed(t, g.serve(githubDelivery(secret, d1, "99999999-0000-4000-8000-000000000008")))
	require.Equal(t, 1, g.up.count())

	// (a) the same body and signature under a fresh delivery ID.
	replayed := g.outcomes(outcomeBodyReplay)
	a := g.serve(githubDelivery(secret, d1, "99999999-0000-4000-8000-000000000010"))
	requireDuplicate(t, a)
	require.Equal(t, 1, g.up.count(), "not forwarded")
	require.Equal(t, replayed+1, g.outcomes(outcomeBodyReplay), "counted")
	warns := g.logged("body already delivered under another event id")
	require.Len(t, warns, 1)
	require.Equal(t, "99999999-0000-4000-8000-000000000010", warns[0].ContextMap()["event_id"])
	// The fresh ID did not become a completed event.
	e, err := g.row(scope, "99999999-0000-4000-8000-000000000010")
	if err == nil {
		require.NotEqual(t, store.StateCompleted, e.State)
	}

	// (d) two genuinely different deliveries: both forwarded.
	d2 := []byte(`{"ref":"refs/heads/main","after":"0000000000000000000000000000000000bb1011","repository":{"full_name":"octo/br10"}}`)
	d3 := []byte(`{"ref":"refs/heads/dev","after":"0000000000000000000000000000000000bb1012","repository":{"full_name":"octo/br10"}}`)
	requireRelayed(t, g.serve(githubDelivery(secret, d2, "99999999-0000-4000-8000-000000000011")))
	requireRelayed(t, g.serve(githubDelivery(secret, d3, "99999999-0000-4000-8000-000000000012")))
	require.Equal(t, 3, g.up.count())
	g.requireForwarded(1, d2, "application/json")
	g.requireForwarded(2, d3, "application/json")

	// (b) control, Stripe: the same processed delivery with an extra
	// X-Request-Id: the ID is in the signed body.
	st := newGateway(t, `webhook_idempotency {
		provider stripe
		secret whsec_test_BR10
	}`)
	sb := []byte(`{"id":"evt_BR10_0001","object":"event","type":"invoice.paid"}`)
	req := st.stripe("whsec_test_BR10", sb, st.clock.Unix())
	sig := req.Header.Get("Stripe-Signature")
	requireRelayed(t, st.serve(req))
	st.clock.Advance(30 * time.Second) // within tolerance
	requireDuplicate(t, st.serve(newDelivery("http://gateway.test/webhooks/stripe", sb,
		"Content-Type", "application/json", "Stripe-Signature", sig, "X-Request-Id", "req_"+randomHex(4))))
	require.Equal(t, 1, st.up.count())

	// (c) control, Standard Webhooks: webhook-id is signed.
	const swSecret = "whsec_QlIxMC10ZXN0LWtleS0wMTIzNDU2Nzg5YWJjZGVmISE="
	sw := newGateway(t, `webhook_idempotency {
		provider standard
		secret `+swSecret+`
	}`)
	key := swKey(t, swSecret)
	swBody := []byte(`{"type":"invoice.paid","data":{"id":"inv_BR10"}}`)
	now := sw.clock.Unix()
	sigSW := "v1," + swSig(key, "msg_BR10_1", now, swBody)
	swReq := func(id string) *http.Request {
		return newDelivery("http://gateway.test/webhooks/standard", swBody, "Content-Type", "application/json",
			"webhook-id", id, "webhook-timestamp", strconv.FormatInt(now, 10), "webhook-signature", sigSW)
	}
	requireRelayed(t, sw.serve(swReq("msg_BR10_1")))
	requireRefused(t, sw.serve(swReq("msg_BR10_2")), http.StatusBadRequest, "no matching signature")
	require.Equal(t, 1, sw.up.count())
	sw.requireNoRow("standard", "msg_BR10_2")
}

// rowLock holds a PostgreSQL row lock on an event's row from another
// session, so that the gateway's completion of it blocks until unlock.
type rowLock struct {
	conn *pgx.Conn
	tx   pgx.Tx
}

func lockRow(t *testing.T, g *gateway, scope, id string) *rowLock {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, g.storage.DSN)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	var state string
	err = tx.QueryRow(ctx, `SELECT state FROM `+pgx.Identifier{g.storage.Table}.Sanitize()+
		` WHERE scope = $1 AND event_id = $2 FOR UPDATE`, scope, id).Scan(&state)
	require.NoError(t, err)
	require.Equal(t, string(store.StateProcessing), state, "locked while claimed")
	return &rowLock{conn: conn, tx: tx}
}

// lockingOK is an upstream answer 200 "ok" that, on call n (its claim
// committed), first locks the row of the stripe event id into *lock.
func lockingOK(t *testing.T, g *gateway, n int, id string, lock **rowLock) func(http.ResponseWriter, *http.Request, int) error {
	return func(w http.ResponseWriter, r *http.Request, call int) error {
		if call == n {
			*lock = lockRow(t, g, "stripe", id)
		}
		return answerWith(http.StatusOK, "text/plain", "ok")(w, r, call)
	}
}

func (l *rowLock) unlock(t *testing.T) {
	t.Helper()
	require.NoError(t, l.tx.Rollback(context.Background()))
}

// TestCompletionAfterAnswer: once the upstream has answered 2xx, the
// provider gets that answer without waiting for the completion's commit
// (here blocked by a row lock); a duplicate on the same handler meanwhile
// waits for the completion and is answered as a duplicate, not 409; the
// upstream runs once; Cleanup's drain waits for a completion still being
// written.
func TestCompletionAfterAnswer(t *testing.T) {
	t.Parallel()
	g := newGateway(t, `webhook_idempotency {
		provider stripe
		secret whsec_after
		cache 0
	}`, onPostgres())
	var lock *rowLock
	g.up.respond = lockingOK(t, g, 1, "evt_after", &lock)
	body := []byte(`{"id":"evt_after","object":"event"}`)

	start := time.Now()
	a := g.serve(g.stripe("whsec_after", body, g.clock.Unix()))
	requireRelayed(t, a)
	require.Less(t, time.Since(start), storeTimeout,
		"answered while the completion was blocked, not after the store gave up on it")
	require.NotNil(t, lock)

	dup := make(chan answer, 1)
	go func() { dup <- g.serve(g.stripe("whsec_after", body, g.clock.Unix())) }()
	select {
	case d := <-dup:
		t.Fatalf("duplicate answered %d before the completion was written: %s", d.status, d.body)
	case <-time.After(300 * time.Millisecond):
	}
	lock.unlock(t)
	select {
	case d := <-dup:
		requireDuplicate(t, d)
	case <-time.After(2 * storeTimeout):
		t.Fatal("duplicate not answered after the completion was written")
	}
	require.Equal(t, 1, g.up.count())
	g.requireRow("stripe", "evt_after", store.StateCompleted)

	// Cleanup's drain: a completion blocked by a lock is waited for.
	body2 := []byte(`{"id":"evt_after_2","object":"event"}`)
	g.up.respond = lockingOK(t, g, 2, "evt_after_2", &lock)
	requireRelayed(t, g.serve(g.stripe("whsec_after", body2, g.clock.Unix())))
	drained := make(chan struct{})
	go func() {
		g.h.claims.Drain()
		close(drained)
	}()
	select {
	case <-drained:
		t.Fatal("drain returned while a completion was still blocked")
	case <-time.After(300 * time.Millisecond):
	}
	lock.unlock(t)
	select {
	case <-drained:
	case <-time.After(claim.DefaultDrainFor + time.Second):
		t.Fatal("drain did not return after the completion was written")
	}
	e, err := g.h.backend.Get(context.Background(), "stripe", "evt_after_2") // no wait: the drain did it
	require.NoError(t, err)
	require.Equal(t, store.StateCompleted, e.State)
}

// TestCompletionAfterAnswerAnotherRoute: a completion one route is writing
// after its answer is awaited by another route of the same scope on the
// same store, as by the route itself: the completions being written are
// registered on the pooled store, which the handlers of a reloaded config
// share too. A duplicate through the other route is then answered as a
// duplicate, not 409, and the upstream runs once.
func TestCompletionAfterAnswerAnotherRoute(t *testing.T) {
	t.Parallel()
	cfg := `webhook_idempotency {
		provider stripe
		secret whsec_routes
		cache 0
	}`
	g1 := newGateway(t, cfg, onPostgres())
	g2 := newGateway(t, cfg, sharingStore(g1))
	require.Same(t, g1.h.backend, g2.h.backend, "two routes, one pooled store")
	var lock *rowLock
	g1.up.respond = lockingOK(t, g1, 1, "evt_routes", &lock)
	body := []byte(`{"id":"evt_routes","object":"event"}`)
	requireRelayed(t, g1.serve(g1.stripe("whsec_routes", body, g1.clock.Unix())))
	require.NotNil(t, lock)

	awaited := make(chan bool, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*storeTimeout)
		defer cancel()
		awaited <- g2.h.claims.Await(ctx, "stripe", "evt_routes")
	}()
	select {
	case ok := <-awaited:
		t.Fatalf("the other route did not wait for the completion being written (awaited: %v)", ok)
	case <-time.After(300 * time.Millisecond):
	}
	lock.unlock(t)
	require.True(t, <-awaited, "the other route waited for the completion")
	requireDuplicate(t, g2.serve(g2.stripe("whsec_routes", body, g2.clock.Unix())))
	require.Equal(t, 1, g1.up.count())
	g2.requireRow("stripe", "evt_routes", store.StateCompleted)
}

// A route with nothing after webhook_idempotency (reverse_proxy left out):
// the next handler returns without answering, and Caddy would send an
// empty 200 that ends the provider's deliveries of an event nothing ran.
// It is answered 502 and released, so the provider's retry is forwarded
// once the route is fixed; a throttled error says what to write, and
// events forwarded without a claim (on_missing_id forward) get the same.
func TestNoHandlerAfterTheDirectiveAnswers502(t *testing.T) {
	t.Parallel()
	const secret = "whsec_noupstream"
	up := newUpstream()
	silent := func(http.ResponseWriter, *http.Request, int) error { return nil }
	up.respond = silent
	g := newGateway(t, `webhook_idempotency {
		provider stripe
		secret `+secret+`
		scope noupstream
		on_missing_id forward
	}`, withUpstream(up))
	body := []byte(`{"id":"evt_noupstream_1","object":"event"}`)
	for range 3 {
		a := g.serve(g.stripe(secret, body, g.clock.Unix()))
		require.Equal(t, http.StatusBadGateway, a.status)
		require.JSONEq(t, `{"error":"no upstream handler answered"}`, string(a.body))
	}
	require.Equal(t, 3, up.count(), "each delivery was forwarded: the claim was released every time")
	ev := g.requireRow("noupstream", "evt_noupstream_1", store.StateReleased)
	require.Equal(t, 3, ev.Attempts)
	lines := g.deliveryLog()
	require.Len(t, lines, 3)
	require.Equal(t, "released", lines[0]["outcome"])
	require.EqualValues(t, 502, lines[0]["status"])
	require.Equal(t, "no upstream handler answered", lines[0]["reason"])
	errs := g.logged("no handler after webhook_idempotency answered the delivery")
	require.Len(t, errs, 1, "throttled: one line a second")
	require.Equal(t, zapcore.ErrorLevel, errs[0].Level)

	// The route fixed: the provider's next delivery runs the event once.
	up.respond = nil
	a := g.serve(g.stripe(secret, body, g.clock.Unix()))
	require.Equal(t, http.StatusOK, a.status)
	g.requireRow("noupstream", "evt_noupstream_1", store.StateCompleted)
	requireDuplicate(t, g.serve(g.stripe(secret, body, g.clock.Unix())))
	require.Equal(t, 4, up.count())

	// Without an event ID (forwarded without a claim): 502 too.
	up.respond = silent
	a = g.serve(g.stripe(secret, []byte(`{"object":"event"}`), g.clock.Unix()))
	require.Equal(t, http.StatusBadGateway, a.status)
}

// A handler after the directive that refuses the request with an error of
// its own (file_server's 405 to a POST, a 404) is answered with its status
// and says so; "upstream unavailable" is kept for the 5xx of a proxy that
// could not reach its upstream. Either way the claim is released.
func TestHandlerErrorAnswerSaysWhoRefused(t *testing.T) {
	t.Parallel()
	const secret = "whsec_handlererror"
	up := newUpstream()
	g := newGateway(t, `webhook_idempotency {
		provider stripe
		secret `+secret+`
		scope handlererror
	}`, withUpstream(up))
	for n, c := range []struct {
		err    error
		status int
		body   string
	}{
		{caddyhttp.Error(http.StatusMethodNotAllowed, nil), 405,
			`{"error":"the handler after webhook_idempotency refused the request: 405 Method Not Allowed"}`},
		{caddyhttp.Error(http.StatusBadGateway, errors.New("dial tcp: connection refused")), 502, `{"error":"upstream unavailable"}`},
		{errors.New("no status"), 502, `{"error":"upstream unavailable"}`},
	} {
		up.respond = func(http.ResponseWriter, *http.Request, int) error { return c.err }
		id := fmt.Sprintf("evt_handlererror_%d", n)
		a := g.serve(g.stripe(secret, []byte(`{"id":"`+id+`","object":"event"}`), g.clock.Unix()))
		require.Equal(t, c.status, a.status, "%v", c.err)
		require.JSONEq(t, c.body, string(a.body), "%v", c.err)
		g.requireRow("handlererror", id, store.StateReleased)
	}
}

// Handlers after the directive that refuse a delivery with an error of
// their own (file_server's 405 to a POST, the error directive) forwarded
// nothing: each delivery is answered with their status and the claim is
// released, so a retry runs again once the route is fixed. They were taken
// for an upstream cut after the request was written: the event was held
// after two deliveries (503 from then on) with a false reason (an
// adversarial trial).
func TestHandlerRefusalReleasesTheClaim(t *testing.T) {
	secret := "whsec_" + randomHex(8)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "index.html"), []byte("hi"), 0o600))
	up, forwards := countingUpstream(t)
	block := func(scope string) string {
		return fmt.Sprintf("webhook_idempotency {\n\t\t\tprovider stripe\n\t\t\tsecret %q\n\t\t\tscope %s\n\t\t\tstorage sqlite %q\n\t\t}",
			secret, uniqueScope(scope), filepath.Join(dir, "events.db"))
	}
	startCaddy(t, "{\n"+caddyTestGlobals+"}\nhttp://localhost:9080 {\n"+
		"\thandle /files/* {\n\t\t"+block("files")+"\n\t\turi strip_prefix /files\n\t\tfile_server {\n\t\t\troot "+dir+"\n\t\t}\n\t}\n"+
		"\thandle /forbidden {\n\t\t"+block("forbidden")+"\n\t\terror \"forbidden\" 403\n\t}\n"+
		"\thandle /boom {\n\t\t"+block("boom")+"\n\t\terror \"boom\" 500\n\t}\n"+
		"\thandle /after {\n\t\t"+block("after")+"\n\t\treverse_proxy "+up.Listener.Addr().String()+" {\n\t\t\t@ok status 2xx\n"+
		"\t\t\thandle_response @ok {\n\t\t\t\terror \"post-processing failed\" 500\n\t\t\t}\n\t\t}\n\t}\n"+
		"\thandle {\n\t\trespond 404\n\t}\n}\n")
	for _, c := range []struct {
		path   string
		status int
	}{{"/files/index.html", http.StatusMethodNotAllowed}, {"/forbidden", http.StatusForbidden}, {"/boom", http.StatusInternalServerError}} {
		id := "evt_refused_" + randomHex(4)
		body := stripeBody(id, "x")
		for n := range 3 {
			a := send(t, stripeRequest(t, gatewayBase+c.path, secret, body, time.Now(), id))
			require.Equal(t, c.status, a.status, "%s, delivery %d: %s", c.path, n+1, a.body)
			require.Contains(t, string(a.body), "the handler after webhook_idempotency refused the request", c.path)
		}
	}
	// The same error after the upstream answered (handle_response) is no
	// refusal: the upstream ran the event (the claim stays ambiguous).
	id := "evt_after_" + randomHex(4)
	a := send(t, stripeRequest(t, gatewayBase+"/after", secret, stripeBody(id, "x"), time.Now(), id))
	require.Equal(t, http.StatusInternalServerError, a.status)
	require.NotContains(t, string(a.body), "refused the request")
	require.Equal(t, int32(1), forwards.Load())
}
