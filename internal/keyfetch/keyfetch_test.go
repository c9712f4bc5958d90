package keyfetch_test

import (
	"errors"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/keyfetch"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/keyfetch/keyfetchtest"
)

var keys *keyfetchtest.Server

func TestMain(m *testing.M) {
	keys = keyfetchtest.Start()
	code := m.Run()
	keys.Close()
	os.Exit(code)
}

func newFetcher(p keyfetch.Policy) *keyfetch.Fetcher {
	if p.Hosts == nil {
		p.Hosts = []string{"api.paypal.com", "sns.*.amazonaws.com"}
	}
	return keyfetch.New(p)
}

func TestAllowed(t *testing.T) {
	t.Parallel()
	f := newFetcher(keyfetch.Policy{})
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"https://api.paypal.com/v1/notifications/certs/CERT-1", true},
		{"https://api.paypal.com:443/v1/notifications/certs/CERT-1", true},
		{"https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-1.pem", true},
		{"http://api.paypal.com/v1/notifications/certs/CERT-1", false}, // not https
		{"https://api.paypal.com.evil.example/certs", false},           // suffix
		{"https://evil.example/api.paypal.com", false},                 // path
		{"https://API.PAYPAL.COM/certs", false},                        // as written only
		{"https://api.paypal.com./certs", false},                       // trailing dot
		{"https://api.paypal.com:8443/certs", false},                   // port
		{"https://user@api.paypal.com/certs", false},                   // user info
		{"https://sns.x.evil.amazonaws.com/cert.pem", false},           // two labels for *
		{"https://sns..amazonaws.com/cert.pem", false},                 // empty label
		{"https://sns.eu_west.amazonaws.com/cert.pem", false},          // not a DNS label
		{"https://127.0.0.1/cert.pem", false},                          // address
		{"ftp://api.paypal.com/cert.pem", false},                       // scheme
		{"//api.paypal.com/cert.pem", false},                           // no scheme
	} {
		t.Run(tc.url, func(t *testing.T) {
			t.Parallel()
			err := f.Allowed(tc.url)
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, keyfetch.ErrNotAllowed)
		})
	}
}

// TestRefusedBeforeIO: a URL outside the policy is never requested, even
// when something answers at that host.
func TestRefusedBeforeIO(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"https://evil.example/refused-before-io", "http://api.paypal.com/refused-before-io"} {
		keys.Put(u, []byte("key"), "")
		_, err := newFetcher(keyfetch.Policy{}).Get(u)
		require.ErrorIs(t, err, keyfetch.ErrNotAllowed)
		require.Zero(t, keys.Hits(u))
	}
}

func TestFetchFailures(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	keys.Handle("https://api.paypal.com/fail/redirect", http.RedirectHandler("https://api.paypal.com/fail/target", http.StatusFound))
	keys.Put("https://api.paypal.com/fail/target", []byte("key"), "")
	keys.Put("https://api.paypal.com/fail/oversize", []byte(strings.Repeat("k", 1025)), "")
	keys.Handle("https://api.paypal.com/fail/oversize-chunked", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		for range 3 {
			_, _ = w.Write([]byte(strings.Repeat("k", 512)))
			w.(http.Flusher).Flush() // no Content-Length: the limit applies while reading
		}
	}))
	keys.Handle("https://api.paypal.com/fail/slow", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		<-release // never answers while the test runs, whatever the connection does
	}))
	keys.Handle("https://api.paypal.com/fail/empty", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	keys.Handle("https://api.paypal.com/fail/status", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "down", http.StatusBadGateway)
	}))
	for _, tc := range []struct{ name, path string }{
		{"redirect refused", "/fail/redirect"},
		{"oversize by Content-Length", "/fail/oversize"},
		{"oversize while reading", "/fail/oversize-chunked"},
		{"slow server", "/fail/slow"},
		{"error status", "/fail/status"},
		{"not found", "/fail/nothing-here"},
		{"empty answer", "/fail/empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFetcher(keyfetch.Policy{MaxBytes: 1024, Timeout: 300 * time.Millisecond})
			start := time.Now()
			b, err := f.Get("https://api.paypal.com" + tc.path)
			require.ErrorIs(t, err, keyfetch.ErrUnavailable)
			require.NotErrorIs(t, err, keyfetch.ErrNotAllowed)
			require.Nil(t, b)
			require.Less(t, time.Since(start), 10*time.Second, "bounded by the policy's timeout")
		})
	}
	require.Zero(t, keys.Hits("https://api.paypal.com/fail/target"), "the redirect was not followed")

	// A failure is not cached: once the host answers, the key is fetched.
	var up atomic.Bool
	keys.Handle("https://api.paypal.com/fail/recovers", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !up.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("key"))
	}))
	f := newFetcher(keyfetch.Policy{})
	_, err := f.Get("https://api.paypal.com/fail/recovers")
	require.ErrorIs(t, err, keyfetch.ErrUnavailable)
	up.Store(true)
	b, err := f.Get("https://api.paypal.com/fail/recovers")
	require.NoError(t, err)
	require.Equal(t, "key", string(b))
}

// TestConcurrentFetchesOneRequest: callers that want one URL at once share
// a single request, and those after it read the cache.
func TestConcurrentFetchesOneRequest(t *testing.T) {
	t.Parallel()
	const u = "https://api.paypal.com/concurrent/cert"
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	keys.Handle(u, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		<-release
		_, _ = w.Write([]byte("key"))
	}))
	f := newFetcher(keyfetch.Policy{})
	const n = 32
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			b, err := f.Get(u)
			if err == nil && string(b) != "key" {
				err = errors.New("wrong body " + string(b))
			}
			errs <- err
		})
	}
	<-arrived
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, 1, keys.Hits(u))
}

