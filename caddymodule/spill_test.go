package caddymodule

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/stretchr/testify/require"
)

// spilledFiles lists the temporary files of spilled bodies in dir.
func spilledFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "caddy-webhook-body-*"))
	require.NoError(t, err)
	return m
}

// TestSpillBody: the spill reader keeps exactly the bytes read (what was
// buffered, then the rest), their SHA-256 computed on the way, in a 0600
// file that remove deletes; it stops one byte past the limit; a read error
// is the body's own, a file that cannot be created wraps errSpillDisk.
func TestSpillBody(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("TMPDIR", dir)
	body := bytes.Repeat([]byte("0123456789abcdef"), 300_000) // 4.8 MB
	sum := sha256.Sum256(body)

	s, n, err := spillBody(body[:1000], iotest.HalfReader(bytes.NewReader(body[1000:])), int64(len(body)))
	require.NoError(t, err)
	require.Equal(t, int64(len(body)), n)
	require.Equal(t, n, s.size)
	require.Equal(t, sum, s.sum)
	require.Equal(t, bodyKey(body), s.key())
	k, err := s.deliveryKey("evt_1")
	require.NoError(t, err)
	require.Equal(t, deliveryKey("evt_1", body), k)
	got, err := io.ReadAll(s.reader())
	require.NoError(t, err)
	require.True(t, bytes.Equal(body, got), "the file holds the body byte for byte")
	got, err = s.bytes()
	require.NoError(t, err)
	require.True(t, bytes.Equal(body, got))
	files := spilledFiles(t, dir)
	require.Len(t, files, 1)
	fi, err := os.Stat(files[0])
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	s.remove()
	require.Empty(t, spilledFiles(t, dir))

	// Past the limit: one byte more is read, then nothing.
	s, n, err = spillBody(nil, bytes.NewReader(body), 2_000_000)
	require.NoError(t, err)
	require.Equal(t, int64(2_000_001), n)
	s.remove()

	errGone := errors.New("provider hung up")
	s, _, err = spillBody(body[:10], io.MultiReader(bytes.NewReader(body[:5000]), iotest.ErrReader(errGone)), int64(len(body)))
	require.ErrorIs(t, err, errGone)
	require.NotErrorIs(t, err, errSpillDisk)
	require.NotNil(t, s, "the file is returned for its removal")
	s.remove()
	require.Empty(t, spilledFiles(t, dir))

	t.Setenv("TMPDIR", filepath.Join(dir, "missing"))
	_, _, err = spillBody(nil, bytes.NewReader(body), int64(len(body)))
	require.ErrorIs(t, err, errSpillDisk)
}

// TestSpillRoutes: which routes spill (spillVerifier), and max_body's
// default: the preset's documented largest body when it is larger than
// 5 MB, an operator's max_body always winning.
func TestSpillRoutes(t *testing.T) {
	t.Parallel()
	build := func(t *testing.T, snippet string) *Handler {
		t.Helper()
		h := new(Handler)
		require.NoError(t, h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(snippet)))
		require.NoError(t, h.prepareConfig())
		require.NoError(t, h.provisionIntake())
		return h
	}
	for _, c := range []struct {
		snippet string
		spills  bool
		maxBody int64
	}{
		{"webhook_idempotency {\nprovider github\nsecret x\n}", true, 25 << 20},
		{"webhook_idempotency {\nprovider github\nsecret x\nmax_body 1MB\n}", true, 1_000_000},
		{"webhook_idempotency {\nprovider gitlab\nsecret x\n}", true, 25 << 20},              // a token binds no body: the body is only read
		{"webhook_idempotency {\nprovider stripe\nsecret whsec_x\n}", false, defaultMaxBody}, // a JSON object required
		{"webhook_idempotency {\nprovider shopify\nsecret x\n}", true, defaultMaxBody},
		{"webhook_idempotency {\nprovider bitbucket\nsecret x\n}", true, defaultMaxBody}, // 256 KiB documented: never lowers the default
		{"webhook_idempotency {\nprovider github\nsecret x\nevent_id json hook_id\n}", false, 25 << 20},
		{"webhook_idempotency {\nprovider github\nsecret x\nmode async\nstorage postgres postgres://127.0.0.1:9/x\ndeliver_to http://127.0.0.1:9/\n}", false, 25 << 20},
		{"webhook_idempotency {\nprovider slack\nsecret x\n}", false, defaultMaxBody}, // a handshake reads the body
		{"webhook_idempotency {\nprovider hmac\nsecret x\nhmac {\nheader X-Sig\n}\nevent_id header X-Id\n}", true, defaultMaxBody},
	} {
		h := build(t, c.snippet)
		require.Equal(t, c.spills, h.spillVerifier() != nil, c.snippet)
		require.Equal(t, c.maxBody, h.MaxBody, c.snippet)
	}
}

