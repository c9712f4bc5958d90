package caddymodule

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// A delivery that names its event twice is refused 400 with nothing
// recorded and the upstream not called, also under on_missing_id forward:
// the gateway would key on one ID while the upstream's parser reads the
// other (issue 10, item 5).
func TestAmbiguousEventIDRefused(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, backend gatewayOption) {
		t.Run("stripe json id", func(t *testing.T) {
			for _, onMissing := range []string{"reject", "forward"} {
				scope := uniqueScope("amb_stripe")
				g := newGateway(t, `webhook_idempotency {
					provider stripe
					secret whsec_amb
					scope `+scope+`
					on_missing_id `+onMissing+`
				}`, backend)
				for _, body := range []string{
					`{"id":"evt_A","type":"x","id":"evt_B"}`,
					`{"i\u0064":"evt_A","type":"x","id":"evt_B"}`,
					`{"id":"evt_A","type":"x","ID":"evt_B"}`,
				} {
					a := g.serve(g.stripe("whsec_amb", []byte(body), g.clock.Unix()))
					requireRefused(t, a, http.StatusBadRequest, `json id: member \"id\" of the document is given 2 times: event id given more than once`)
				}
				require.Equal(t, 0, g.up.count(), "upstream calls")
				require.Empty(t, g.rows(), "nothing recorded")
				for _, l := range g.deliveryLog() {
					require.Equal(t, outcomeBadRequest, l["outcome"])
				}
				require.Equal(t, 3.0, g.outcomes(outcomeBadRequest))
				// The unambiguous delivery of evt_B is forwarded once.
				body := []byte(`{"id":"evt_B","type":"x"}`)
				requireRelayed(t, g.serve(g.stripe("whsec_amb", body, g.clock.Unix())))
				requireDuplicate(t, g.serve(g.stripe("whsec_amb", body, g.clock.Unix())))
				require.Equal(t, 1, g.up.count())
				g.requireRow(scope, "evt_B", store.StateCompleted)
			}
		})

		t.Run("nested json path", func(t *testing.T) {
			const secret = "gen_amb"
			g := newGateway(t, `webhook_idempotency {
				provider hmac
				secret `+secret+`
				event_id json data.object.id
				hmac {
					header X-Signature
				}
			}`, backend)
			for _, body := range []string{
				`{"data":{"object":{"id":"pi_A"}},"type":"x","data":{"object":{"id":"pi_B"}}}`,
				`{"data":{"object":{"id":"pi_A"},"obj\u0065ct":{"id":"pi_B"}}}`,
				`{"data":{"object":{"id":"pi_A","id":"pi_B"}}}`,
			} {
				req := newDelivery("http://gateway.test/hook", []byte(body),
					"Content-Type", "application/json", "X-Signature", hexOf(mac256([]byte(secret), []byte(body))))
				requireRefused(t, g.serve(req), http.StatusBadRequest, "event id given more than once")
			}
			require.Equal(t, 0, g.up.count())
			require.Empty(t, g.rows(), "nothing recorded, no body hash either")
		})

		t.Run("github delivery header with two values", func(t *testing.T) {
			g := newGateway(t, `webhook_idempotency {
				provider github
				secret gh_amb
			}`, backend)
			body := []byte(`{"ref":"refs/heads/main"}`)
			a := g.serve(githubDelivery("gh_amb", body, "guid-A", "X-GitHub-Delivery", "guid-B"))
			requireRefused(t, a, http.StatusBadRequest, "with different values: event id given more than once")
			require.Equal(t, 0, g.up.count())
			require.Empty(t, g.rows())
			// The same value on two lines is one ID.
			requireRelayed(t, g.serve(githubDelivery("gh_amb", body, "guid-A", "X-GitHub-Delivery", "guid-A")))
			g.requireRow("github", "guid-A", store.StateCompleted)
			require.Equal(t, 1, g.up.count())
		})

		t.Run("form field spelled twice", func(t *testing.T) {
			const secret = "gen_amb_form"
			g := newGateway(t, `webhook_idempotency {
				provider hmac
				secret `+secret+`
				event_id form trigger_id
				hmac {
					header X-Signature
				}
			}`, backend)
			body := []byte("trigger_id=A&text=x&trigger%5Fid=B")
			req := newDelivery("http://gateway.test/hook", body,
				"Content-Type", "application/x-www-form-urlencoded", "X-Signature", hexOf(mac256([]byte(secret), body)))
			requireRefused(t, g.serve(req), http.StatusBadRequest, "form trigger_id given 2 times")
			require.Equal(t, 0, g.up.count())
			require.Empty(t, g.rows())
		})
	})
}
