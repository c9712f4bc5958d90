// Package keyfetchtest is a local key server for tests: an HTTPS server on
// 127.0.0.1 that answers as the providers' key hosts do, installed with
// keyfetch.SetTestOverride (which only a test binary may call).
package keyfetchtest

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
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
	anchors  map[string][]byte            // name → PEM bundle
	jwks     map[string][]json.RawMessage // host+path → JWKs
	byKeyID  map[string][]byte            // host+path#key_id → body
	failing  map[string]bool              // host+path answered 503
}

// Start starts a server and installs it for every Fetcher of the process.
func Start() *Server {
	s := &Server{
		handlers: map[string]http.Handler{}, hits: map[string]*atomic.Int64{},
		anchors: map[string][]byte{}, jwks: map[string][]json.RawMessage{}, byKeyID: map[string][]byte{},
		failing: map[string]bool{},
	}
	s.srv = httptest.NewTLSServer(http.HandlerFunc(s.serve))
	pool := x509.NewCertPool()
	pool.AddCert(s.srv.Certificate())
	keyfetch.SetTestOverride(&keyfetch.TestOverride{
		Addr:       s.srv.Listener.Addr().String(),
		RootCAs:    pool,
		ServerName: "example.com", // in httptest's certificate
		Anchor:     s.anchor,
		Publish:    s.Publish,
	})
	return s
}

// Close stops the server and removes the override.
func (s *Server) Close() {
	keyfetch.SetTestOverride(nil)
	s.srv.Close()
}

func (s *Server) anchor(name string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.anchors[name])
}

// Publish takes what keyfetch.Publish is given:
//   - "anchor:<name>": a PEM certificate added to trust anchor name;
//   - "jwks:<url>": a JWK added to the key set served at url;
//   - "<url>#<client_id>:<key_id>": the answer of a POST to url whose JSON
//     body names client_id and key_id (Plaid's key endpoint; any other
//     pair is answered 400, as Plaid answers an unknown key);
//   - "<url>": the answer of a GET of url.
func (s *Server) Publish(key string, body []byte) {
	switch {
	case strings.HasPrefix(key, "anchor:"):
		s.mu.Lock()
		name := strings.TrimPrefix(key, "anchor:")
		s.anchors[name] = append(append(s.anchors[name], body...), '\n')
		s.mu.Unlock()
	case strings.HasPrefix(key, "jwks:"):
		u := strings.TrimPrefix(key, "jwks:")
		s.mu.Lock()
		k := hostPath(u)
		var kid struct {
			Kid string `json:"kid"`
		}
		_ = json.Unmarshal(body, &kid)
		s.jwks[k] = slices.DeleteFunc(s.jwks[k], func(old json.RawMessage) bool {
			var o struct {
				Kid string `json:"kid"`
			}
			return json.Unmarshal(old, &o) == nil && o.Kid == kid.Kid
		})
		s.jwks[k] = append(s.jwks[k], json.RawMessage(body))
		s.mu.Unlock()
		s.Handle(u, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			s.mu.Lock()
			set, _ := json.Marshal(map[string]any{"keys": s.jwks[k]})
			s.mu.Unlock()
			w.Header().Set("Cache-Control", "public, max-age=3600")
			_, _ = w.Write(set)
		}))
	case strings.Contains(key, "#"):
		u, kid, _ := strings.Cut(key, "#")
		k := hostPath(u)
		s.mu.Lock()
		s.byKeyID[k+"#"+kid] = body
		s.mu.Unlock()
		s.Handle(u, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var req struct {
				ClientID string `json:"client_id"`
				KeyID    string `json:"key_id"`
			}
			b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<16))
			if r.Method != http.MethodPost || json.Unmarshal(b, &req) != nil {
				http.Error(w, "want a JSON POST", http.StatusBadRequest)
				return
			}
			s.mu.Lock()
			ans, ok := s.byKeyID[k+"#"+req.ClientID+":"+req.KeyID]
			s.mu.Unlock()
			if !ok {
				http.Error(w, `{"error_code":"INVALID_KEY_ID"}`, http.StatusBadRequest)
				return
			}
			_, _ = w.Write(ans)
		}))
	default:
		s.Put(key, body, "")
	}
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
	k := hostPath(rawURL)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handlers[k] = h
	if s.hits[k] == nil {
		s.hits[k] = &atomic.Int64{}
	}
}

// SetFailing makes the host and path of rawURL answer 503 (on) or what
// was put there (off).
func (s *Server) SetFailing(rawURL string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failing[hostPath(rawURL)] = on
}

// Hits is how many requests reached the host and path of rawURL.
func (s *Server) Hits(rawURL string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.hits[hostPath(rawURL)]; c != nil {
		return c.Load()
	}
	return 0
}

func hostPath(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		panic(err)
	}
	return u.Host + u.Path
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	k := r.Host + r.URL.Path
	s.mu.Lock()
	h, c, failing := s.handlers[k], s.hits[k], s.failing[k]
	s.mu.Unlock()
	if failing {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	if h == nil {
		http.NotFound(w, r)
		return
	}
	c.Add(1)
	h.ServeHTTP(w, r)
}
