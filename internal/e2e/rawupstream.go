package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
)

// RawAction is what a RawUpstream does with one request, on the socket,
// once it has read the whole request.
type RawAction struct {
	// Delay is waited before answering (or before Close).
	Delay time.Duration
	// Close closes the connection without writing anything.
	Close bool
	// Reset closes it with a TCP RST (SO_LINGER 0) instead.
	Reset bool
	// Status is the status line's code (default 200).
	Status int
	// ContentLength is the announced length; BodyBytes are the bytes
	// written. BodyBytes < ContentLength cuts the body: the connection is
	// closed after BodyBytes. ContentLength 0 means BodyBytes.
	ContentLength, BodyBytes int
}

// RawBehaviour decides the action for the n-th request (1-based) of an event.
type RawBehaviour func(eventID string, n int) RawAction

// RawUpstream is an upstream on a raw TCP socket of 127.0.0.1: it reads
// each request with net/http's parser, records it by the body's "id", and
// then writes exactly what its behaviour says, including answers no
// net/http server would give (a cut body, no answer at all). A bodyless
// request is recorded by its Idempotency-Key header.
type RawUpstream struct {
	*rawServer
	behave RawBehaviour

	mu    sync.Mutex
	calls map[string]int
	// wrote counts, per event, the answers whose bytes were all written.
	wrote map[string]int
}

// NewRawUpstream starts a raw upstream on a free port of 127.0.0.1.
func NewRawUpstream(behave RawBehaviour) (*RawUpstream, error) {
	u := &RawUpstream{behave: behave, calls: map[string]int{}, wrote: map[string]int{}}
	var err error
	u.rawServer, err = startRawServer(30*time.Second, u.handle)
	return u, err
}

// Calls is how many requests of the event the upstream read: its
// executions.
func (u *RawUpstream) Calls(eventID string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[eventID]
}

// Written is how many answers to the event were written completely (their
// last byte accepted by the socket).
func (u *RawUpstream) Written(eventID string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.wrote[eventID]
}

// handle records the request by its event ID and returns its action.
func (u *RawUpstream) handle(req *http.Request, body []byte) (RawAction, func()) {
	id := gjson.GetBytes(body, "id").String()
	if len(body) == 0 {
		id = req.Header.Get("Idempotency-Key") // a bodyless request of an Idempotency-Key route
	}
	u.mu.Lock()
	u.calls[id]++
	n := u.calls[id]
	u.mu.Unlock()
	return u.behave(id, n), func() {
		u.mu.Lock()
		u.wrote[id]++
		u.mu.Unlock()
	}
}

// rawServer serves connections of 127.0.0.1 by hand, so that a test
// upstream writes exactly the bytes it chooses (a cut body, no answer at
// all): it reads each request of a connection in turn (keep-alive) with
// net/http's parser and writes the RawAction handle returns; written, when
// not nil, runs once the whole answer was accepted by the socket.
type rawServer struct {
	ln     net.Listener
	wg     sync.WaitGroup
	idle   time.Duration // how long a connection may wait for its next request
	handle func(req *http.Request, body []byte) (a RawAction, written func())
}

func startRawServer(idle time.Duration, handle func(*http.Request, []byte) (RawAction, func())) (*rawServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &rawServer{ln: ln, idle: idle, handle: handle}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr is the upstream's host:port.
func (s *rawServer) Addr() string { return s.ln.Addr().String() }

// Close stops accepting and waits for the connections being served.
func (s *rawServer) Close() {
	_ = s.ln.Close()
	s.wg.Wait()
}

func (s *rawServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serve(c)
		}()
	}
}

// serve handles one connection until an action closes it.
func (s *rawServer) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		_ = c.SetReadDeadline(time.Now().Add(s.idle))
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		a, written := s.handle(req, body)
		if !writeRaw(c, a) {
			return
		}
		if written != nil {
			written()
		}
	}
}

// writeRaw waits a.Delay and writes a; false when the connection is to be
// closed (a closing action, a cut body, a failed write).
func writeRaw(c net.Conn, a RawAction) bool {
	time.Sleep(a.Delay)
	switch {
	case a.Reset:
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		return false
	case a.Close:
		return false
	}
	status := a.Status
	if status == 0 {
		status = http.StatusOK
	}
	length := a.ContentLength
	if length == 0 {
		length = a.BodyBytes
	}
	_ = c.SetWriteDeadline(time.Now().Add(30 * time.Second))
	head := fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n",
		status, http.StatusText(status), length)
	if _, err := io.WriteString(c, head); err != nil {
		return false
	}
	if _, err := io.Copy(c, io.LimitReader(filler{}, int64(a.BodyBytes))); err != nil {
		return false
	}
	return a.BodyBytes >= length // a cut body: close mid-answer
}

// filler is an endless body of 'x'.
type filler struct{}

func (filler) Read(p []byte) (int, error) {
	copy(p, strings.Repeat("x", len(p)))
	return len(p), nil
}
