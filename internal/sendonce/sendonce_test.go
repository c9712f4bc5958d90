package sendonce_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/sendonce"
)

// dropper answers the first request of each connection and closes the
// connection after reading the second without answering: an upstream that
// did the work and then dropped a reused keep-alive connection. It counts
// the requests whose path is /work.
type dropper struct {
	ln   net.Listener
	mu   sync.Mutex
	work int
	wg   sync.WaitGroup
}

func newDropper(t *testing.T) *dropper {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	d := &dropper{ln: ln}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			d.wg.Add(1)
			go d.serve(c)
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); d.wg.Wait() })
	return d
}

func (d *dropper) serve(c net.Conn) {
	defer d.wg.Done()
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for n := 1; ; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		if req.URL.Path == "/work" {
			d.mu.Lock()
			d.work++
			d.mu.Unlock()
		}
		if n > 1 {
			return // the work is done; the answer never comes
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
	}
}

func (d *dropper) executions() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.work
}

// TestSetBodyNeverResent: on a reused connection the upstream does the
// work and closes without answering. Without SetBody the Transport sends a
// bodyless request with an Idempotency-Key again on a new connection (the
// upstream runs twice); with it, the forward fails once and the upstream
// ran once, whatever the method, header and body.
func TestSetBodyNeverResent(t *testing.T) {
	cases := []struct {
		name, method, header, body string
		raw                        bool // no SetBody: shows the Transport's re-send
		want                       int
	}{
		{name: "raw bodyless POST with Idempotency-Key is re-sent", method: "POST", header: "Idempotency-Key", raw: true, want: 2},
		{name: "bodyless POST with Idempotency-Key", method: "POST", header: "Idempotency-Key", want: 1},
		{name: "bodyless POST with X-Idempotency-Key", method: "POST", header: "X-Idempotency-Key", want: 1},
		{name: "bodyless DELETE with Idempotency-Key", method: "DELETE", header: "Idempotency-Key", want: 1},
		{name: "bodyless GET", method: "GET", want: 1},
		{name: "POST with body and Idempotency-Key", method: "POST", header: "Idempotency-Key", body: `{"id":"evt_1"}`, want: 1},
		{name: "bodyless POST", method: "POST", want: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := newDropper(t)
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			base := "http://" + d.ln.Addr().String()

			warm, err := http.NewRequest(http.MethodGet, base+"/warm", nil)
			require.NoError(t, err)
			resp, err := tr.RoundTrip(warm)
			require.NoError(t, err)
			_ = resp.Body.Close()

			req, err := http.NewRequest(tc.method, base+"/work", strings.NewReader(tc.body))
			require.NoError(t, err)
			if tc.header != "" {
				req.Header.Set(tc.header, "k_1")
			}
			if !tc.raw {
				sendonce.SetBody(req, []byte(tc.body))
			} else if tc.body == "" {
				req.Body, req.GetBody, req.ContentLength = nil, nil, 0 // as reverse_proxy passes an empty body on
			}
			resp, err = tr.RoundTrip(req)
			if err == nil {
				_ = resp.Body.Close()
			}
			if tc.want == 1 {
				require.Error(t, err, "the dropped answer is the forward's error")
			}
			require.Equal(t, tc.want, d.executions(), "upstream executions")
		})
	}
}

// TestSetReaderNeverResent: a body read from a stream (a spilled body) with
// an Idempotency-Key header reaches an upstream that drops the reused
// connection once, with its exact Content-Length and no chunked framing
// even when the request arrived chunked; the Transport does not send it
// again.
func TestSetReaderNeverResent(t *testing.T) {
	d := newDropper(t)
	var got *http.Request
	var gotBody []byte
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotBody, _ = io.ReadAll(r.Body)
		got = r
	}))
	defer up.Close()
	body := strings.Repeat("b", 100_000)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()

	req, err := http.NewRequest(http.MethodPost, up.URL, io.NopCloser(strings.NewReader("ignored")))
	require.NoError(t, err)
	req.TransferEncoding = []string{"chunked"} // as a chunked arrival keeps it
	sendonce.SetReader(req, strings.NewReader(body), int64(len(body)))
	require.Nil(t, req.GetBody)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, int64(len(body)), got.ContentLength)
	require.Empty(t, got.TransferEncoding)
	require.Equal(t, body, string(gotBody))

	base := "http://" + d.ln.Addr().String()
	warm, err := http.NewRequest(http.MethodGet, base+"/warm", nil)
	require.NoError(t, err)
	resp, err = tr.RoundTrip(warm)
	require.NoError(t, err)
	_ = resp.Body.Close()
	req, err = http.NewRequest(http.MethodPost, base+"/work", nil)
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "k_1")
	sendonce.SetReader(req, strings.NewReader(body), int64(len(body)))
	resp, err = tr.RoundTrip(req)
	if err == nil {
		_ = resp.Body.Close()
	}
	require.Error(t, err, "the dropped answer is the forward's error")
	require.Equal(t, 1, d.executions(), "upstream executions")
}
