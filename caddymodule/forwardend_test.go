package caddymodule

import (
	"context"
	"io"
	"net/http"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

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
		{"abort before a status reforward", "reforward", http.ErrAbortHandler, 0, store.StateReleased, outcomeReleased},
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
				require.Equal(t, "the next handler panicked before an upstream status arrived", ev.HoldReason)
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
