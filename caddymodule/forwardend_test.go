package caddymodule

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
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
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
		_, err = plain().RoundTrip(req)
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
			require.Equal(t, tc.ambiguous, proxyErrorAmbiguous(tc.err), "%v (%T)", tc.err, tc.err)
		})
	}
	require.False(t, proxyErrorAmbiguous(nil))
}

// TestForwardEndVerdict: what a forward's end means for its claims.
func TestForwardEndVerdict(t *testing.T) {
	t.Parallel()
	traced := func(connTried, wrote bool) *wireTrace {
		w := new(wireTrace)
		w.connTried.Store(connTried)
		w.wrote.Store(wrote)
		return w
	}
	eof := caddyhttp.Error(502, io.EOF)
	for _, tc := range []struct {
		name string
		end  forwardEnd
		want verdict
	}{
		{"200", forwardEnd{status: 200}, verdictComplete},
		{"204 then body cut (ErrAbortHandler)", forwardEnd{status: 204, panicked: true}, verdictComplete},
		{"200 then copy error", forwardEnd{status: 200, err: io.ErrUnexpectedEOF}, verdictComplete},
		{"500", forwardEnd{status: 500}, verdictRelease},
		{"500 then body cut", forwardEnd{status: 500, panicked: true}, verdictRelease},
		{"404", forwardEnd{status: 404, wire: traced(true, true)}, verdictRelease},
		{"EOF after the request", forwardEnd{err: eof, wire: traced(true, true)}, verdictAmbiguous},
		{"EOF, transport not used", forwardEnd{err: eof}, verdictAmbiguous},
		{"EOF, nothing written", forwardEnd{err: eof, wire: traced(true, false)}, verdictRelease},
		{"refused", forwardEnd{err: caddyhttp.Error(502, reverseproxy.NewDialError(syscall.ECONNREFUSED))}, verdictRelease},
		{"timeout after the request", forwardEnd{timedOut: true, wire: traced(true, true)}, verdictAmbiguous},
		{"timeout while dialing", forwardEnd{timedOut: true, err: context.DeadlineExceeded, wire: traced(true, false)}, verdictRelease},
		{"timeout, transport not used", forwardEnd{timedOut: true}, verdictAmbiguous},
		{"panic before a status", forwardEnd{panicked: true}, verdictAmbiguous},
		{"no status, no error", forwardEnd{}, verdictRelease},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tc.end.verdict())
		})
	}
}

