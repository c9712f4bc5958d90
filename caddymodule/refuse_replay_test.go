package caddymodule

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// discordSeed is an Ed25519 private seed (RFC 8032 test 1); the gateway is
// configured with its public key.
const discordSeed = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"

// discordDelivery signs body as Discord does at ts with seed.
func discordDelivery(t *testing.T, seed string, body []byte, ts time.Time) *http.Request {
	t.Helper()
	h := http.Header{}
	require.NoError(t, signature.Sign("discord", signature.Options{Secrets: []string{seed}}, body, h, ts))
	req := newDelivery("http://gateway.test/discord", body, "Content-Type", "application/json")
	for k, v := range h {
		req.Header[k] = v
	}
	return req
}

// A delivery that fails verification is refused with the preset's
// documented status (Discord: 401), or the route's refuse_status; nothing
// is recorded and the upstream is not called. Other refusals stay 400
// (issue 10, item 6).
func TestRefuseStatus(t *testing.T) {
	t.Parallel()
	pub, err := signature.PublicSecret("discord", discordSeed)
	require.NoError(t, err)
	otherSeed := strings.Repeat("42", 32)
	eachBackend(t, func(t *testing.T, backend gatewayOption) {
		for _, tc := range []struct {
			name, extra string
			want        int
		}{
			{name: "discord default", want: http.StatusUnauthorized},
			{name: "discord refuse_status 403", extra: "refuse_status 403", want: http.StatusForbidden},
		} {
			t.Run(tc.name, func(t *testing.T) {
				scope := uniqueScope("refuse_discord")
				g := newGateway(t, `webhook_idempotency {
					provider discord
					secret `+pub+`
					scope `+scope+`
					`+tc.extra+`
				}`, backend)
				body := []byte(`{"type":2,"id":"1234567890","data":{"name":"pay"}}`)
				now := g.clock.Now()
				unsigned := newDelivery("http://gateway.test/discord", body, "Content-Type", "application/json")
				for _, c := range map[string]struct {
					req    *http.Request
					reason string
				}{
					"another key":     {discordDelivery(t, otherSeed, body, now), "no matching signature"},
					"stale timestamp": {discordDelivery(t, discordSeed, body, now.Add(-10*time.Minute)), "timestamp outside tolerance"},
					"timestamp in ms": {discordDelivery(t, discordSeed, body, time.Unix(now.UnixMilli(), 0)), "timestamp outside tolerance"},
					"no signature":    {unsigned, "missing signature header"},
					"body changed":    {withBody(discordDelivery(t, discordSeed, body, now), []byte(`{"type":2,"id":"1234567891","data":{"name":"pay"}}`)), "no matching signature"},
				} {
					requireRefused(t, g.serve(c.req), tc.want, c.reason)
				}
				require.Equal(t, 0, g.up.count(), "upstream calls")
				require.Empty(t, g.rows(), "nothing recorded")
				require.Equal(t, 5.0, g.outcomes(outcomeInvalidSignature))
				// A valid interaction without an ID is still a 400.
				noID := []byte(`{"type":2,"data":{"name":"pay"}}`)
				requireRefused(t, g.serve(discordDelivery(t, discordSeed, noID, now)), http.StatusBadRequest, "event id missing")
				// A valid one is forwarded once.
				requireRelayed(t, g.serve(discordDelivery(t, discordSeed, body, now)))
				requireReplayedAnswer(t, g.serve(discordDelivery(t, discordSeed, body, now))) // discord reads the answer
				require.Equal(t, 1, g.up.count())
				g.requireRow(scope, "1234567890", store.StateCompleted)
			})
		}
		for _, tc := range []struct {
			name, extra string
			want        int
		}{
			{name: "stripe default", want: http.StatusBadRequest},
			{name: "stripe refuse_status 401", extra: "refuse_status 401", want: http.StatusUnauthorized},
		} {
			t.Run(tc.name, func(t *testing.T) {
				g := newGateway(t, `webhook_idempotency {
					provider stripe
					secret whsec_refuse
					`+tc.extra+`
				}`, backend)
				body := []byte(`{"id":"evt_refuse","object":"event"}`)
				requireRefused(t, g.serve(g.stripe("whsec_other", body, g.clock.Unix())), tc.want, "no matching signature")
				requireRefused(t, g.serve(g.stripe("whsec_refuse", body, g.clock.Unix()-3600)), tc.want, "timestamp outside tolerance")
				requireRefused(t, g.serve(g.stripe("whsec_refuse", []byte(`{"object":"event"}`), g.clock.Unix())), http.StatusBadRequest, "event id missing")
				require.Equal(t, 0, g.up.count())
				require.Empty(t, g.rows())
			})
		}
	})
}

