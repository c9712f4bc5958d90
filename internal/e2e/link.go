package e2e

import (
	"io"
	"net"
	"net/url"
	"sync"
)

// Link is a TCP relay on 127.0.0.1 in front of a server (PostgreSQL), that
// a test can cut and restore: the store goes away for the gateways that
// connect through it, and for nobody else on the machine.
type Link struct {
	target string
	ln     net.Listener

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
}

// NewLink listens on a free port of 127.0.0.1 and relays to target.
func NewLink(target string) (*Link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &Link{target: target, ln: ln, conns: map[net.Conn]struct{}{}}
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
		l.mu.Unlock()
		go l.relay(c)
	}
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
	l.mu.Unlock()
	defer l.forget(s)
	go func() {
		_, _ = io.Copy(s, c)
		_ = s.Close()
	}()
	_, _ = io.Copy(c, s)
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

// Restore relays new connections again.
func (l *Link) Restore() {
	l.mu.Lock()
	l.cut = false
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
