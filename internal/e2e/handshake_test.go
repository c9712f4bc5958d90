package e2e_test

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// Asana's X-Hook-Secret, learned in a handshake by one Caddy process, is
// kept in PostgreSQL: a second process on the same database verifies
// deliveries with it, and so does the first after it was killed and
// started again. A handshake with another secret is refused by either.
// Neither process logs the secret.
func TestLearnedSecretAcrossProcesses(t *testing.T) {
	t.Parallel()
	b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{} })
	cfg := func(name string) e2e.GatewayConfig {
		return e2e.GatewayConfig{Name: name, Upstream: b.up.Addr(), Handler: []string{
			"provider asana", "event_id json id", "storage postgres " + strconv.Quote(b.db.DSN),
		}}
	}
	first := b.start(cfg("asana-1"))
	second := b.start(cfg("asana-2"))
	secret := e2e.NewSecret()

	type answer struct {
		StatusCode int
		Header     http.Header
	}
	post := func(g *e2e.Gateway, body []byte, h http.Header) answer {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, g.URL(), bytes.NewReader(body))
		require.NoError(t, err)
		req.Header = h
		resp, err := b.client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return answer{resp.StatusCode, resp.Header}
	}
	deliver := func(g *e2e.Gateway, id string) answer {
		t.Helper()
		h := http.Header{"Content-Type": {"application/json"}}
		body, err := signature.SignDelivery("asana", signature.Options{Secrets: []string{secret}},
			[]byte(`{"id":"`+id+`","events":[{"action":"changed","resource":{"gid":"1"}}]}`), h, time.Now())
		require.NoError(t, err)
		return post(g, body, h)
	}

	resp := post(first, nil, http.Header{"X-Hook-Secret": {secret}})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, secret, resp.Header.Get("X-Hook-Secret"))

	require.Equal(t, http.StatusOK, deliver(second, "asana-e1").StatusCode, "the second process uses the learned secret")
	require.Len(t, b.up.Calls("asana-e1"), 1)
	// The completion is written just after the answer: until it is, the
	// other process reads the event in flight (409). At most 50 tries.
	dup := deliver(first, "asana-e1")
	for i := 0; dup.StatusCode == http.StatusConflict && i < 50; i++ {
		time.Sleep(20 * time.Millisecond)
		dup = deliver(first, "asana-e1")
	}
	require.Equal(t, http.StatusOK, dup.StatusCode)
	require.Equal(t, "true", dup.Header.Get("Idempotent-Replayed"))

	resp = post(second, nil, http.Header{"X-Hook-Secret": {e2e.NewSecret()}})
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "another secret is not learned over the first")

	first.Kill()
	restarted := b.start(cfg("asana-1b"))
	require.Equal(t, http.StatusOK, deliver(restarted, "asana-e2").StatusCode, "the restarted process reads the stored secret")
	require.Len(t, b.up.Calls("asana-e2"), 1)

	for _, g := range []*e2e.Gateway{first, second, restarted} {
		e2e.CheckNoLeaks(t, g.LogPath(), secret)
	}
}
