// Package keyfetch fetches the certificates and public keys some providers
// sign with (PayPal, AWS SNS, Plaid, Google) from the provider itself, under
// rules that keep a forged delivery from choosing where they come from:
//
//   - only https, only port 443, no user info, and only from the exact hosts
//     of the preset's Policy (one "*" label stands for exactly one DNS label,
//     for AWS's per-region hosts); redirects are refused;
//   - the answer is bounded in size (Policy.MaxBytes) and the whole fetch in
//     time (Policy.Timeout);
//   - answers are cached for their Cache-Control max-age, clamped to
//     [Policy.MinTTL, Policy.MaxTTL], and at most one fetch of a URL runs at
//     a time (concurrent callers share it);
//   - fetches that miss the cache are limited per Policy (MaxFetchesPerMinute),
//     so deliveries naming ever new key URLs or key IDs cannot turn into a
//     flood of requests to the provider (or of API calls on the client's
//     credentials); over the limit a fetch fails as unavailable;
//   - a failure is never cached as a key: the caller refuses the delivery as
//     unavailable (503, the provider retries) and never accepts it unverified.
//
// A URL the policy does not allow wraps ErrNotAllowed; every failure after
// that (dial, TLS, status, redirect, size, time) wraps ErrUnavailable.
package keyfetch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
)

var (
	// ErrNotAllowed: the URL is not one the policy fetches from (scheme,
	// host, port or user info). Decided before any I/O; the delivery that
	// named it is refused, not retried.
	ErrNotAllowed = errors.New("key URL not allowed")
	// ErrUnavailable: an allowed URL could not be fetched within the
	// policy's bounds (network, TLS, non-200 status, redirect, size, time).
	ErrUnavailable = errors.New("provider key unavailable")
)

// StatusError is an answer other than 200 (and not a redirect) from an
// allowed host. It wraps ErrUnavailable; a caller may read Code (Plaid
// answers 400 for a key ID it does not know).
type StatusError struct {
	Host string
	Code int
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("key host %s answered %d: %s", e.Host, e.Code, ErrUnavailable)
}

func (e *StatusError) Unwrap() error { return ErrUnavailable }

// Defaults of Policy's zero fields.
const (
	DefaultMaxBytes   = 64 << 10
	DefaultTimeout    = 5 * time.Second
	DefaultTTL        = time.Hour
	DefaultMinTTL     = time.Minute
	DefaultMaxTTL     = 24 * time.Hour
	DefaultMaxEntries = 64
	DefaultMaxFetches = 30
)

// Policy is where and how one preset's keys may be fetched. Zero fields
// take the Default* values; Hosts is required.
type Policy struct {
	// Hosts are the provider's documented key hosts, lower case, e.g.
	// "api.paypal.com". A "*" label matches exactly one DNS label of
	// letters, digits and hyphens ("sns.*.amazonaws.com" matches
	// sns.eu-west-1.amazonaws.com, not sns.x.evil.amazonaws.com).
	Hosts []string
	// MaxBytes bounds the answer's body.
	MaxBytes int64
	// Timeout bounds one fetch, from dial to the last byte.
	Timeout time.Duration
	// DefaultTTL is how long an answer without Cache-Control max-age is
	// kept; MinTTL and MaxTTL clamp every lifetime.
	DefaultTTL, MinTTL, MaxTTL time.Duration
	// MaxEntries bounds the cache; the entry closest to expiry goes first.
	MaxEntries int
	// MaxFetchesPerMinute bounds the requests to the provider (a burst of
	// as many, refilled over a minute).
	MaxFetchesPerMinute int
}

// Fetcher fetches and caches keys under one Policy. Safe for concurrent use.
type Fetcher struct {
	p       Policy
	group   singleflight.Group
	limiter *rate.Limiter

	mu    sync.Mutex
	cache map[string]entry
	gen   uint64 // override generation the cache was filled under

	// now and client are replaced by this package's tests only.
	now    func() time.Time
	client *http.Client
}

type entry struct {
	body             []byte
	fetched, expires time.Time
}

// New returns a Fetcher for p. It panics when p has no hosts: a preset
// without an allowlist is a programming error.
func New(p Policy) *Fetcher {
	if len(p.Hosts) == 0 {
		panic("keyfetch: a policy needs hosts")
	}
	for i, h := range p.Hosts {
		p.Hosts[i] = strings.ToLower(h)
	}
	p.MaxBytes = cmpOr(p.MaxBytes, DefaultMaxBytes)
	p.Timeout = cmpOr(p.Timeout, DefaultTimeout)
	p.DefaultTTL = cmpOr(p.DefaultTTL, DefaultTTL)
	p.MinTTL = cmpOr(p.MinTTL, DefaultMinTTL)
	p.MaxTTL = cmpOr(p.MaxTTL, DefaultMaxTTL)
	p.MaxEntries = cmpOr(p.MaxEntries, DefaultMaxEntries)
	p.MaxFetchesPerMinute = cmpOr(p.MaxFetchesPerMinute, DefaultMaxFetches)
	f := &Fetcher{
		p: p, cache: map[string]entry{}, now: time.Now,
	}
	f.limiter = f.newLimiter()
	return f
}

