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

// TestDispatcherSendsOnce: the upstream answers a first attempt on a
// keep-alive connection, then reads the next one on that reused
// connection and closes without answering. The Transport must not send it
// again on a new connection (a job's headers may carry an Idempotency-Key,
// which net/http takes for permission to replay): one execution, and an
// ambiguous attempt the dispatcher counts.
func TestDispatcherSendsOnce(t *testing.T) {
	t.Parallel()
	for _, body := range []string{"", `{"id":"evt_1"}`} {
		t.Run("body="+body, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			t.Cleanup(func() { _ = ln.Close() })
			work := make(chan struct{}, 10)
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						br := bufio.NewReader(c)
						for n := 1; ; n++ {
							req, err := http.ReadRequest(br)
							if err != nil {
								return
							}
							_, _ = io.Copy(io.Discard, req.Body)
							if req.URL.Path != "/work" {
								_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
								continue
							}
							work <- struct{}{}
							return // the work is done; no answer
						}
					}()
				}
			}()
			d := New(nil, Options{})
			rt := newRoute(d, &Route{Scope: "s", Target: &url.URL{Scheme: "http", Host: ln.Addr().String()}, Timeout: 5 * time.Second})
			h := http.Header{"Idempotency-Key": {"k_1"}}
			warm := queue.Job{EventID: "warm", Request: queue.Request{Method: http.MethodPost, URI: "/warm", Header: h}}
			status, _ := rt.send(t.Context(), rt.cfg.Load(), warm)
			require.Equal(t, http.StatusOK, status)
			job := queue.Job{EventID: "evt_1", Request: queue.Request{Method: http.MethodPost, URI: "/work", Header: h, Body: []byte(body)}}
			status, text := rt.send(t.Context(), rt.cfg.Load(), job)
			require.Zero(t, status)
			require.Contains(t, text, "ambiguous")
			require.Len(t, work, 1, "one execution")
		})
	}
}
