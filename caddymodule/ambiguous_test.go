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

// A batch that names its items, or an item its ID, twice is refused 400
// with nothing recorded and the upstream not called, under batch set and
// split and also under on_missing_id forward: as for a top-level event ID,
// the gateway would key on one ID while the upstream reads the other.
func TestAmbiguousBatchRefused(t *testing.T) {
	t.Parallel()
	gocardless := func(t *testing.T, body string) *http.Request { return signedFor(t, "gocardless", "gc_amb", body) }
	okta := func(t *testing.T, body string) *http.Request { return signedFor(t, "okta", "okta_amb", body) }
	eachBackend(t, func(t *testing.T, backend gatewayOption) {
		for _, policy := range []string{"set", "split"} {
			for _, onMissing := range []string{"reject", "forward"} {
				t.Run("gocardless "+policy+" on_missing_id "+onMissing, func(t *testing.T) {
					g := newGateway(t, `webhook_idempotency {
						provider gocardless
						secret gc_amb
						scope `+uniqueScope("amb_gc")+`
						batch `+policy+`
						on_missing_id `+onMissing+`
					}`, backend)
					for _, body := range []string{
						`{"events":[{"id":"EV1"},{"id":"EV2","id":"EV3"}]}`,
						`{"events":[{"id":"EV1","ID":"EV3"}]}`,
						`{"events":[{"i\u0064":"EV1","id":"EV3"}]}`,
						`{"events":[{"id":"EV1"}],"events":[{"id":"EV3"}]}`,
					} {
						requireRefused(t, g.serve(gocardless(t, body)), http.StatusBadRequest, "event id given more than once")
					}
					require.Zero(t, g.up.count(), "upstream calls")
					require.Empty(t, g.rows(), "nothing recorded")
					require.Equal(t, 4.0, g.outcomes(outcomeBadRequest))
					// The unambiguous batch is forwarded once.
					requireRelayedOrSummary(t, g.serve(gocardless(t, `{"events":[{"id":"EV1"},{"id":"EV3"}]}`)))
					require.NotZero(t, g.up.count())
				})
			}
		}

		t.Run("okta items named twice", func(t *testing.T) {
			g := newGateway(t, "webhook_idempotency {\n provider okta\n secret okta_amb\n scope "+uniqueScope("amb_okta")+"\n}", backend)
			for _, body := range []string{
				`{"eventId":"hook-1","data":{"events":[{"uuid":"u1"}]},"data":{"events":[{"uuid":"u2"}]}}`,
				// The first data has no events: keyed on eventId, the
				// upstream would process the second data's events.
				`{"eventId":"hook-1","data":{},"data":{"events":[{"uuid":"u2"}]}}`,
				`{"eventId":"hook-1","data":{"events":[{"uuid":"u1","uuid":"u2"}]}}`,
			} {
				requireRefused(t, g.serve(okta(t, body)), http.StatusBadRequest, "event id given more than once")
			}
			require.Zero(t, g.up.count())
			require.Empty(t, g.rows())
		})
	})
}

// requireRelayedOrSummary asserts a batch accepted: the upstream's answer
// (batch set) or the gateway's summary of the items forwarded (split).
func requireRelayedOrSummary(t *testing.T, a answer) {
	t.Helper()
	require.Equal(t, http.StatusOK, a.status, "body %s", a.body)
	require.Empty(t, a.header.Get("Idempotent-Replayed"))
}
