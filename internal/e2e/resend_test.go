package e2e_test

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// A forward reaches the upstream at most once (issue 21, item 1). An
// Idempotency-Key route forwards POST /cancel; the upstream reads it on a
// reused keep-alive connection, does the work and closes without
// answering. Go's Transport re-sends a bodyless request carrying an
// Idempotency-Key on a new connection by itself (it deems it replayable):
// the upstream ran twice inside one forward and the client got the second
// run's 201. Now every forward runs once, bodyless or not, and ends
// ambiguous: 502, then held or released as on_ambiguous says.
func TestForwardNeverResentByTransport(t *testing.T) {
	t.Parallel()
	for _, withBody := range []bool{false, true} {
		for _, policy := range []string{"reforward", "hold"} {
			name := "bodyless/" + policy
			if withBody {
				name = "json/" + policy
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, nil)
				up := b.rawUpstream(func(id string, n int) e2e.RawAction {
					if strings.HasPrefix(id, "warm") || n > 1 {
						return e2e.RawAction{Status: http.StatusCreated, BodyBytes: 2}
					}
					return e2e.RawAction{Close: true} // the work is done; no answer
				})
				g := b.start(e2e.GatewayConfig{Name: "a", Upstream: up.Addr(), Handler: []string{
					"provider idempotency_key",
					"storage postgres " + strconv.Quote(b.db.DSN),
					"on_ambiguous " + policy,
				}})
				post := func(key string) (int, string) {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					var rd io.Reader
					if withBody { // recorded by its "id" (RawUpstream)
						rd = strings.NewReader(`{"id":"` + key + `","amount":100}`)
					}
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+g.Addr+"/orders/1/cancel", rd)
					require.NoError(t, err)
					req.Header.Set("Idempotency-Key", key)
					req.Header.Set("Authorization", "Bearer tok_A")
					resp, err := b.client.Do(req)
					require.NoError(t, err)
					defer resp.Body.Close()
					got, _ := io.ReadAll(resp.Body)
					return resp.StatusCode, string(got)
				}
				// A first request leaves reverse_proxy a keep-alive
				// connection to reuse.
				status, _ := post("warm-" + e2e.NewEventID())
				require.Equal(t, http.StatusCreated, status)

				key := "cancel-" + e2e.NewEventID()
				status, answer := post(key)
				require.Equal(t, http.StatusBadGateway, status, "the dropped answer is ambiguous: %s", answer)
				require.Equal(t, 1, up.Calls(key), "one execution inside the forward")

				status, answer = post(key)
				if policy == "hold" {
					require.Equal(t, http.StatusServiceUnavailable, status, "held: %s", answer)
					require.Contains(t, answer, "held")
					require.Equal(t, 1, up.Calls(key), "not forwarded while held")
					return
				}
				require.Equal(t, http.StatusCreated, status, "released: the retry is forwarded: %s", answer)
				require.Equal(t, 2, up.Calls(key), "the documented at-least-once edge of reforward, one run per forward")
			})
		}
	}
}
