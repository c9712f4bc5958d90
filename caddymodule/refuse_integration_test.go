package caddymodule

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// In a real Caddy: refuse_status answers a bad signature, an event ID given
// twice is 400, and neither is recorded or forwarded (issue 10, items 5, 6).
func TestGatewayRefusals(t *testing.T) {
	secret, up, routes := startGateway(t, "refuse_status 401")
	for _, backend := range []string{"postgres", "sqlite"} {
		url := routes[backend]
		t.Run(backend, func(t *testing.T) {
			idA, idB := "evt_"+randomHex(8), "evt_"+randomHex(8)
			valid := []byte(`{"id":"` + idB + `","type":"x"}`)

			r := send(t, stripeRequest(t, url, "whsec_other", valid, time.Now(), idB))
			require.Equal(t, http.StatusUnauthorized, r.status)
			require.JSONEq(t, `{"error":"no matching signature"}`, r.body)
			r = send(t, stripeRequest(t, url, secret, valid, time.Now().Add(-10*time.Minute), idB))
			require.Equal(t, http.StatusUnauthorized, r.status)
			require.JSONEq(t, `{"error":"timestamp outside tolerance"}`, r.body)

			for _, body := range []string{
				`{"id":"` + idA + `","type":"x","id":"` + idB + `"}`,
				`{"i\u0064":"` + idA + `","type":"x","id":"` + idB + `"}`,
			} {
				r = send(t, stripeRequest(t, url, secret, []byte(body), time.Now(), idB))
				require.Equal(t, http.StatusBadRequest, r.status, r.body)
				require.Contains(t, r.body, "event id given more than once")
			}
			require.Equal(t, 0, up.count(idB))

			// Nothing was recorded: evt_B is forwarded once, then a duplicate;
			// evt_A was never claimed either.
			require.Equal(t, http.StatusOK, send(t, stripeRequest(t, url, secret, valid, time.Now(), idB)).status)
			require.True(t, send(t, stripeRequest(t, url, secret, valid, time.Now(), idB)).replayed)
			require.Equal(t, 1, up.count(idB))
			validA := []byte(`{"id":"` + idA + `","type":"x"}`)
			r = send(t, stripeRequest(t, url, secret, validA, time.Now(), idA))
			require.Equal(t, http.StatusOK, r.status)
			require.False(t, r.replayed)
			require.Equal(t, 1, up.count(idA))
		})
	}
}
