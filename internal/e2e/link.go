package e2e

import (
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// Link is a TCP relay on 127.0.0.1 in front of a server (PostgreSQL), that
// a test can cut and restore: the store goes away for the gateways that
// connect through it, and for nobody else on the machine.
type Link struct {
	target string
	ln     net.Listener

	mu     sync.Mutex
	cut    bool
	silent bool
	conns  map[net.Conn]struct{}
	flows  map[*flow]struct{}
}

// flow is one relayed connection's two directions, each of which the link
// may black-hole: what arrives is read and dropped, nothing is closed or
// reset, so neither end learns anything (as behind a NAT or load balancer
// that forgot the flow).
type flow struct {
	dropUp, dropDown atomic.Bool // client to server, server to client
	// held: what arrives either way waits, kept in order, until Resume.
	held atomic.Bool
}

// NewLink listens on a free port of 127.0.0.1 and relays to target.
func NewLink(target string) (*Link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &Link{target: target, ln: ln, conns: map[net.Conn]struct{}{}, flows: map[*flow]struct{}{}}
	go l.serve()
	return l, nil
}

// Addr is the relay's host:port.
func (l *Link) Addr() string { return l.ln.Addr().String() }

func (l *Link) serve() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.mu.Lock()
		if l.cut {
			l.mu.Unlock()
			_ = c.Close()
			continue
		}
		l.conns[c] = struct{}{}
		silent := l.silent
		l.mu.Unlock()
		if silent {
			go l.swallow(c)
			continue
		}
		go l.relay(c)
	}
}

// swallow reads and drops what c sends until it closes or the link is cut:
// a connection accepted by a load balancer whose backend is gone.
func (l *Link) swallow(c net.Conn) {
	defer l.forget(c)
	_, _ = io.Copy(io.Discard, c)
}

func (l *Link) relay(c net.Conn) {
	defer l.forget(c)
	s, err := net.Dial("tcp", l.target)
	if err != nil {
		return
	}
	l.mu.Lock()
	if l.cut {
		l.mu.Unlock()
		_ = s.Close()
		return
	}
	l.conns[s] = struct{}{}
	f := &flow{}
	l.flows[f] = struct{}{}
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.flows, f)
		l.mu.Unlock()
	}()
	defer l.forget(s)
	go func() {
		_ = pump(s, c, &f.dropUp, &f.held)
		_ = s.Close()
	}()
	_ = pump(c, s, &f.dropDown, &f.held)
}

// pump copies src to dst until either fails, dropping what it reads while
// drop is set, and keeping it while held is.
func pump(dst io.Writer, src io.Reader, drop, held *atomic.Bool) error {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		for held.Load() {
			time.Sleep(10 * time.Millisecond)
		}
		if n > 0 && !drop.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err != nil {
			return err
		}
	}
}

// BlackHole silently drops everything on the flows open now, both ways,
// for good; new flows are relayed as usual. The ends of an old flow see
// neither an answer nor a reset: their next statement hangs.
func (l *Link) BlackHole() { l.blackHole(true) }

// DropReplies is BlackHole for the answers only: what the clients send on
// the flows open now still reaches the server (a statement runs, commits),
// but nothing comes back.
func (l *Link) DropReplies() { l.blackHole(false) }

func (l *Link) blackHole(up bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for f := range l.flows {
		f.dropDown.Store(true)
		if up {
			f.dropUp.Store(true)
		}
	}
}

func (l *Link) forget(c net.Conn) {
	_ = c.Close()
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
}

// Cut closes every relayed connection and closes new ones at once, until
// Restore.
func (l *Link) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = true
	for c := range l.conns {
		_ = c.Close()
	}
}

// Stall holds everything on the flows open now, both ways, and accepts
// new connections without ever answering them (as Silence), until Resume,
// which delivers what the open flows held, in order: a relay that paused.
// A statement sent on an open flow meanwhile runs, and commits, when the
// flow resumes, long after its client gave up on it.
func (l *Link) Stall() { l.setHeld(true) }

// Resume lets the stalled flows' bytes through and relays new connections
// again; those accepted while stalled stay silent.
func (l *Link) Resume() { l.setHeld(false) }

func (l *Link) setHeld(held bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.silent = held
	for f := range l.flows {
		f.held.Store(held)
	}
}

// Silence black-holes the flows open now (BlackHole) and accepts new
// connections without ever answering them, until Restore: a load balancer
// or proxy in front of a server that is gone. The connections it accepted
// meanwhile stay silent after Restore.
func (l *Link) Silence() {
	l.BlackHole()
	l.mu.Lock()
	l.silent = true
	l.mu.Unlock()
}

// Restore relays new connections again.
func (l *Link) Restore() {
	l.mu.Lock()
	l.cut = false
	l.silent = false
	l.mu.Unlock()
}

// Close stops the relay and closes its connections.
func (l *Link) Close() {
	_ = l.ln.Close()
	l.Cut()
}

// Host is the host:port of the database's server.
func (d *Database) Host() string {
	u, err := url.Parse(d.DSN)
	if err != nil {
		return ""
	}
	if u.Port() == "" {
		return u.Hostname() + ":5432"
	}
	return u.Host
}

// DSNVia is the database's DSN with the server reached at addr (a Link).
func (d *Database) DSNVia(addr string) string {
	u, err := url.Parse(d.DSN)
	if err != nil {
		return d.DSN
	}
	u.Host = addr
	return u.String()
}