func (f *Fetcher) newLimiter() *rate.Limiter {
	return rate.NewLimiter(rate.Every(time.Minute/time.Duration(f.p.MaxFetchesPerMinute)), f.p.MaxFetchesPerMinute)
}

func (f *Fetcher) allow() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.limiter.AllowN(f.now(), 1)
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Allowed reports whether rawURL is one the policy fetches from, wrapping
// ErrNotAllowed when it is not. The message names the host, never a query.
func (f *Fetcher) Allowed(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("unparsable key URL: %w", ErrNotAllowed)
	}
	if u.Scheme != "https" {
		return fmt.Errorf("key URL scheme %q is not https: %w", u.Scheme, ErrNotAllowed)
	}
	if u.User != nil || u.Opaque != "" {
		return fmt.Errorf("key URL carries user info: %w", ErrNotAllowed)
	}
	if p := u.Port(); p != "" && p != "443" {
		return fmt.Errorf("key URL port %s is not 443: %w", p, ErrNotAllowed)
	}
	host := u.Hostname()
	for _, pat := range f.p.Hosts {
		if hostMatches(pat, host) {
			return nil
		}
	}
	return fmt.Errorf("key URL host %q is not one of the provider's (%s): %w",
		host, strings.Join(f.p.Hosts, ", "), ErrNotAllowed)
}

// hostMatches compares host with pat label by label; "*" is one label of
// [a-z0-9-]. Hosts are compared as written: a trailing dot, an upper-case
// letter or an IP address never matches.
func hostMatches(pat, host string) bool {
	pl, hl := strings.Split(pat, "."), strings.Split(host, ".")
	if len(pl) != len(hl) {
		return false
	}
	for i := range pl {
		if pl[i] != "*" {
			if pl[i] != hl[i] {
				return false
			}
			continue
		}
		if hl[i] == "" {
			return false
		}
		for _, c := range hl[i] {
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
				return false
			}
		}
	}
	return true
}

// Get returns the body of a GET of rawURL, from the cache while it lives.
func (f *Fetcher) Get(rawURL string) ([]byte, error) {
	return f.do(http.MethodGet, rawURL, nil, "")
}

// Post returns the body of a POST of body (contentType) to rawURL, cached by
// URL and body (Plaid's key endpoint). The body may carry credentials: it is
// never logged nor kept, only its digest is a cache key.
func (f *Fetcher) Post(rawURL string, body []byte, contentType string) ([]byte, error) {
	return f.do(http.MethodPost, rawURL, body, contentType)
}

func (f *Fetcher) do(method, rawURL string, body []byte, contentType string) ([]byte, error) {
	if err := f.Allowed(rawURL); err != nil {
		return nil, err
	}
	key := method + " " + rawURL
	if body != nil {
		sum := sha256.Sum256(body)
		key += " " + string(sum[:])
	}
	o, gen := current()
	if b, ok := f.cached(key, gen); ok {
		return b, nil
	}
	v, err, _ := f.group.Do(key, func() (any, error) {
		if b, ok := f.cached(key, gen); ok {
			return b, nil
		}
		if !f.allow() {
			return nil, fmt.Errorf("more than %d key fetches a minute: %w", f.p.MaxFetchesPerMinute, ErrUnavailable)
		}
		b, ttl, err := f.fetch(o, method, rawURL, body, contentType)
		if err != nil {
			return nil, err
		}
		f.store(key, gen, b, ttl)
		return b, nil
	})
	if err != nil {
		return nil, err
	}
	return v.([]byte), nil
}

// Refresh returns a GET of rawURL fetched anew when the cached copy is
// older than the policy's MinTTL, else the cached copy: a key set that
// lacks a key a delivery names (a rotation the cache has not seen) is
// refetched at most once per MinTTL.
func (f *Fetcher) Refresh(rawURL string) ([]byte, error) {
	if err := f.Allowed(rawURL); err != nil {
		return nil, err
	}
	key := http.MethodGet + " " + rawURL
	_, gen := current()
	f.mu.Lock()
	if e, ok := f.cache[key]; ok && f.gen == gen && f.now().Sub(e.fetched) >= f.p.MinTTL {
		delete(f.cache, key)
	}
	f.mu.Unlock()
	return f.Get(rawURL)
}

