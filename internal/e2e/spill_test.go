package e2e_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// Issue 21: a 25 MB GitHub delivery (kept in a temporary file by the
// gateway, past 1 MiB) that arrives while the store link is cut is spooled
// and answered 200; once the link is back it is forwarded once, with
// exactly its bytes and Content-Length; its redelivery is a duplicate.
func TestSpoolKeepsA25MBGitHubDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{} })
	type forward struct {
		id             string
		sum            [sha256.Size]byte
		read, declared int64
	}
	var (
		mu  sync.Mutex
		got []forward
	)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hs := sha256.New()
		n, _ := io.Copy(hs, r.Body)
		f := forward{id: r.Header.Get("X-GitHub-Delivery"), read: n, declared: r.ContentLength}
		hs.Sum(f.sum[:0])
		mu.Lock()
		got = append(got, f)
		mu.Unlock()
	}))
	t.Cleanup(up.Close)
	forwards := func() []forward {
		mu.Lock()
		defer mu.Unlock()
		return append([]forward(nil), got...)
	}
	link := b.storeLink()
	g := b.start(e2e.GatewayConfig{Name: "a", Upstream: up.Listener.Addr().String(),
		Handler: e2e.GitHubHandler(b.secret, b.db.DSNVia(link.Addr()))})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	deliver := func(id string, body []byte) e2e.Result {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.URL(), bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-GitHub-Event", "push")
		req.Header.Set("X-GitHub-Delivery", id)
		req.Header.Set("X-Hub-Signature-256", e2e.GitHubSignature(b.secret, body))
		resp, err := b.client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		a, _ := io.ReadAll(resp.Body)
		return e2e.Result{Status: resp.StatusCode, Body: string(a), Replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	}
	warm := deliver("warm-"+e2e.RandomHex(6), []byte(`{"zen":"warm"}`))
	require.Equal(t, http.StatusOK, warm.Status, warm.Body)

	head := `{"ref":"refs/heads/main","commits":[{"message":"`
	body := []byte(head + strings.Repeat("x", 25_000_000-len(head)-4) + `"}]}`)
	id := "big-" + e2e.RandomHex(6)
	link.Cut()
	r := deliver(id, body)
	require.Equal(t, http.StatusOK, r.Status, r.Body)
	require.Contains(t, r.Body, `"spooled":true`)
	require.Len(t, forwards(), 1, "nothing forwarded while the store is unreachable")
	link.Restore()

	require.Eventually(t, func() bool { return len(forwards()) == 2 }, time.Minute, 100*time.Millisecond,
		"the spooled delivery is forwarded once the store is back")
	f := forwards()[1]
	require.Equal(t, id, f.id)
	require.Equal(t, sha256.Sum256(body), f.sum, "exactly the bytes GitHub signed")
	require.Equal(t, int64(len(body)), f.read)
	require.Equal(t, int64(len(body)), f.declared)

	r = deliver(id, body)
	require.Equal(t, http.StatusOK, r.Status, r.Body)
	require.True(t, r.Replayed, "the redelivery is a duplicate: %s", r.Body)
	time.Sleep(time.Second)
	require.Len(t, forwards(), 2)
}
