package caddymodule

// How a forward ended, as the next handler left it, and what that means for
// its claims: complete, release, or ambiguous (on_ambiguous decides);
// docs/guarantees.md has the table of endings and their settles.

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/proxyerr"
)

// verdict is what a forward's end means for its claims.
type verdict int

const (
	// verdictComplete: a 2xx status line arrived from the upstream, so it
	// did the work; whatever then happened to the body or to the provider's
	// connection, the event is completed.
	verdictComplete verdict = iota + 1
	// verdictRelease: the upstream answered non-2xx, or the forward failed
	// before any request byte reached it; the next delivery is forwarded.
	verdictRelease
	// verdictAmbiguous: the forward failed after the request was written and
	// before a status line arrived; the upstream may or may not have done
	// the work. on_ambiguous decides: reforward releases, hold parks the
	// event as held.
	verdictAmbiguous
)

// verdict is the forward's verdict for the route: under provider
// idempotency_key a stored 3xx or 4xx answer completes the key instead of
// releasing it (idemKey.stores).
func (h *Handler) verdict(end forwardEnd) verdict {
	v := end.verdict()
	if v == verdictRelease && h.idem != nil && end.status != 0 && end.err == nil && !end.panicked && h.idem.stores(end.status) {
		return verdictComplete
	}
	return v
}

// forwardEnd is how one forward ended, as the next handler left it.
type forwardEnd struct {
	// status is the final (non-1xx) status the next handler wrote, 0 if none.
	status int
	// err is what the next handler returned (reverse_proxy's
	// caddyhttp.HandlerError wrapping the round trip's error).
	err error
	// timedOut: forward_timeout ended the forward before a status arrived.
	timedOut bool
	// panicked: the next handler panicked (http.ErrAbortHandler included).
	panicked bool
	// shutdown: the process exit cut the forward before a status arrived
	// (shutdownForwards).
	shutdown bool
	// wire is what net/http's transport reported about the request; zero
	// when the next handler did not use it (php_fastcgi, a custom handler).
	wire *wireTrace
	// refused: err is a handler's own refusal (refused) and no transport
	// was used, so nothing reached an upstream.
	refused bool
}

// verdict classifies the end of a forward. The rules, in order:
//
//   - a 2xx final status → complete (also when the body was then cut, the
//     provider's connection failed, or the handler panicked);
//   - any other final status → release;
//   - net/http's transport took a connection for the request but wrote no
//     request header, or a handler that forwards nothing refused it with
//     no transport used → release (nothing reached the upstream);
//   - forward_timeout, the process's exit, or a panic before any status →
//     ambiguous;
//   - an error: proxyerr.Ambiguous decides;
//   - no status and no error → release.
func (e forwardEnd) verdict() verdict {
	switch {
	case e.status >= 200 && e.status < 300:
		return verdictComplete
	case e.status >= 200:
		return verdictRelease
	case e.wire.nothingWritten(), e.refused:
		return verdictRelease
	case e.timedOut, e.shutdown, e.panicked:
		return verdictAmbiguous
	case e.err != nil && proxyerr.Ambiguous(e.err):
		return verdictAmbiguous
	}
	return verdictRelease
}

// describe says, for the log line and a hold's reason, why a forward's
// end was ambiguous and whether the upstream may still be running it.
func (e forwardEnd) describe() string {
	switch {
	case e.shutdown:
		return "Caddy stopped past its grace period while the forward ran, before an upstream status arrived; the upstream may have run the event and may still be running it"
	case e.timedOut:
		return "forward_timeout ended the forward before an upstream status arrived; the upstream may still be running the event"
	case e.panicked:
		return "the next handler panicked before an upstream status arrived; the upstream may have run the event"
	case e.err != nil:
		return "the upstream connection failed after the request was written, before a status line; the upstream may have run the event"
	}
	return ""
}

// runNext calls the next handler and recovers its panic, if any, so the
// caller can settle before raising it again.
func runNext(next caddyhttp.Handler, w http.ResponseWriter, r *http.Request) (panicked any, err error) {
	defer func() {
		if p := recover(); p != nil {
			panicked = p
		}
	}()
	return nil, next.ServeHTTP(w, r)
}

// finalStatus is the final status the next handler wrote: the recorder's,
// unless it is only an informational 1xx reverse_proxy passed on.
func finalStatus(rec caddyhttp.ResponseRecorder) int {
	if s := rec.Status(); s >= 200 {
		return s
	}
	return 0
}

// wireTrace records, through net/http's httptrace (which reverse_proxy's
// own trace composes with), whether the transport took a connection for the
// request and whether it wrote the request's headers. It lets a failure
// before any request byte (a dial or TLS error, a timeout while dialing) be
// told apart from one after.
type wireTrace struct {
	connTried, wrote atomic.Bool
}

// with returns ctx carrying the trace.
func (t *wireTrace) with(ctx context.Context) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GetConn:      func(string) { t.connTried.Store(true) },
		WroteHeaders: func() { t.wrote.Store(true) },
	})
}

// used reports whether net/http's transport took a connection for the
// request.
func (t *wireTrace) used() bool { return t != nil && t.connTried.Load() }

// refusers are the packages of handlers that answer with an error of
// their own and forward nothing: file_server (404, 405), error and other
// handlers of caddyhttp, authentication. Their caddyhttp.HandlerError
// names the function that made it (HandlerError.Trace).
var refusers = []string{"fileserver.", "caddyhttp.", "caddyauth."}

// refused reports whether err is a refusal by a handler that forwards
// nothing (refusers), so no upstream can have run the event: the claim is
// released, not held as ambiguous. An error of reverse_proxy, of its
// transports or of a handler this list does not name may follow a forward
// and stays ambiguous (proxyerr.Ambiguous).
func refused(err error) bool {
	var he caddyhttp.HandlerError
	if !errors.As(err, &he) {
		return false
	}
	for _, p := range refusers {
		if strings.HasPrefix(he.Trace, p) {
			return true
		}
	}
	return false
}

// nothingWritten reports whether net/http's transport was used for the
// request and wrote none of it. False when the transport was not used: then
// nothing is known.
func (t *wireTrace) nothingWritten() bool {
	return t != nil && t.connTried.Load() && !t.wrote.Load()
}