// TestCacheLifetime: an answer lives for its max-age, clamped to the
// policy's bounds, then is fetched again.
func TestCacheLifetime(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, cacheControl string
		ttl                time.Duration
	}{
		{"max-age", "public, max-age=600", 10 * time.Minute},
		{"no header: default", "", time.Hour},
		{"no-store: minimum", "no-store", time.Minute},
		{"short max-age: minimum", "max-age=5", time.Minute},
		{"long max-age: maximum", "max-age=31536000", 24 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := "https://api.paypal.com/ttl/" + strings.ReplaceAll(tc.name, " ", "-")
			keys.Put(u, []byte("key"), tc.cacheControl)
			f := newFetcher(keyfetch.Policy{})
			now := time.Unix(1_764_547_200, 0)
			var mu sync.Mutex
			keyfetch.SetClock(f, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
			advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
			get := func() {
				b, err := f.Get(u)
				require.NoError(t, err)
				require.Equal(t, "key", string(b))
			}
			get()
			require.EqualValues(t, 1, keys.Hits(u))
			advance(tc.ttl - time.Second)
			get()
			require.EqualValues(t, 1, keys.Hits(u), "still cached a second before its lifetime ends")
			advance(time.Second)
			get()
			require.EqualValues(t, 2, keys.Hits(u), "fetched again once its lifetime ended")
		})
	}
}

func TestCacheBounded(t *testing.T) {
	t.Parallel()
	f := newFetcher(keyfetch.Policy{MaxEntries: 2})
	for i := range 3 {
		u := "https://api.paypal.com/bounded/" + string(rune('a'+i))
		keys.Put(u, []byte("key"), "max-age="+string(rune('1'+i))+"000")
		_, err := f.Get(u)
		require.NoError(t, err)
	}
	_, err := f.Get("https://api.paypal.com/bounded/a")
	require.NoError(t, err)
	require.EqualValues(t, 2, keys.Hits("https://api.paypal.com/bounded/a"), "the entry closest to expiry was evicted")
	_, err = f.Get("https://api.paypal.com/bounded/c")
	require.NoError(t, err)
	require.EqualValues(t, 1, keys.Hits("https://api.paypal.com/bounded/c"))
}

func TestPostCachedByBody(t *testing.T) {
	t.Parallel()
	const u = "https://api.paypal.com/post/key"
	keys.Handle(u, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "want a JSON POST", http.StatusBadRequest)
			return
		}
		_, _ = w.Write([]byte("key"))
	}))
	f := newFetcher(keyfetch.Policy{})
	for _, body := range []string{`{"key_id":"a"}`, `{"key_id":"a"}`, `{"key_id":"b"}`} {
		b, err := f.Post(u, []byte(body), "application/json")
		require.NoError(t, err)
		require.Equal(t, "key", string(b))
	}
	require.EqualValues(t, 2, keys.Hits(u))
}

// TestOverrideGuard: a program that is not a test binary cannot install
// the override.
func TestOverrideGuard(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	t.Parallel()
	out, err := exec.CommandContext(t.Context(), "go", "run", "./testdata/guard").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "SetTestOverride called outside a test binary")
}

// TestFetchRateLimited: fetches that miss the cache are bounded per
// minute; over the bound a fetch is unavailable without a request, and the
// budget refills with time. Cached answers are not counted.
func TestFetchRateLimited(t *testing.T) {
	t.Parallel()
	f := newFetcher(keyfetch.Policy{MaxFetchesPerMinute: 3})
	now := time.Unix(1_764_547_200, 0)
	var mu sync.Mutex
	keyfetch.SetClock(f, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	u := func(i int) string { return "https://api.paypal.com/limited/" + string(rune('a'+i)) }
	for i := range 5 {
		keys.Put(u(i), []byte("key"), "")
	}
	for i := range 3 {
		_, err := f.Get(u(i))
		require.NoError(t, err)
		_, err = f.Get(u(i)) // cached: not a fetch
		require.NoError(t, err)
	}
	_, err := f.Get(u(3))
	require.ErrorIs(t, err, keyfetch.ErrUnavailable)
	require.Zero(t, keys.Hits(u(3)), "refused without a request")
	mu.Lock()
	now = now.Add(20 * time.Second) // one fetch refilled
	mu.Unlock()
	_, err = f.Get(u(3))
	require.NoError(t, err)
	_, err = f.Get(u(4))
	require.ErrorIs(t, err, keyfetch.ErrUnavailable)
}

// TestRefresh: a key set is fetched anew on demand (a key ID it lacks),
// at most once per MinTTL.
func TestRefresh(t *testing.T) {
	t.Parallel()
	const u = "https://api.paypal.com/refresh/keys"
	keys.Put(u, []byte("key"), "max-age=3600")
	f := newFetcher(keyfetch.Policy{})
	now := time.Unix(1_764_547_200, 0)
	var mu sync.Mutex
	keyfetch.SetClock(f, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	_, err := f.Get(u)
	require.NoError(t, err)
	_, err = f.Refresh(u)
	require.NoError(t, err)
	require.EqualValues(t, 1, keys.Hits(u), "fetched less than MinTTL ago: the cached copy")
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	_, err = f.Refresh(u)
	require.NoError(t, err)
	require.EqualValues(t, 2, keys.Hits(u))
	_, err = f.Refresh("http://api.paypal.com/refresh/keys")
	require.ErrorIs(t, err, keyfetch.ErrNotAllowed)
}