func (f *Fetcher) cached(key string, gen uint64) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gen != gen {
		// A new test override (or key it serves): fresh state.
		f.cache, f.gen = map[string]entry{}, gen
		f.limiter = f.newLimiter()
	}
	e, ok := f.cache[key]
	if !ok || !f.now().Before(e.expires) {
		return nil, false
	}
	return e.body, true
}

func (f *Fetcher) store(key string, gen uint64, b []byte, ttl time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gen != gen {
		return
	}
	now := f.now()
	for k, e := range f.cache {
		if !now.Before(e.expires) {
			delete(f.cache, k)
		}
	}
	for len(f.cache) >= f.p.MaxEntries {
		var first string
		for k, e := range f.cache {
			if first == "" || e.expires.Before(f.cache[first].expires) {
				first = k
			}
		}
		delete(f.cache, first)
	}
	f.cache[key] = entry{body: b, fetched: now, expires: now.Add(ttl)}
}

func (f *Fetcher) fetch(o *TestOverride, method, rawURL string, body []byte, contentType string) ([]byte, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), f.p.Timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, rawURL, rd)
	if err != nil {
		return nil, 0, fmt.Errorf("building the key request: %w", ErrUnavailable)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	client := f.client
	if client == nil {
		client = clientFor(o)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("fetching key from %s: %w: %w", req.URL.Host, ErrUnavailable, cleanErr(err))
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		if resp.StatusCode >= 300 && resp.StatusCode < 400 {
			return nil, 0, fmt.Errorf("key host %s answered a redirect (%d), which is refused: %w", req.URL.Host, resp.StatusCode, ErrUnavailable)
		}
		return nil, 0, &StatusError{Host: req.URL.Host, Code: resp.StatusCode}
	}
	if resp.ContentLength > f.p.MaxBytes {
		return nil, 0, fmt.Errorf("key from %s is %d bytes, more than %d: %w", req.URL.Host, resp.ContentLength, f.p.MaxBytes, ErrUnavailable)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, f.p.MaxBytes+1))
	if err != nil {
		return nil, 0, fmt.Errorf("reading key from %s: %w: %w", req.URL.Host, ErrUnavailable, cleanErr(err))
	}
	if int64(len(b)) > f.p.MaxBytes {
		return nil, 0, fmt.Errorf("key from %s is more than %d bytes: %w", req.URL.Host, f.p.MaxBytes, ErrUnavailable)
	}
	if len(b) == 0 {
		// No key is empty: a host (or a proxy before it) that gave up
		// answered 200 with nothing. Not cached, so the next delivery
		// fetches again.
		return nil, 0, fmt.Errorf("key host %s answered an empty body: %w", req.URL.Host, ErrUnavailable)
	}
	return b, f.ttl(resp.Header), nil
}

// cleanErr drops the URL a *url.Error repeats (it may carry a query).
func cleanErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// ttl reads Cache-Control max-age (no-store and no-cache count as 0), then
// clamps it: a provider that says "do not cache" still gets MinTTL, so a
// flood of deliveries cannot turn into a flood of fetches.
func (f *Fetcher) ttl(h http.Header) time.Duration {
	ttl := f.p.DefaultTTL
	for d := range strings.SplitSeq(strings.ToLower(h.Get("Cache-Control")), ",") {
		d = strings.TrimSpace(d)
		switch {
		case d == "no-store" || d == "no-cache":
			ttl = 0
		case strings.HasPrefix(d, "max-age="):
			if n, err := strconv.ParseInt(strings.TrimPrefix(d, "max-age="), 10, 64); err == nil && n >= 0 {
				ttl = time.Duration(min(n, int64(f.p.MaxTTL/time.Second)+1)) * time.Second
			}
		}
	}
	return min(max(ttl, f.p.MinTTL), f.p.MaxTTL)
}

// clientFor builds the HTTP client of one fetch: TLS 1.2 or newer with the
// system roots, the environment's proxy, no redirects. Under a test
// override it dials the local key server and trusts its certificate.
func clientFor(o *TestOverride) *http.Client {
	t := &http.Transport{
		Proxy:                  http.ProxyFromEnvironment,
		TLSClientConfig:        &tls.Config{MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:    DefaultTimeout,
		ResponseHeaderTimeout:  DefaultTimeout,
		DisableKeepAlives:      true,
		MaxResponseHeaderBytes: 16 << 10,
	}
	if o != nil {
		t.Proxy = nil
		t.TLSClientConfig.RootCAs = o.RootCAs
		t.TLSClientConfig.ServerName = o.ServerName
		addr := o.Addr
		t.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
	}
	return &http.Client{
		Transport: t,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}
