package caddymodule

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// The operations tests (admin API, metrics, logs, CLI) drive a real
// in-process Caddy (caddytest) on the fixed ports of integration_test.go:
// no t.Parallel, skipped under -short.

const opsAdminBase = "http://localhost:2999"

// adminAnswer is an answer of the admin API.
type adminAnswer struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func adminDo(t *testing.T, method, path string) adminAnswer {
	t.Helper()
	req, err := http.NewRequest(method, opsAdminBase+path, nil)
	require.NoError(t, err)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	a := adminAnswer{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"), "%s %s: %s", method, path, raw)
	require.NoError(t, json.Unmarshal(raw, &a.body), "%s %s: %s", method, path, raw)
	return a
}

// adminSettled reads an event through the admin API once it is no longer
// processing: the gateway completes an event just after its answer
// (settle.go), so a read right after a delivery may see it in flight. At most
// 50 reads, 20 ms apart.
func adminSettled(t *testing.T, scope, id string) adminAnswer {
	t.Helper()
	var a adminAnswer
	for range 50 {
		a = adminDo(t, http.MethodGet, eventPath(scope, id))
		if a.status != http.StatusOK || a.body["state"] != "processing" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return a
}

func eventPath(scope, id string) string {
	return adminPrefix + "events/" + url.PathEscape(scope) + "/" + url.PathEscape(id)
}

// listIDs returns the event IDs of a list answer, in order.
func listIDs(t *testing.T, a adminAnswer) []string {
	t.Helper()
	require.Equal(t, http.StatusOK, a.status, a.raw)
	evs, ok := a.body["events"].([]any)
	require.True(t, ok, a.raw)
	ids := []string{}
	for _, e := range evs {
		ids = append(ids, e.(map[string]any)["event_id"].(string))
	}
	return ids
}

func TestAdminAPI(t *testing.T) {
	secret := "whsec_" + randomHex(16)
	g := startOpsGateway(t, opsConfig{secrets: []string{secret}, extra: "on_ambiguous hold"})
	deliver := func(id string) result {
		t.Helper()
		return send(t, stripeRequest(t, g.url, secret, stripeBody(id, ""), time.Now(), id))
	}

	id := "evt_" + randomHex(8)
	t.Run("get, forget, and the next delivery is forwarded", func(t *testing.T) {
		require.Equal(t, 200, deliver(id).status)
		a := adminSettled(t, g.scope, id)
		require.Equal(t, http.StatusOK, a.status, a.raw)
		require.Equal(t, g.scope, a.body["scope"])
		require.Equal(t, id, a.body["event_id"])
		require.Equal(t, "completed", a.body["state"])
		require.EqualValues(t, 1, a.body["attempts"])
		require.EqualValues(t, 200, a.body["status"])
		require.NotEmpty(t, a.body["completed_at"])
		require.NotContains(t, a.body, "lease_until")

		r := deliver(id)
		require.True(t, r.replayed, "duplicate before the forget")

		// A forget without the event ID as confirmation changes nothing.
		for _, q := range []string{"", "?confirm=", "?confirm=yes", "?confirm=" + id + "x"} {
			a = adminDo(t, http.MethodDelete, eventPath(g.scope, id)+q)
			require.Equal(t, http.StatusPreconditionRequired, a.status, a.raw)
			require.Contains(t, a.body["error"], "confirm=<event id>")
		}
		require.True(t, deliver(id).replayed, "still a duplicate")
		a = adminDo(t, http.MethodDelete, eventPath(g.scope, id)+"?confirm="+url.QueryEscape(id))
		require.Equal(t, http.StatusOK, a.status, a.raw)
		require.Equal(t, true, a.body["forgotten"])
		require.Equal(t, http.StatusNotFound, adminDo(t, http.MethodGet, eventPath(g.scope, id)).status)

		r = deliver(id)
		require.Equal(t, 200, r.status)
		require.False(t, r.replayed, "forgotten: forwarded again, not answered from the cache")
		require.Equal(t, 2, g.up.count(id))
		a = adminSettled(t, g.scope, id)
		require.Equal(t, "completed", a.body["state"])
		require.EqualValues(t, 1, a.body["attempts"], "a new row")
	})

	direct := g.store(t)
	stuck, live, held := "evt_stuck_"+randomHex(4), "evt_live_"+randomHex(4), "evt_held_"+randomHex(4)
	t.Run("stuck claims: list, release", func(t *testing.T) {
		// A gateway claimed stuck and died; much later another delivery is
		// in flight on live.
		c, err := direct.Claim(t.Context(), store.ClaimParams{Scope: g.scope, EventID: stuck, Lease: 300 * time.Millisecond})
		require.NoError(t, err)
		require.Equal(t, store.Claimed, c.Outcome)
		time.Sleep(2 * time.Second)
		c, err = direct.Claim(t.Context(), store.ClaimParams{Scope: g.scope, EventID: live, Lease: time.Minute})
		require.NoError(t, err)
		require.Equal(t, store.Claimed, c.Outcome)

		list := func(q string) []string {
			return listIDs(t, adminDo(t, http.MethodGet, adminPrefix+"events?scope="+g.scope+"&"+q))
		}
		require.ElementsMatch(t, []string{stuck, live}, list("state=processing"))
		require.Equal(t, []string{stuck}, list("state=processing&older_than=1s"), "not updated for 1s")
		require.Empty(t, list("state=processing&older_than=1h"))
		require.Equal(t, []string{id}, list("state=completed"))

		// A live claim is not the operator's to resolve.
		a := adminDo(t, http.MethodPost, eventPath(g.scope, live)+"/release")
		require.Equal(t, http.StatusConflict, a.status, a.raw)
		require.Contains(t, a.body["error"], "live claim")

		a = adminDo(t, http.MethodPost, eventPath(g.scope, stuck)+"/release")
		require.Equal(t, http.StatusOK, a.status, a.raw)
		require.Equal(t, "released", a.body["state"])
		require.NotContains(t, a.body, "lease_until")

		r := deliver(stuck)
		require.Equal(t, 200, r.status)
		require.False(t, r.replayed)
		require.Equal(t, 1, g.up.count(stuck))
		a = adminSettled(t, g.scope, stuck)
		require.Equal(t, "completed", a.body["state"])
		require.EqualValues(t, 2, a.body["attempts"])

		// Completed events are not resolved again the other way.
		a = adminDo(t, http.MethodPost, eventPath(g.scope, stuck)+"/release")
		require.Equal(t, http.StatusConflict, a.status, a.raw)
	})

	t.Run("held event completed by the operator", func(t *testing.T) {
		_, err := direct.Claim(t.Context(), store.ClaimParams{Scope: g.scope, EventID: held, Lease: 300 * time.Millisecond})
		require.NoError(t, err)
		time.Sleep(500 * time.Millisecond)
		r := deliver(held)
		require.Equal(t, http.StatusServiceUnavailable, r.status, "on_ambiguous hold: %s", r.body)
		require.Equal(t, 0, g.up.count(held))
		a := adminDo(t, http.MethodGet, eventPath(g.scope, held))
		require.Equal(t, "held", a.body["state"])
		require.Equal(t, store.HoldLeaseExpired, a.body["hold_reason"], "why it is held")
		require.Equal(t, []string{held}, listIDs(t, adminDo(t, http.MethodGet, adminPrefix+"events?state=held&scope="+g.scope)))
		// The CLI shows it too.
		out, err := runCLI(t, "event", "get", "--admin", "localhost:2999", "--scope", g.scope, "--id", held)
		require.NoError(t, err, out)
		var ev EventJSON
		require.NoError(t, json.Unmarshal([]byte(out), &ev), out)
		require.Equal(t, store.HoldLeaseExpired, ev.HoldReason)

		a = adminDo(t, http.MethodPost, eventPath(g.scope, held)+"/complete")
		require.Equal(t, http.StatusOK, a.status, a.raw)
		require.Equal(t, "completed", a.body["state"])
		require.NotEmpty(t, a.body["completed_at"])
		require.NotContains(t, a.body, "hold_reason", "the reason goes with the hold")

		r = deliver(held)
		require.Equal(t, 200, r.status)
		require.True(t, r.replayed, "completed by the operator: a duplicate")
		require.Equal(t, 0, g.up.count(held), "never forwarded")
	})

	t.Run("paging with next", func(t *testing.T) {
		all := listIDs(t, adminDo(t, http.MethodGet, adminPrefix+"events?scope="+g.scope))
		require.ElementsMatch(t, []string{id, stuck, live, held}, all)

		var paged []string
		path := adminPrefix + "events?limit=1&scope=" + g.scope
		for range 10 {
			a := adminDo(t, http.MethodGet, path)
			paged = append(paged, listIDs(t, a)...)
			next, ok := a.body["next_url"].(string)
			if !ok {
				break
			}
			cur := a.body["next"].(map[string]any)
			require.NotEmpty(t, cur["after_updated_at"])
			require.Equal(t, g.scope, cur["after_scope"])
			require.NotEmpty(t, cur["after_id"])
			path = next
		}
		require.Equal(t, all, paged)
	})

	t.Run("errors are JSON with the right status", func(t *testing.T) {
		cases := []struct {
			method, path string
			status       int
			allow        string
			want         string // in the error message
		}{
			{http.MethodGet, eventPath(g.scope, "evt_unknown"), 404, "", "event not found"},
			{http.MethodDelete, eventPath(g.scope, "evt_unknown") + "?confirm=evt_unknown", 404, "", "event not found"},
			{http.MethodPost, eventPath(g.scope, "evt_unknown") + "/release", 404, "", "event not found"},
			{http.MethodGet, eventPath("no_such_scope", id), 404, "", "no handler has scope"},
			{http.MethodPost, eventPath(g.scope, id) + "/frobnicate", 404, "", "unknown action"},
			{http.MethodGet, adminPrefix + "nothing", 404, "", "unknown admin path"},
			{http.MethodGet, adminPrefix + "events?state=bogus", 400, "", "state"},
			{http.MethodGet, adminPrefix + "events?limit=5000", 400, "", "limit"},
			{http.MethodGet, adminPrefix + "events?older_than=soon", 400, "", "older_than"},
			{http.MethodGet, adminPrefix + "events?after_updated_at=yesterday", 400, "", "after_updated_at"},
			{http.MethodGet, adminPrefix + "events?after_scope=x&after_id=y", 400, "", "after_updated_at"},
			{http.MethodPut, eventPath(g.scope, id), 405, "GET, DELETE", "method PUT not allowed"},
			{http.MethodGet, eventPath(g.scope, id) + "/release", 405, "POST", "method GET not allowed"},
			{http.MethodPost, adminPrefix + "events", 405, "GET", "method POST not allowed"},
		}
		for _, tc := range cases {
			a := adminDo(t, tc.method, tc.path)
			require.Equal(t, tc.status, a.status, "%s %s: %s", tc.method, tc.path, a.raw)
			msg, _ := a.body["error"].(string)
			require.Contains(t, msg, tc.want, "%s %s", tc.method, tc.path)
			require.Equal(t, tc.allow, a.header.Get("Allow"), "%s %s", tc.method, tc.path)
		}
		// The event the refused calls named is untouched.
		a := adminSettled(t, g.scope, id)
		require.Equal(t, "completed", a.body["state"])
	})
}
