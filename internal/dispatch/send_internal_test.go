package dispatch

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
)

type panicTransport struct{}

func (panicTransport) RoundTrip(*http.Request) (*http.Response, error) { panic("transport bug") }

// TestDispatcherSendSafe: the async dispatcher's attempt survives a panic
// (it becomes a failed attempt instead of ending the process) and names
// the class of a transport error as proxyerr.Ambiguous does.
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
			if req, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
				_, _ = io.Copy(io.Discard, req.Body)
			}
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
			d := New(nil, Options{})
			if tc.panics {
				d.client.Transport = panicTransport{}
			}
			rt := newRoute(d, &Route{Scope: "s", Target: &url.URL{Scheme: "http", Host: tc.addr}, Timeout: 5 * time.Second})
			status, text := rt.sendSafe(t.Context(), rt.cfg.Load(), job)
			require.Zero(t, status)
			require.Contains(t, text, tc.want)
		})
	}
}