// bigUpstream is the upstream of the spill test: it hashes each forward's
// body as it reads it (never holding it) and records what it got.
type bigUpstream struct {
	*httptest.Server
	mu   sync.Mutex
	got  []bigForward
	gate chan struct{} // when set, a forward waits for it after reading the body
	in   chan struct{} // receives once per forward that waits
}

type bigForward struct {
	id               string
	sum              [sha256.Size]byte
	read, declared   int64
	transferEncoding []string
}

func newBigUpstream(t *testing.T) *bigUpstream {
	u := &bigUpstream{in: make(chan struct{}, 4)}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hs := sha256.New()
		n, _ := io.Copy(hs, r.Body)
		f := bigForward{id: r.Header.Get("X-GitHub-Delivery"), read: n, declared: r.ContentLength, transferEncoding: r.TransferEncoding}
		hs.Sum(f.sum[:0])
		u.mu.Lock()
		u.got = append(u.got, f)
		gate := u.gate
		u.mu.Unlock()
		if gate != nil {
			u.in <- struct{}{}
			<-gate
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *bigUpstream) forwards() []bigForward {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]bigForward(nil), u.got...)
}

// bigRoute starts a real Caddy with one GitHub route on PostgreSQL in
// front of a bigUpstream, with spool as given, temporary files in a
// directory of the test's own; it returns the route's secret, the
// upstream and that directory.
func bigRoute(t *testing.T, scope, spool string) (secret string, up *bigUpstream, tmp string) {
	tmp = t.TempDir()
	t.Setenv("TMPDIR", tmp)
	secret = "gh-" + randomHex(8)
	up = newBigUpstream(t)
	dsn := pgDSN(t)
	table := "spill_" + randomHex(6)
	t.Cleanup(func() { dropTable(dsn, table) })
	startCaddy(t, fmt.Sprintf(`{
`+caddyTestGlobals+`}
http://localhost:9080 {
	handle /github {
		webhook_idempotency {
			provider github
			secret %q
			storage postgres %q
			table %s
			scope %s
			spool %q
		}
		reverse_proxy %s
	}
}`, secret, dsn, table, uniqueScope(scope), spool, up.Listener.Addr().String()))
	return secret, up, tmp
}

// hold makes the upstream's next forward wait, once it has read the body,
// until the returned release is called (at the latest when the test ends,
// before the upstream closes, so a failed check leaves no forward waiting).
func (u *bigUpstream) hold(t *testing.T) (release func()) {
	gate := make(chan struct{})
	release = sync.OnceFunc(func() {
		u.mu.Lock()
		u.gate = nil
		u.mu.Unlock()
		close(gate)
	})
	t.Cleanup(release)
	u.mu.Lock()
	u.gate = gate
	u.mu.Unlock()
	return release
}

// entered waits for the held forward to reach the upstream.
func (u *bigUpstream) entered(t *testing.T) {
	t.Helper()
	select {
	case <-u.in:
	case <-time.After(30 * time.Second):
		t.Fatal("the delivery never reached the upstream")
	}
}

