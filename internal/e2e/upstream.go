package e2e

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/tidwall/gjson"
)

// Answer is what the upstream does with one call: wait Delay (or until the
// gateway hangs up), then answer Status.
type Answer struct {
	Delay  time.Duration
	Status int // 0 = 200
	// Cut: after the delay, the upstream sends its status line and part of
	// the body it announced, then closes the connection (reverse_proxy then
	// logs "aborting with incomplete response" with the request's headers).
	Cut bool
}

// Behaviour decides the answer to the n-th call (1-based) for an event.
type Behaviour func(eventID string, n int) Answer

// Call is one request the upstream received.
type Call struct {
	At     time.Time // received
	Done   time.Time // answered or abandoned
	Status int       // status written; 0 when the gateway hung up first
}

// Success reports whether the upstream answered the call with a 2xx, that
// is did the event's work and said so.
func (c Call) Success() bool { return c.Status >= 200 && c.Status < 300 }

// Upstream is the application behind the gateway: an HTTP server on
// 127.0.0.1 that records every call by the event ID in the body's "id"
// (Stripe's event ID) and answers as its Behaviour says.
type Upstream struct {
	behave Behaviour
	srv    *http.Server
	ln     net.Listener

	mu      sync.Mutex
	calls   map[string][]Call
	changed chan struct{} // closed and replaced on every recorded change
}

// NewUpstream starts an upstream on a free port of 127.0.0.1. A nil
// behaviour answers 200 at once.
func NewUpstream(behave Behaviour) (*Upstream, error) {
	return ListenUpstream("127.0.0.1:0", behave)
}

// ListenUpstream starts an upstream on addr, e.g. a port a gateway already
// proxies to.
func ListenUpstream(addr string, behave Behaviour) (*Upstream, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if behave == nil {
		behave = func(string, int) Answer { return Answer{} }
	}
	u := &Upstream{behave: behave, ln: ln, calls: map[string][]Call{}, changed: make(chan struct{})}
	u.srv = &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = u.srv.Serve(ln) }()
	return u, nil
}

// Addr is the upstream's host:port.
func (u *Upstream) Addr() string { return u.ln.Addr().String() }

// Close stops the server, cutting calls still waiting.
func (u *Upstream) Close() { _ = u.srv.Close() }

// ServeHTTP records the call and answers it.
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	id := gjson.GetBytes(body, "id").String()
	u.mu.Lock()
	n := len(u.calls[id])
	u.calls[id] = append(u.calls[id], Call{At: time.Now()})
	u.notifyLocked()
	u.mu.Unlock()

	a := u.behave(id, n+1)
	status := a.Status
	if status == 0 {
		status = http.StatusOK
	}
	if a.Delay > 0 {
		t := time.NewTimer(a.Delay)
		select {
		case <-t.C:
		case <-r.Context().Done(): // the gateway hung up (or died): no answer, no work
			t.Stop()
			status = 0
		}
	}
	if status != 0 && a.Cut {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "1000")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"upstream":`)
		_ = http.NewResponseController(w).Flush()
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
	} else if status != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"upstream":true}`)
	}
	u.mu.Lock()
	u.calls[id][n].Done = time.Now()
	u.calls[id][n].Status = status
	u.notifyLocked()
	u.mu.Unlock()
}

func (u *Upstream) notifyLocked() {
	close(u.changed)
	u.changed = make(chan struct{})
}

// Calls returns a copy of the calls recorded for an event.
func (u *Upstream) Calls(eventID string) []Call {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]Call(nil), u.calls[eventID]...)
}

// Successes counts the calls for an event answered 2xx.
func (u *Upstream) Successes(eventID string) int {
	n := 0
	for _, c := range u.Calls(eventID) {
		if c.Success() {
			n++
		}
	}
	return n
}

// Snapshot returns a copy of every event's calls.
func (u *Upstream) Snapshot() map[string][]Call {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make(map[string][]Call, len(u.calls))
	for id, cs := range u.calls {
		out[id] = append([]Call(nil), cs...)
	}
	return out
}

// WaitFor waits until cond holds for the event's calls, or ctx ends.
func (u *Upstream) WaitFor(ctx context.Context, eventID string, cond func([]Call) bool) error {
	for {
		u.mu.Lock()
		ok := cond(u.calls[eventID])
		ch := u.changed
		u.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return errors.New("e2e: upstream: condition not met for " + eventID + ": " + ctx.Err().Error())
		}
	}
}
