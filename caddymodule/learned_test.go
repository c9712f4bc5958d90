package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/cli"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// secretsAdmin calls the secrets admin API in process (guard included) and
// returns the status and the decoded JSON answer.
func secretsAdmin(t *testing.T, method, uri string) (int, map[string]any) {
	t.Helper()
	a := &Admin{logger: zap.NewNop()}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, "http://localhost:2019"+uri, nil)
	err := guardAdmin(func() *zap.Logger { return zap.NewNop() }, a.serve)(rec, req)
	var ae caddy.APIError
	if errors.As(err, &ae) {
		return ae.HTTPStatus, map[string]any{"error": ae.Message}
	}
	require.NoError(t, err)
	var body map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
	return rec.Code, body
}

// learnedSecretOf reads the scope's learned secret from the gateway's store.
func (g *gateway) learnedSecretOf(scope string) (store.LearnedSecret, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return g.h.backend.secrets.LearnedSecret(ctx, scope)
}

// Issue 22, item 3: a route that learns its secret (asana) used to accept the
// first handshake from anyone: an anonymous POST with X-Hook-Secret:
// attacker_secret was echoed and stored, Asana's real handshake then refused,
// and deliveries signed with the planted secret forwarded. Now a handshake
// teaches a secret only within an enrollment window; the first load opens
// one for enroll_window (10m by default).
func TestIssue22_LearnedSecretOutsideWindowRefused(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, backend gatewayOption) {
		scope := uniqueScope("asana")
		snippet := "webhook_idempotency {\n provider asana\n event_id json id\n scope " + scope + "\n}"
		g := newGateway(t, snippet, backend)

		// 11 minutes after the first load, the attacker's handshake.
		g.clock.Advance(11 * time.Minute)
		a := g.serve(asanaHandshake("attacker_secret"))
		requireRefused(t, a, http.StatusBadRequest, "no enrollment window is open")
		require.Empty(t, a.header.Get("X-Hook-Secret"), "not echoed")
		_, err := g.learnedSecretOf(scope)
		require.ErrorIs(t, err, store.ErrNotFound, "nothing stored")
		const refusedMsg = "handshake refused: it brings a secret the scope has not learned and no enrollment window is open"
		require.Len(t, g.logged(refusedMsg), 1)
		// A flood of them is refused each time and warned of once a second.
		start := time.Now()
		for range 20 {
			requireRefused(t, g.serve(asanaHandshake("attacker_secret")), http.StatusBadRequest, "no enrollment window is open")
		}
		require.LessOrEqual(t, len(g.logged(refusedMsg)), 2+int(time.Since(start)/time.Second), "throttled warnings")
		// Deliveries signed with the secret it tried to plant are refused.
		requireRefused(t, g.serve(asanaDelivery(t, "attacker_secret", "evt-planted")), http.StatusBadRequest, "no matching signature")

		// A reload (a second load of the scope) opens no window.
		g2 := newGateway(t, snippet, sharingStore(g))
		requireRefused(t, g2.serve(asanaHandshake("attacker_secret")), http.StatusBadRequest, "no enrollment window is open")
		require.Zero(t, g.up.count(), "upstream calls")
		require.Empty(t, g.rows(), "no event row")
	})
}

// Within the first load's window Asana's real handshake is learned; the
// window closes with it, so the attacker's handshake that follows is refused
// and deliveries signed with its secret are refused; Asana's are forwarded.
func TestIssue22_LearnedSecretWithinFirstLoadWindow(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, backend gatewayOption) {
		scope := uniqueScope("asana")
		g := newGateway(t, "webhook_idempotency {\n provider asana\n event_id json id\n learned_secret replace\n scope "+scope+"\n}", backend)
		g.clock.Advance(time.Minute)
		a := g.serve(asanaHandshake("real_asana_secret"))
		require.Equal(t, http.StatusOK, a.status)
		require.Equal(t, "real_asana_secret", a.header.Get("X-Hook-Secret"))
		ls, err := g.learnedSecretOf(scope)
		require.NoError(t, err)
		require.Equal(t, "real_asana_secret", ls.Secret)
		require.Equal(t, "192.0.2.1", ls.From, "httptest's client address")
		require.NotEmpty(t, ls.By)

		// Even with learned_secret replace, the window closed on learning.
		requireRefused(t, g.serve(asanaHandshake("attacker_secret")), http.StatusBadRequest, "no enrollment window is open")
		// Asana's handshake again (the same secret) is accepted.
		require.Equal(t, http.StatusOK, g.serve(asanaHandshake("real_asana_secret")).status)

		requireRefused(t, g.serve(asanaDelivery(t, "attacker_secret", "evt-planted")), http.StatusBadRequest, "no matching signature")
		requireRelayed(t, g.serve(asanaDelivery(t, "real_asana_secret", "evt-real")))
		require.Equal(t, 1, g.up.count(), "upstream calls")
		g.requireRow(scope, "evt-real", store.StateCompleted)
		g.requireNoRow(scope, "evt-planted")
	})
}