// TestForwardSurvivesPanic: a next handler that panics (reverse_proxy's
// http.ErrAbortHandler when the upstream's body is cut, or any other
// value) still settles the claim exactly once, balances the in-flight
// gauge, logs the delivery with its outcome, and the panic is raised again
// with its own value. Also for passOn (on_missing_id forward).
func TestForwardSurvivesPanic(t *testing.T) {
	t.Parallel()
	const secret = "whsec_panic"
	type custom struct{ msg string }
	for _, tc := range []struct {
		name    string
		policy  string
		value   any
		status  int // written before the panic, 0 = none
		state   store.State
		outcome string
	}{
		{"abort after 200", "hold", http.ErrAbortHandler, 200, store.StateCompleted, outcomeCompleted},
		{"abort after 200 reforward", "reforward", http.ErrAbortHandler, 200, store.StateCompleted, outcomeCompleted},
		{"abort after 503", "hold", http.ErrAbortHandler, 503, store.StateReleased, outcomeReleased},
		{"abort before a status hold", "hold", http.ErrAbortHandler, 0, store.StateHeld, outcomeAmbiguous},
		{"abort before a status reforward", "reforward", http.ErrAbortHandler, 0, store.StateReleased, outcomeReleased},
		{"custom panic after 201", "hold", custom{"boom"}, 201, store.StateCompleted, outcomeCompleted},
		{"custom panic before a status", "hold", custom{"boom"}, 0, store.StateHeld, outcomeAmbiguous},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := newUpstream()
			up.respond = func(w http.ResponseWriter, _ *http.Request, _ int) error {
				if tc.status != 0 {
					w.WriteHeader(tc.status)
					_, _ = io.WriteString(w, "partial")
				}
				panic(tc.value)
			}
			scope := uniqueScope("panic")
			g := newGateway(t, `webhook_idempotency {
				provider stripe
				secret `+secret+`
				scope `+scope+`
				on_ambiguous `+tc.policy+`
			}`, withUpstream(up))
			id := "evt_panic_" + randomHex(4)
			body := []byte(`{"id":"` + id + `","object":"event"}`)

			var recovered any
			func() {
				defer func() { recovered = recover() }()
				g.serve(g.stripe(secret, body, g.clock.Unix()))
			}()
			require.Equal(t, tc.value, recovered, "the panic is raised again with its own value")
			require.Equal(t, 1, up.count())
			ev := g.requireRow(scope, id, tc.state)
			require.Equal(t, 1, ev.Attempts)
			require.Equal(t, 0.0, gaugeValue(t, metrics.inFlight.WithLabelValues(scope)), "claims_in_flight balanced")
			lines := g.deliveryLog()
			require.Len(t, lines, 1, "one delivery line")
			require.Equal(t, tc.outcome, lines[0]["outcome"])
			require.EqualValues(t, tc.status, lines[0]["status"])
			require.Equal(t, 1.0, g.outcomes(tc.outcome))
			// Settled exactly once: no settle was retried or refused.
			require.Empty(t, g.logged("lease lost"))
			require.Empty(t, g.logged("settling event failed"))

			// The provider's retry: completed → duplicate; held → 503;
			// released → forwarded again.
			up.respond = nil
			a := g.serve(g.stripe(secret, body, g.clock.Unix()))
			switch tc.state {
			case store.StateCompleted:
				requireDuplicate(t, a)
				require.Equal(t, 1, up.count())
			case store.StateHeld:
				requireRefused(t, a, http.StatusServiceUnavailable, "held")
				require.Equal(t, 1, up.count())
			default:
				requireRelayed(t, a)
				require.Equal(t, 2, up.count())
			}
		})
	}

	t.Run("passOn", func(t *testing.T) {
		t.Parallel()
		up := newUpstream()
		up.respond = func(w http.ResponseWriter, _ *http.Request, _ int) error {
			w.WriteHeader(http.StatusOK)
			panic(http.ErrAbortHandler)
		}
		g := newGateway(t, `webhook_idempotency {
			provider stripe
			secret `+secret+`
			on_missing_id forward
		}`, withUpstream(up))
		var recovered any
		func() {
			defer func() { recovered = recover() }()
			g.serve(g.stripe(secret, []byte(`{"object":"event"}`), g.clock.Unix()))
		}()
		require.Equal(t, http.ErrAbortHandler, recovered)
		require.Equal(t, 1, up.count())
		require.Empty(t, g.rows())
		lines := g.deliveryLog()
		require.Len(t, lines, 1)
		require.Equal(t, outcomeForwardedNoID, lines[0]["outcome"])
		require.EqualValues(t, 200, lines[0]["status"])
	})
}

// panicTransport is a RoundTripper that panics, as a faulty custom one would.
type panicTransport struct{}

func (panicTransport) RoundTrip(*http.Request) (*http.Response, error) { panic("transport bug") }

// TestDispatcherSendSafe: the async dispatcher's attempt survives a panic
// (it becomes a failed attempt instead of ending the process) and names
// the class of a transport error as proxyErrorAmbiguous does.
func TestDispatcherSendSafe(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedAddr := ln.Addr().String()
	require.NoError(t, ln.Close())
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = silent.Close() })
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			readRequest(c)
			_ = c.Close() // the whole request read, no answer
		}
	}()

	job := queue.Job{EventID: "evt_1", Request: queue.Request{Method: http.MethodPost, URI: "/", Body: []byte(`{"id":"evt_1"}`)}}
	for _, tc := range []struct {
		name   string
		addr   string
		panics bool
		want   string
	}{
		{"panic", closedAddr, true, "ambiguous (the delivery panicked): transport bug"},
		{"refused", closedAddr, false, "not delivered (the request never reached the upstream)"},
		{"closed without answer", silent.Addr().String(), false, "ambiguous (the request may have reached the upstream)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDispatcher(nil)
			if tc.panics {
				d.client.Transport = panicTransport{}
			}
			rt := newRoute(d, &routeConfig{scope: "s", target: &url.URL{Scheme: "http", Host: tc.addr}, timeout: 5 * time.Second})
			status, text := rt.sendSafe(t.Context(), rt.cfg.Load(), job)
			require.Zero(t, status)
			require.Contains(t, text, tc.want)
		})
	}
}