func withBody(req *http.Request, body []byte) *http.Request {
	r := newDelivery(req.URL.String(), body)
	r.Header = req.Header
	return r
}

// refuse_status and replay_window in the Caddyfile, and their checks.
func TestCaddyfileRefuseStatusReplayWindow(t *testing.T) {
	t.Parallel()
	h := new(Handler)
	require.NoError(t, h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`webhook_idempotency {
		provider github
		secret s
		refuse_status 401
		retention 30d
		replay_window 730d
	}`)))
	require.Equal(t, 401, h.RefuseStatus)
	require.Equal(t, caddy.Duration(730*24*time.Hour), h.ReplayWindow)
	for input, want := range map[string]string{
		"refuse_status 500":                    `refuse_status: want a 4xx status, got 500`,
		"refuse_status 200":                    `refuse_status: want a 4xx status, got 200`,
		"refuse_status x":                      `refuse_status: want a 4xx status, got "x"`,
		"refuse_status":                        "wrong argument count",
		"refuse_status 401 403":                "wrong argument count",
		"replay_window":                        "wrong argument count",
		"replay_window soon":                   `replay_window: invalid duration "soon"`,
		"replay_window 1d\nreplay_window 2d":   "replay_window already specified",
		"refuse_status 401\nrefuse_status 403": "refuse_status already specified",
	} {
		h := new(Handler)
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("webhook_idempotency {\nprovider github\nsecret s\n" + input + "\n}"))
		if err == nil {
			err = h.prepareConfig() // a 4xx is a rule on the value, not syntax
		}
		require.ErrorContains(t, err, want, input)
	}
}

func TestValidateRefuseStatusReplayWindow(t *testing.T) {
	t.Parallel()
	day := caddy.Duration(24 * time.Hour)
	for _, tc := range []struct {
		name    string
		h       Handler
		wantErr string
		check   func(t *testing.T, h *Handler)
	}{
		{name: "defaults", h: Handler{Provider: "github"}, check: func(t *testing.T, h *Handler) {
			require.Equal(t, http.StatusBadRequest, h.RefuseStatus)
			require.Equal(t, 400*day, h.ReplayWindow)
		}},
		{name: "discord's default", h: Handler{Provider: "discord", Secrets: []string{strings.Repeat("ab", 32)}}, check: func(t *testing.T, h *Handler) {
			require.Equal(t, http.StatusUnauthorized, h.RefuseStatus)
		}},
		{name: "retention longer than the default window", h: Handler{Provider: "github", Retention: 500 * day}, check: func(t *testing.T, h *Handler) {
			require.Equal(t, 500*day, h.ReplayWindow)
		}},
		{name: "refuse_status 5xx", h: Handler{Provider: "github", RefuseStatus: 503}, wantErr: "refuse_status: want a 4xx status, got 503"},
		{name: "refuse_status 2xx", h: Handler{Provider: "github", RefuseStatus: 200}, wantErr: "refuse_status: want a 4xx status, got 200"},
		{name: "replay_window shorter than retention", h: Handler{Provider: "github", Retention: 30 * day, ReplayWindow: 10 * day},
			wantErr: "replay_window: must be at least retention (720h0m0s), got 240h0m0s"},
		{name: "replay_window without dedupe_body", h: Handler{Provider: "stripe", ReplayWindow: 500 * day},
			wantErr: "replay_window: applies only with dedupe_body on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := tc.h
			if h.Secrets == nil {
				h.Secrets = []string{"s"}
			}
			err := provisionHandler(t, &h)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			tc.check(t, &h)
		})
	}
}

