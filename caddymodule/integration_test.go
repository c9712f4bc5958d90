package caddymodule

import (
	"bytes"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// These tests drive a real in-process Caddy (caddytest) with the module in
// front of a counting upstream, on the real PostgreSQL and on SQLite. Caddy's
// config and ports are global: no t.Parallel here. They skip under -short.

func TestGatewayEndToEnd(t *testing.T) {
	secret, up, routes := startGateway(t, "lease 3s")

	for _, backend := range []string{"postgres", "sqlite"} {
		url := routes[backend]

		t.Run(backend+"/first delivery forwarded with exact bytes", func(t *testing.T) {
			id := "evt_" + randomHex(8)
			req := stripeDelivery(t, url, secret, id, time.Now())
			want, _ := io.ReadAll(req.Body)
			req.Body = io.NopCloser(bytes.NewReader(want))
			r := send(t, req)
			require.Equal(t, 200, r.status)
			require.JSONEq(t, `{"upstream":true}`, r.body)
			require.False(t, r.replayed)
			require.Equal(t, 1, up.count(id))
			up.mu.Lock()
			require.Equal(t, want, up.bodies[id][0])
			up.mu.Unlock()
		})

		t.Run(backend+"/five sequential redeliveries forwarded once", func(t *testing.T) {
			id := "evt_" + randomHex(8)
			require.Equal(t, 200, send(t, stripeDelivery(t, url, secret, id, time.Now())).status)
			for range 5 {
				r := send(t, stripeDelivery(t, url, secret, id, time.Now()))
				require.Equal(t, 200, r.status)
				require.True(t, r.replayed, "Idempotent-Replayed: true")
				require.JSONEq(t, `{"received":true,"duplicate":true}`, r.body)
			}
			require.Equal(t, 1, up.count(id))
		})

		t.Run(backend+"/50 concurrent deliveries forwarded once", func(t *testing.T) {
			id := "evt_" + randomHex(8)
			up.delay.Store(int64(300 * time.Millisecond))
			defer up.delay.Store(0)
			var wg sync.WaitGroup
			results := make([]result, 50)
			for i := range results {
				wg.Add(1)
				go func() {
					defer wg.Done()
					results[i] = send(t, stripeDelivery(t, url, secret, id, time.Now()))
				}()
			}
			wg.Wait()
			var fromUpstream, inFlight, replayed int
			for _, r := range results {
				switch {
				case r.status == 200 && r.replayed:
					replayed++
				case r.status == 200:
					fromUpstream++
				case r.status == 409:
					inFlight++
					require.NotEmpty(t, r.retry, "409 carries Retry-After")
				default:
					t.Fatalf("unexpected answer %d %s", r.status, r.body)
				}
			}
			require.Equal(t, 1, fromUpstream)
			require.Equal(t, 49, inFlight+replayed)
			require.Equal(t, 1, up.count(id))
		})

		t.Run(backend+"/upstream 500 releases the claim and the retry is forwarded", func(t *testing.T) {
			id := "evt_" + randomHex(8)
			up.status.Store(500)
			r := send(t, stripeDelivery(t, url, secret, id, time.Now()))
			up.status.Store(0)
			require.Equal(t, 500, r.status)
			r = send(t, stripeDelivery(t, url, secret, id, time.Now()))
			require.Equal(t, 200, r.status)
			require.False(t, r.replayed)
			r = send(t, stripeDelivery(t, url, secret, id, time.Now()))
			require.True(t, r.replayed)
			require.Equal(t, 2, up.count(id))
		})

		t.Run(backend+"/invalid signatures are refused and not recorded", func(t *testing.T) {
			id := "evt_" + randomHex(8)
			r := send(t, stripeDelivery(t, url, "whsec_other", id, time.Now()))
			require.Equal(t, 400, r.status)
			require.Contains(t, r.body, `"error"`)
			old := send(t, stripeDelivery(t, url, secret, id, time.Now().Add(-10*time.Minute)))
			require.Equal(t, 400, old.status)
			require.NotEqual(t, r.body, old.body, "distinct reasons")
			req := stripeDelivery(t, url, secret, id, time.Now())
			req.Header.Del("Stripe-Signature")
			require.Equal(t, 400, send(t, req).status)
			require.Equal(t, 0, up.count(id))
			// Nothing was recorded: the valid delivery is forwarded.
			require.Equal(t, 200, send(t, stripeDelivery(t, url, secret, id, time.Now())).status)
			require.Equal(t, 1, up.count(id))
		})
	}
}
