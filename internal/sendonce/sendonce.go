// Package sendonce prepares a request that must reach its upstream at most
// once: a claimed forward, where a second copy would run the upstream's
// work twice.
//
// net/http's Transport re-sends a request by itself on a new connection
// when a reused keep-alive connection breaks before the first response
// byte, if it deems the request replayable: a GET, HEAD, OPTIONS or TRACE,
// or any request carrying an Idempotency-Key or X-Idempotency-Key header,
// whose body is nil, http.NoBody or rewindable through GetBody
// (Request.isReplayable in net/http, golang.org/issue/19943). An upstream
// that did the work and then closed the reused connection without
// answering would run it twice inside one forward. Caddy's reverse_proxy
// turns an empty body into a nil one for exactly that retry (golang/go
// issue 16036), so the body a forward hands it decides.
package sendonce

import (
	"bytes"
	"io"
	"net/http"
)

// SetBody gives r the body to send, exactly these bytes, in a form the
// Transport never re-sends: no GetBody, and for an empty body the
// Transport could replay (see the package comment) a body that is not
// nil and not http.NoBody, with ContentLength -1 so that reverse_proxy
// keeps it. On the wire such an empty body is nothing at all for methods
// that usually carry none (GET, HEAD, DELETE, OPTIONS: the Transport
// probes it and sends no framing) and a zero-length chunked body
// ("Transfer-Encoding: chunked", then "0\r\n\r\n") for the others.
func SetBody(r *http.Request, body []byte) {
	r.GetBody = nil
	switch {
	case len(body) > 0:
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
	case replayable(r):
		r.Body = empty{}
		r.ContentLength = -1
	default:
		r.Body = http.NoBody
		r.ContentLength = 0
	}
}

// SetReader gives r a body of exactly size bytes (size > 0) read from body,
// in a form the Transport never re-sends: no GetBody, and ContentLength
// size with no Transfer-Encoding (a body that arrived chunked is sent with
// its length), so the upstream gets that Content-Length. body must hold
// size bytes: a shorter one fails the forward, a longer one is cut at size.
func SetReader(r *http.Request, body io.Reader, size int64) {
	r.GetBody = nil
	r.TransferEncoding = nil
	r.Body = io.NopCloser(io.LimitReader(body, size))
	r.ContentLength = size
}

// replayable reports whether the Transport would replay r with an empty
// body: the method and header tests of net/http's Request.isReplayable.
func replayable(r *http.Request) bool {
	switch r.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, key := r.Header["Idempotency-Key"]
	_, xkey := r.Header["X-Idempotency-Key"]
	return key || xkey
}

// empty is an empty body net/http does not recognise as one.
type empty struct{}

func (empty) Read([]byte) (int, error) { return 0, io.EOF }
func (empty) Close() error             { return nil }