// The operator's way (issue 22, item 3): enroll_window off, so no handshake
// teaches anything until the admin API (the CLI's `secrets enroll`) opens a
// window; the list shows a fingerprint, never the value; forget removes it.
// Notion's verification_token the same way.
func TestIssue22_SecretsAdminEnrollListForget(t *testing.T) {
	t.Parallel()
	scope := uniqueScope("notion")
	g := newGateway(t, "webhook_idempotency {\n provider notion\n enroll_window off\n scope "+scope+"\n}", onPostgres())
	notionHandshake := func(token string) answer {
		return g.serve(newDelivery("http://gateway.test/notion", []byte(`{"verification_token":"`+token+`"}`), "Content-Type", "application/json"))
	}
	notionDelivery := func(token, id string) *http.Request {
		d, err := cli.BuildDelivery(cli.SignParams{Provider: "notion", Secret: token, EventID: id})
		require.NoError(t, err)
		req := newDelivery("http://gateway.test/notion", d.Body)
		req.Header = d.Header
		return req
	}

	// No window at all: the attacker's token is refused.
	requireRefused(t, notionHandshake("secret_attacker"), http.StatusBadRequest, "no enrollment window is open")
	status, body := secretsAdmin(t, http.MethodGet, "/webhook_idempotency/secrets?scope="+scope)
	require.Equal(t, http.StatusOK, status, body)
	list := body["secrets"].([]any)
	require.Len(t, list, 1)
	entry := list[0].(map[string]any)
	require.Equal(t, scope, entry["scope"])
	require.Nil(t, entry["fingerprint"])
	require.Equal(t, false, entry["enroll_open"])

	// The operator opens a window; Notion's real handshake is learned.
	status, body = secretsAdmin(t, http.MethodPost, "/webhook_idempotency/secrets/enroll?scope="+scope+"&for=10m")
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, true, body["enroll_open"])
	require.Equal(t, http.StatusOK, notionHandshake("secret_notion_real").status)
	requireRefused(t, notionHandshake("secret_attacker"), http.StatusBadRequest, "no enrollment window is open")
	requireRelayed(t, g.serve(notionDelivery("secret_notion_real", "n-real")))
	requireRefused(t, g.serve(notionDelivery("secret_attacker", "n-planted")), http.StatusBadRequest, "no matching signature")
	require.Equal(t, 1, g.up.count())

	status, body = secretsAdmin(t, http.MethodGet, "/webhook_idempotency/secrets")
	require.Equal(t, http.StatusOK, status, body)
	var mine map[string]any
	for _, e := range body["secrets"].([]any) {
		if m := e.(map[string]any); m["scope"] == scope {
			mine = m
		}
	}
	require.NotNil(t, mine)
	require.Equal(t, secretFingerprint("secret_notion_real"), mine["fingerprint"])
	require.Equal(t, "192.0.2.1", mine["learned_from"])
	require.NotEmpty(t, mine["learned_at"])
	require.Equal(t, false, mine["enroll_open"], "closed by learning")
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	require.NotContains(t, string(raw), "secret_notion_real", "never the value")

	// Bad calls: unknown scope, no confirmation, a window too long.
	status, _ = secretsAdmin(t, http.MethodPost, "/webhook_idempotency/secrets/enroll?scope=nope_"+scope+"&for=10m")
	require.Equal(t, http.StatusNotFound, status)
	status, _ = secretsAdmin(t, http.MethodPost, "/webhook_idempotency/secrets/enroll?scope="+scope+"&for=48h")
	require.Equal(t, http.StatusBadRequest, status)
	status, _ = secretsAdmin(t, http.MethodDelete, "/webhook_idempotency/secrets?scope="+scope)
	require.Equal(t, http.StatusPreconditionRequired, status)

	// Forget: the store has no secret any more.
	status, body = secretsAdmin(t, http.MethodDelete, "/webhook_idempotency/secrets?scope="+scope+"&confirm="+scope)
	require.Equal(t, http.StatusOK, status, body)
	_, err = g.learnedSecretOf(scope)
	require.ErrorIs(t, err, store.ErrNotFound)
	status, _ = secretsAdmin(t, http.MethodDelete, "/webhook_idempotency/secrets?scope="+scope+"&confirm="+scope)
	require.Equal(t, http.StatusNotFound, status)
}

// caddy validate provisions the config without running it: that is not
// the scope's first load, so it opens no enrollment window; the window
// opens when the config runs (here 11 minutes later, past a window the
// validation would have opened and let expire unused).
func TestValidateOpensNoEnrollmentWindow(t *testing.T) {
	scope := uniqueScope("asana_validate")
	block := "webhook_idempotency {\n provider asana\n event_id json id\n scope " + scope + "\n}"
	clock := newTestClock(time.Now())
	args := os.Args
	os.Args = []string{"caddy", "validate", "--config", "Caddyfile"}
	v := newGateway(t, block, withClock(clock))
	os.Args = args
	clock.Advance(11 * time.Minute)
	g := newGateway(t, block, sharingStore(v), withClock(clock))
	clock.Advance(time.Minute)
	a := g.serve(asanaHandshake("real_asana_secret"))
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	require.Equal(t, "real_asana_secret", a.header.Get("X-Hook-Secret"))
}