// For a scheme without a signed timestamp (github), a captured delivery
// replayed after retention deleted its event row is still a duplicate:
// its body hash is kept for replay_window. After replay_window it is
// forwarded again (issue 10, item 8).
func TestReplayAfterRetention(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, backend gatewayOption) {
		const secret = "gh_replay"
		scope := uniqueScope("replay")
		g := newGateway(t, `webhook_idempotency {
			provider github
			secret `+secret+`
			scope `+scope+`
			retention 3d
			replay_window 30d
			cache 0
		}`, backend)
		ctx := context.Background()
		body := []byte(`{"action":"created","sender":{"login":"octocat"}}`)
		bodyID := bodyKey(body)
		requireRelayed(t, g.serve(githubDelivery(secret, body, "guid-1")))
		g.requireRow(scope, "guid-1", store.StateCompleted)
		g.requireRow(scope+"#body", bodyID, store.StateCompleted)
		start := time.Now()

		// Within retention nothing goes.
		n, err := g.h.sweeper.Once(ctx, start.Add(3*24*time.Hour-time.Hour))
		require.NoError(t, err)
		require.Zero(t, n)

		// Past retention the event row goes, the body hash stays.
		n, err = g.h.sweeper.Once(ctx, start.Add(3*24*time.Hour+time.Hour))
		require.NoError(t, err)
		require.Equal(t, 1, n)
		g.requireNoRow(scope, "guid-1")
		g.requireRow(scope+"#body", bodyID, store.StateCompleted)

		// The captured delivery, replayed as it was or under a fresh ID, is
		// answered as a duplicate and not forwarded.
		requireDuplicate(t, g.serve(githubDelivery(secret, body, "guid-1")))
		requireDuplicate(t, g.serve(githubDelivery(secret, body, "guid-2")))
		require.Equal(t, 1, g.up.count(), "upstream calls")
		require.Equal(t, 2.0, g.outcomes(outcomeBodyReplay))
		g.requireRow(scope, "guid-1", store.StateReleased)

		// Just before replay_window ends the hash is still kept...
		_, err = g.h.sweeper.Once(ctx, start.Add(30*24*time.Hour-time.Hour))
		require.NoError(t, err)
		g.requireRow(scope+"#body", bodyID, store.StateCompleted)
		// ...after it, it goes, and a delivery of that body is forwarded.
		_, err = g.h.sweeper.Once(ctx, start.Add(30*24*time.Hour+time.Hour))
		require.NoError(t, err)
		g.requireNoRow(scope+"#body", bodyID)
		g.requireNoRow(scope, "guid-1")
		requireRelayed(t, g.serve(githubDelivery(secret, body, "guid-1")))
		require.Equal(t, 2, g.up.count())
	})
}

// A timestamp in milliseconds sent to a seconds scheme is refused, and the
// delivery's log line names the raw value and the tolerance, not an
// overflowed distance (issue 10, item 7).
func TestTimestampInMillisecondsLogReason(t *testing.T) {
	t.Parallel()
	g := newGateway(t, `webhook_idempotency {
		provider stripe
		secret whsec_ms
	}`)
	ms := g.clock.Now().UnixMilli()
	body := []byte(`{"id":"evt_ms","object":"event"}`)
	requireRefused(t, g.serve(g.stripe("whsec_ms", body, ms)), http.StatusBadRequest, "timestamp outside tolerance")
	require.Equal(t, 0, g.up.count())
	require.Empty(t, g.rows())
	lines := g.deliveryLog()
	require.Len(t, lines, 1)
	reason, _ := lines[0]["reason"].(string)
	require.Equal(t, outcomeInvalidSignature, lines[0]["outcome"])
	require.Contains(t, reason, "timestamp "+strconv.FormatInt(ms, 10)+" (unix seconds; it looks like milliseconds) is further in the future than the tolerance of 5m0s")
	require.NotContains(t, reason, "2562047h")
}
