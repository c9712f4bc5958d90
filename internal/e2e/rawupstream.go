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
	ln     net.Listener
	behave RawBehaviour
	wg     sync.WaitGroup

	mu    sync.Mutex
	calls map[string]int
	// wrote counts, per event, the answers whose bytes were all written.
	wrote map[string]int
}

// NewRawUpstream starts a raw upstream on a free port of 127.0.0.1.
func NewRawUpstream(behave RawBehaviour) (*RawUpstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &RawUpstream{ln: ln, behave: behave, calls: map[string]int{}, wrote: map[string]int{}}
	u.wg.Add(1)
	go u.accept()
	return u, nil
}

// Addr is the upstream's host:port.
func (u *RawUpstream) Addr() string { return u.ln.Addr().String() }

// Close stops accepting and waits for the connections being served.
func (u *RawUpstream) Close() {
	_ = u.ln.Close()
	u.wg.Wait()
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

func (u *RawUpstream) accept() {
	defer u.wg.Done()
	for {
		c, err := u.ln.Accept()
		if err != nil {
			return
		}
		u.wg.Add(1)
		go func() {
			defer u.wg.Done()
			u.serve(c)
		}()
	}
}

// serve handles one connection: requests one after the other (keep-alive)
// until an action closes it.
func (u *RawUpstream) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		id := gjson.GetBytes(body, "id").String()
		if len(body) == 0 {
			id = req.Header.Get("Idempotency-Key") // a bodyless request of an Idempotency-Key route
		}
		u.mu.Lock()
		u.calls[id]++
		n := u.calls[id]
		u.mu.Unlock()

		a := u.behave(id, n)
		time.Sleep(a.Delay)
		switch {
		case a.Reset:
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			return
		case a.Close:
			return
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
			return
		}
		if _, err := io.Copy(c, io.LimitReader(filler{}, int64(a.BodyBytes))); err != nil {
			return
		}
		if a.BodyBytes < length {
			return // the body is cut: close mid-answer
		}
		u.mu.Lock()
		u.wrote[id]++
		u.mu.Unlock()
	}
}

// filler is an endless body of 'x'.
type filler struct{}

func (filler) Read(p []byte) (int, error) {
	copy(p, strings.Repeat("x", len(p)))
	return len(p), nil
}
