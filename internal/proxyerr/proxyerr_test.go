package proxyerr_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/proxyerr"
)

// realTransportError makes one request with net/http's transport to a
// server on 127.0.0.1 that does what serve says with the raw connection,
// and returns the transport's error.
func realTransportError(t *testing.T, tr *http.Transport, serve func(net.Conn)) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		serve(c)
	}()
	return roundTrip(t, tr, "http://"+ln.Addr().String()+"/")
}

func roundTrip(t *testing.T, tr *http.Transport, url string) error {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, io.NopCloser(stringsReader(`{"id":"evt_1"}`)))
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	if err == nil {
		_ = resp.Body.Close()
		t.Fatalf("round trip to %s succeeded (%d)", url, resp.StatusCode)
	}
	return err
}

func stringsReader(s string) io.Reader { return &stringReader{s: s} }

// stringReader is a body net/http cannot rewind, as reverse_proxy's is.
type stringReader struct{ s string }

func (r *stringReader) Read(p []byte) (int, error) {
	if r.s == "" {
		return 0, io.EOF
	}
	n := copy(p, r.s)
	r.s = r.s[n:]
	return n, nil
}

// readRequest reads one whole request (head and body) off a raw
// connection.
func readRequest(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	req, err := http.ReadRequest(bufio.NewReader(c))
	if err == nil {
		_, _ = io.Copy(io.Discard, req.Body)
	}
}

// TestProxyErrorAmbiguous is the classification table of the README's
// "Guarantees" section, over errors as net/http's transport and
// reverse_proxy return them: real ones from sockets where they can be
// provoked on 127.0.0.1, built ones otherwise.
func TestProxyErrorAmbiguous(t *testing.T) {
	t.Parallel()
	plain := func() *http.Transport { return &http.Transport{DisableKeepAlives: true} }

	// A port nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedAddr := ln.Addr().String()
	require.NoError(t, ln.Close())
	refused := roundTrip(t, plain(), "http://"+closedAddr+"/")
	require.ErrorIs(t, refused, syscall.ECONNREFUSED)

	// The upstream reads the whole request, then closes without a word.
	eof := realTransportError(t, plain(), readRequest)
	// It resets the connection after reading the request.
	reset := realTransportError(t, plain(), func(c net.Conn) {
		readRequest(c)
		_ = c.(*net.TCPConn).SetLinger(0)
	})
	// It sends half a status line, then closes.
	halfStatus := realTransportError(t, plain(), func(c net.Conn) {
		readRequest(c)
		_, _ = io.WriteString(c, "HTTP/1.1 20")
	})
	// It never answers: ResponseHeaderTimeout.
	headerTimeout := realTransportError(t, &http.Transport{DisableKeepAlives: true, ResponseHeaderTimeout: 100 * time.Millisecond},
		func(c net.Conn) { readRequest(c); time.Sleep(2 * time.Second) })
	// TLS to a plain HTTP server.
	tlsToPlain := func() error {
		srv := httptest.NewServer(http.NotFoundHandler())
		t.Cleanup(srv.Close)
		return roundTrip(t, plain(), "https://"+srv.Listener.Addr().String()+"/")
	}()
	// TLS with an untrusted certificate.
	untrusted := func() error {
		srv := httptest.NewTLSServer(http.NotFoundHandler())
		t.Cleanup(srv.Close)
		return roundTrip(t, plain(), srv.URL+"/")
	}()
	// A request whose context deadline (forward_timeout) passes while the
	// upstream holds it.
	deadline := func() error {
		srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body) // then net/http notices the client leave
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		}))
		t.Cleanup(srv.Close)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, stringsReader("x"))
		require.NoError(t, err)
		resp, err := plain().RoundTrip(req)
		if resp != nil {
			_ = resp.Body.Close()
		}
		require.Error(t, err)
		return err
	}()

	dnsErr := &net.DNSError{Err: "no such host", Name: "upstream.invalid", IsNotFound: true}
	dialTimeout := &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
	// reverse_proxy ends with caddyhttp.Error(status, err), the dial
	// errors of its transport wrapped in DialError.
	proxied := func(status int, err error) error { return caddyhttp.Error(status, err) }

	for _, tc := range []struct {
		name      string
		err       error
		ambiguous bool
	}{
		{"connection refused (real)", refused, false},
		{"connection refused via reverse_proxy", proxied(502, reverseproxy.DialError{}), false},
		{"connection refused wrapped as reverse_proxy does", proxied(502, reverseproxy.NewDialError(refused)), false},
		{"DNS error", proxied(502, reverseproxy.NewDialError(&net.OpError{Op: "dial", Net: "tcp", Err: dnsErr})), false},
		{"DNS error bare", dnsErr, false},
		{"dial timeout", proxied(504, dialTimeout), false},
		{"dial timeout as DialError", proxied(504, reverseproxy.NewDialError(dialTimeout)), false},
		{"TLS to a plain server (real)", proxied(502, tlsToPlain), false},
		{"TLS untrusted certificate (real)", proxied(502, untrusted), false},
		{"TLS handshake timeout", proxied(504, errors.New("net/http: TLS handshake timeout")), false},
		{"TLS alert", proxied(502, fmt.Errorf("remote error: %w", tls.AlertError(40))), false},
		{"TLS hostname mismatch", proxied(502, x509.HostnameError{Host: "upstream"}), false},
		{"no upstreams available", proxied(503, errors.New("no upstreams available")), false},

		{"EOF after the request (real)", proxied(502, eof), true},
		{"reset after the request (real)", proxied(502, reset), true},
		{"half a status line (real)", proxied(502, halfStatus), true},
		{"timeout awaiting response headers (real)", proxied(504, headerTimeout), true},
		{"forward_timeout after the request (real)", proxied(504, deadline), true},
		{"io.EOF", io.EOF, true},
		{"io.ErrUnexpectedEOF", proxied(502, io.ErrUnexpectedEOF), true},
		{"ECONNRESET on read", proxied(502, &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}), true},
		{"EPIPE on write", proxied(502, &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}), true},
		{"server closed idle connection", proxied(502, errors.New("http: server closed idle connection")), true},
		{"transport connection broken", proxied(502, fmt.Errorf("net/http: HTTP/1.x transport connection broken: %w", io.ErrUnexpectedEOF)), true},
		{"context deadline", proxied(504, context.DeadlineExceeded), true},
		{"unknown error", errors.New("something else"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.ambiguous, proxyerr.Ambiguous(tc.err), "%v (%T)", tc.err, tc.err)
		})
	}
	require.False(t, proxyerr.Ambiguous(nil))
}
