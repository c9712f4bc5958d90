package caddymodule

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// complete_by: gateway by default; upstream needs storage postgres and
// refuses on_ambiguous hold, each with the reason and what to write, before
// anything is opened.
func TestCompleteByConfig(t *testing.T) {
	t.Parallel()
	parse := func(t *testing.T, extra string) *Handler {
		h := new(Handler)
		require.NoError(t, h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(
			"webhook_idempotency {\nprovider stripe\nsecret whsec_x\n"+extra+"}")))
		return h
	}
	h := parse(t, "")
	require.NoError(t, h.prepareConfig())
	require.Equal(t, completeByGateway, h.CompleteBy)

	for _, c := range []struct{ extra, want string }{
		{"complete_by upstream\n", "complete_by upstream: needs storage postgres, got sqlite (the default)"},
		{"complete_by upstream\nstorage sqlite " + filepath.Join(t.TempDir(), "e.db") + "\n", "needs storage postgres, got sqlite"},
		{"complete_by upstream\nstorage postgres postgres://127.0.0.1:9/x\non_ambiguous hold\n",
			"on_ambiguous hold: does not apply with complete_by upstream"},
		{"complete_by someone\n", "complete_by: want gateway or upstream"},
	} {
		err := parse(t, c.extra).prepareConfig()
		require.ErrorContains(t, err, c.want, c.extra)
	}
	h = parse(t, "complete_by upstream\nstorage postgres postgres://127.0.0.1:9/x\non_ambiguous reforward\n")
	require.NoError(t, h.prepareConfig(), "reforward, the default, changes nothing and is accepted")
	h = new(Handler)
	require.NoError(t, h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(
		"webhook_idempotency {\nprovider idempotency_key\nstorage postgres postgres://127.0.0.1:9/x\ncomplete_by upstream\n}")))
	require.ErrorContains(t, h.prepareConfig(), "not provider idempotency_key")
	h = new(Handler)
	require.ErrorContains(t, h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(
		"webhook_idempotency {\ncomplete_by upstream\ncomplete_by gateway\n}")), "complete_by already specified")
}

// headerUpstream records the headers of each forward.
type headerUpstream struct {
	*httptest.Server
	mu  sync.Mutex
	got map[string][]http.Header
}

func newHeaderUpstream(t *testing.T) *headerUpstream {
	u := &headerUpstream{got: map[string][]http.Header{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.got[r.URL.Path] = append(u.got[r.URL.Path], r.Header.Clone())
		u.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *headerUpstream) headers(path string) []http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.got[path]
}

// Every route removes a Webhook-Claim the request brought and sets the
// scope, event_id and attempt placeholders; a complete_by upstream route
// forwards its own claim (also as the claim placeholder), naming the
// event's claim and nothing the sender chose.
func TestClaimHeaderAndPlaceholders(t *testing.T) {
	dsn := pgDSN(t)
	table := "cb_" + randomHex(6)
	t.Cleanup(func() { dropTable(dsn, table) })
	secret := "whsec_" + randomHex(16)
	up := newHeaderUpstream(t)
	headerUp := `
			header_up X-Scope {http.webhook_idempotency.scope}
			header_up Idempotency-Key {http.webhook_idempotency.event_id}
			header_up X-Attempt {http.webhook_idempotency.attempt}
			header_up X-Claim {http.webhook_idempotency.claim}`
	startCaddy(t, fmt.Sprintf(`{
`+caddyTestGlobals+`}
http://localhost:9080 {
	handle /gateway {
		webhook_idempotency {
			provider stripe
			secret %[1]q
			storage sqlite %[2]q
			scope cb_gateway
		}
		reverse_proxy %[5]s {%[6]s
		}
	}
	handle /upstream {
		webhook_idempotency {
			provider stripe
			secret %[1]q
			storage postgres %[3]q
			table %[4]s
			scope cb_upstream
			complete_by upstream
		}
		reverse_proxy %[5]s {%[6]s
		}
	}
}`, secret, filepath.Join(t.TempDir(), "events.db"), dsn, table, up.Listener.Addr().String(), headerUp))

	forged := store.ClaimValue("cb_upstream", "evt_forged", store.NewToken())
	for _, route := range []string{"gateway", "upstream"} {
		id := "evt_" + randomHex(8)
		req := stripeDelivery(t, gatewayBase+"/"+route, secret, id, time.Now())
		req.Header.Set("Webhook-Claim", forged)
		r := send(t, req)
		if route == "upstream" {
			// Nothing commits here: the 2xx is completed all the same.
			require.Equal(t, 200, r.status, r.body)
		}
		hs := up.headers("/" + route)
		require.Len(t, hs, 1, route)
		h := hs[0]
		require.Equal(t, "cb_"+route, h.Get("X-Scope"))
		require.Equal(t, id, h.Get("Idempotency-Key"))
		require.Equal(t, "1", h.Get("X-Attempt"))
		claims := h.Values("Webhook-Claim")
		switch route {
		case "gateway":
			require.Empty(t, claims, "a Webhook-Claim from outside never reaches the upstream")
			require.Empty(t, h.Get("X-Claim"))
		case "upstream":
			require.Len(t, claims, 1)
			require.NotEqual(t, forged, claims[0])
			scope, eventID, _, ok := store.ParseClaimValue(claims[0])
			require.True(t, ok)
			require.Equal(t, []string{"cb_upstream", id}, []string{scope, eventID})
			require.Equal(t, claims[0], h.Get("X-Claim"))
		}
	}
}

// The event ID placeholder is a string every consumer of Caddy's
// placeholders accepts, an expression (CEL) matcher included: a test event
// is answered by the matched route, another forwarded once. A placeholder
// of another type made the matcher fail every delivery (502, then the
// event released as ambiguous and held on its redelivery).
func TestEventIDPlaceholderInExpressionMatcher(t *testing.T) {
	secret := "whsec_" + randomHex(16)
	up := newHeaderUpstream(t)
	startCaddy(t, fmt.Sprintf(`{
`+caddyTestGlobals+`}
http://localhost:9080 {
	route /webhooks/stripe {
		webhook_idempotency {
			provider stripe
			secret %[1]q
			storage sqlite %[2]q
		}
		@test expression `+"`"+`{http.webhook_idempotency.event_id}.startsWith("evt_test_")`+"`"+`
		respond @test "test event" 200
		reverse_proxy %[3]s
	}
}`, secret, filepath.Join(t.TempDir(), "events.db"), up.Listener.Addr().String()))

	test := "evt_test_" + randomHex(8)
	r := send(t, stripeDelivery(t, gatewayBase+"/webhooks/stripe", secret, test, time.Now()))
	require.Equal(t, 200, r.status, r.body)
	require.Equal(t, "test event", r.body)
	live := "evt_live_" + randomHex(8)
	for range 3 {
		r = send(t, stripeDelivery(t, gatewayBase+"/webhooks/stripe", secret, live, time.Now()))
		require.Equal(t, 200, r.status, r.body)
	}
	require.Len(t, up.headers("/webhooks/stripe"), 1, "the live event is forwarded once, its redeliveries answered at the edge")
}