// requireOneSpill requires one temporary file in tmp, readable by the
// gateway's user only, holding the body's size bytes: the body of the
// forward held at the upstream.
func requireOneSpill(t *testing.T, tmp string, size int) {
	t.Helper()
	files := spilledFiles(t, tmp)
	require.Len(t, files, 1, "the body is spilled to one temporary file while forwarded")
	fi, err := os.Stat(files[0])
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	require.Equal(t, int64(size), fi.Size())
}

// requireNoSpill requires every temporary file of tmp gone: it goes when
// ServeHTTP returns, just after the answer.
func requireNoSpill(t *testing.T, tmp string) {
	t.Helper()
	require.Eventually(t, func() bool { return len(spilledFiles(t, tmp)) == 0 }, 5*time.Second, 10*time.Millisecond,
		"the temporary file outlived its request")
}

// TestBigGitHubDelivery (issue 21): a 25 MB signed GitHub push through a
// real Caddy on PostgreSQL is forwarded once with exactly its bytes and
// Content-Length, from a 0600 temporary file that is gone once the request
// ends; its duplicate is answered at the edge; the same body tampered is
// refused and not forwarded; a body over max_body gets 413, announced or
// not, and is not forwarded. The default max_body is GitHub's 25 MiB.
func TestBigGitHubDelivery(t *testing.T) {
	secret, up, tmp := bigRoute(t, "gh_big", filepath.Join(t.TempDir(), "spool"))

	body := bigPush(25_000_000)
	post := func(body []byte, guid string, chunked bool) result {
		var r io.Reader = bytes.NewReader(body)
		if chunked {
			r = io.MultiReader(r) // no length known: sent chunked
		}
		req, err := http.NewRequest(http.MethodPost, gatewayBase+"/github", r)
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-GitHub-Event", "push")
		req.Header.Set("X-GitHub-Delivery", guid)
		req.Header.Set("X-Hub-Signature-256", "sha256="+hexOf(mac256([]byte(secret), body)))
		return send(t, req)
	}

	// Forwarded once, exactly: held at the upstream to see the file.
	release := up.hold(t)
	done := make(chan result, 1)
	go func() { done <- post(body, "guid-1", false) }()
	up.entered(t)
	requireOneSpill(t, tmp, len(body))
	release()
	res := <-done
	require.Equal(t, http.StatusOK, res.status, res.body)
	fw := up.forwards()
	require.Len(t, fw, 1)
	require.Equal(t, sha256.Sum256(body), fw[0].sum, "the upstream got exactly the bytes GitHub signed")
	require.Equal(t, int64(len(body)), fw[0].read)
	require.Equal(t, int64(len(body)), fw[0].declared, "with its exact Content-Length")
	require.Empty(t, fw[0].transferEncoding)
	requireNoSpill(t, tmp)

	// The redelivery: a duplicate at the edge.
	res = post(body, "guid-1", false)
	require.Equal(t, http.StatusOK, res.status)
	require.True(t, res.replayed, res.body)
	require.Len(t, up.forwards(), 1)
	requireNoSpill(t, tmp)

	// Tampered: the signature of the body, one byte changed.
	tampered := bytes.Clone(body)
	tampered[len(tampered)/2] ^= 1
	req, err := http.NewRequest(http.MethodPost, gatewayBase+"/github", bytes.NewReader(tampered))
	require.NoError(t, err)
	req.Header.Set("X-GitHub-Delivery", "guid-2")
	req.Header.Set("X-Hub-Signature-256", "sha256="+hexOf(mac256([]byte(secret), body)))
	res = send(t, req)
	require.Equal(t, http.StatusBadRequest, res.status, res.body) // github's refuse_status
	require.Contains(t, res.body, "no matching signature")
	require.Len(t, up.forwards(), 1)
	requireNoSpill(t, tmp)

	// Over max_body (25 MiB by default): announced, then not.
	over := bigPush(25<<20 + 1)
	for _, chunked := range []bool{false, true} {
		res = post(over, fmt.Sprintf("guid-over-%v", chunked), chunked)
		require.Equal(t, http.StatusRequestEntityTooLarge, res.status, res.body)
		require.Len(t, up.forwards(), 1)
		requireNoSpill(t, tmp)
	}

	// A body just under the cap, sent chunked, goes through too.
	under := bigPush(25 << 20)
	res = post(under, "guid-3", true)
	require.Equal(t, http.StatusOK, res.status, res.body)
	fw = up.forwards()
	require.Len(t, fw, 2)
	require.Equal(t, sha256.Sum256(under), fw[1].sum)
	require.Equal(t, int64(len(under)), fw[1].declared)
	requireNoSpill(t, tmp)
}

