// Package keyfetchtest is a local key server for tests: an HTTPS server on
// 127.0.0.1 that answers as the providers' key hosts do, installed with
// keyfetch.SetTestOverride (which only a test binary may call).
package keyfetchtest

import (
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"sync/atomic"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/keyfetch"
)

// Server serves what tests put on it, by the host and path of the
// provider's real URL (the URL's host stays in the request's Host).
type Server struct {
	srv *httptest.Server

	mu       sync.Mutex
	handlers map[string]http.Handler
	hits     map[string]*atomic.Int64
	anchors  map[string][]byte
}

// Start starts a server and installs it for every Fetcher of the process.
func Start() *Server {
	s := &Server{handlers: map[string]http.Handler{}, hits: map[string]*atomic.Int64{}, anchors: map[string][]byte{}}
	s.srv = httptest.NewTLSServer(http.HandlerFunc(s.serve))
	s.install()
	return s
}

func (s *Server) install() {
	pool := x509.NewCertPool()
	pool.AddCert(s.srv.Certificate())
	s.mu.Lock()
	anchors := make(map[string][]byte, len(s.anchors))
	for k, v := range s.anchors {
		anchors[k] = v
	}
	s.mu.Unlock()
	keyfetch.SetTestOverride(&keyfetch.TestOverride{
		Addr:       s.srv.Listener.Addr().String(),
		RootCAs:    pool,
		ServerName: "example.com", // in httptest's certificate
		Anchors:    anchors,
	})
}

// Close stops the server and removes the override.
func (s *Server) Close() {
	keyfetch.SetTestOverride(nil)
	s.srv.Close()
}

// SetAnchor replaces the embedded trust anchor name (keyfetch.Anchor).
func (s *Server) SetAnchor(name string, pem []byte) {
	s.mu.Lock()
	s.anchors[name] = pem
	s.mu.Unlock()
	s.install()
}

// Put serves body (200, with the given Cache-Control when not "") at the
// host and path of rawURL.
func (s *Server) Put(rawURL string, body []byte, cacheControl string) {
	s.Handle(rawURL, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if cacheControl != "" {
			w.Header().Set("Cache-Control", cacheControl)
		}
		_, _ = w.Write(body)
	}))
}

// Handle serves h at the host and path of rawURL.
func (s *Server) Handle(rawURL string, h http.Handler) {
	k := key(rawURL)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handlers[k] = h
	if s.hits[k] == nil {
		s.hits[k] = &atomic.Int64{}
	}
}

// Hits is how many requests reached the host and path of rawURL.
func (s *Server) Hits(rawURL string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.hits[key(rawURL)]; c != nil {
		return c.Load()
	}
	return 0
}

func key(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		panic(err)
	}
	return u.Host + u.Path
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	k := r.Host + r.URL.Path
	s.mu.Lock()
	h, c := s.handlers[k], s.hits[k]
	s.mu.Unlock()
	if h == nil {
		http.NotFound(w, r)
		return
	}
	c.Add(1)
	h.ServeHTTP(w, r)
}