// bigPush is a GitHub push payload of exactly n bytes (n > 100).
func bigPush(n int) []byte {
	head := `{"ref":"refs/heads/main","commits":[{"message":"`
	tail := `"}]}`
	return []byte(head + strings.Repeat("x", n-len(head)-len(tail)) + tail)
}

// TestGzipBodiesDecodeToFile: on a route that spills, a gzip delivery's
// decoded body past spillAbove goes to a temporary file, not to memory, so
// a small compressed body cannot cost max_body before its signature is
// checked (a gzip bomb); it is verified from the file and the upstream
// gets the compressed bytes as they arrived. Decoding past max_body is
// refused 413, and no file outlives its request.
func TestGzipBodiesDecodeToFile(t *testing.T) {
	secret, up, tmp := bigRoute(t, "gh_gz", "off")

	post := func(compressed, signed []byte, guid string) result {
		req, err := http.NewRequest(http.MethodPost, gatewayBase+"/github", bytes.NewReader(compressed))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Content-Encoding", "gzip")
		req.Header.Set("X-GitHub-Event", "push")
		req.Header.Set("X-GitHub-Delivery", guid)
		req.Header.Set("X-Hub-Signature-256", "sha256="+hexOf(mac256([]byte(secret), signed)))
		return send(t, req)
	}

	decoded := bigPush(3 << 20)
	compressed := gzipped(t, decoded)
	require.Less(t, len(compressed), spillAbove, "the compressed body itself stays in memory")

	release := up.hold(t)
	done := make(chan result, 1)
	go func() { done <- post(compressed, decoded, "gz-1") }()
	up.entered(t)
	requireOneSpill(t, tmp, len(decoded))
	release()
	res := <-done
	require.Equal(t, http.StatusOK, res.status, res.body)
	fw := up.forwards()
	require.Len(t, fw, 1)
	require.Equal(t, sha256.Sum256(compressed), fw[0].sum, "the upstream got the compressed bytes as they arrived")
	require.Equal(t, int64(len(compressed)), fw[0].declared)
	requireNoSpill(t, tmp)

	res = post(compressed, decoded, "gz-1")
	require.Equal(t, http.StatusOK, res.status)
	require.True(t, res.replayed, res.body)
	require.Len(t, up.forwards(), 1)

	// Signed over other decoded bytes: refused from the file.
	other := bytes.Clone(decoded)
	other[len(other)/2] ^= 1
	res = post(compressed, other, "gz-2")
	require.Equal(t, http.StatusBadRequest, res.status, res.body)
	require.Contains(t, res.body, "no matching signature")
	require.Len(t, up.forwards(), 1)
	requireNoSpill(t, tmp)

	// A bomb: 26 MiB of zeros in about 26 KB; refused once decoding passes
	// max_body (GitHub's 25 MiB), never forwarded.
	bomb := gzipped(t, make([]byte, 26<<20))
	require.Less(t, len(bomb), 64<<10)
	res = post(bomb, []byte("x"), "gz-bomb")
	require.Equal(t, http.StatusRequestEntityTooLarge, res.status, res.body)
	require.Contains(t, res.body, "decoded body exceeds max_body")
	require.Len(t, up.forwards(), 1)
	requireNoSpill(t, tmp)
}
