package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// Learned secrets: providers whose handshake teaches the route its signing
// secret (Asana's X-Hook-Secret, Notion's verification_token). The secret
// is kept in the route's store (store.Secrets), shared by every instance,
// cached here, and checked next to the configured secrets (verify in
// intake.go); learned_secret (ProtocolConfig, handshake.go) says whether a
// later handshake may replace it.

// learnedRefresh is how long a learned secret is used from memory before
// the store is asked again (another instance may have replaced it);
// learnedRetry is the least time between two store reads caused by a
// delivery the cached secret does not verify.
const (
	learnedRefresh = 30 * time.Second
	learnedRetry   = time.Second
)

// defaultEnrollWindow is enroll_window's default: long enough to register
// the webhook at the provider right after deploying, short enough that an
// attacker watching for a new route has little time; maxEnrollWindow bounds
// it and `secrets enroll --for`.
const (
	defaultEnrollWindow = 10 * time.Minute
	maxEnrollWindow     = 24 * time.Hour
)

// enrollWindow is the route's enroll_window: its default or what is set
// (0: off).
func (h *Handler) enrollWindow() time.Duration {
	if h.EnrollWindow == nil {
		return defaultEnrollWindow
	}
	return time.Duration(*h.EnrollWindow)
}

// clock is the handler's clock (tests inject one).
func (h *Handler) clock() time.Time {
	if h.now != nil {
		return h.now()
	}
	return time.Now()
}

// instanceName names this gateway instance in a learned secret's record.
var instanceName = sync.OnceValue(func() string {
	name, err := os.Hostname()
	if err != nil {
		return "unknown"
	}
	return name
})

// clientAddr is the request's client address as Caddy determined it
// (trusted_proxies), else the connection's peer.
func clientAddr(r *http.Request) string {
	if ip := clientIP(r); ip != "" {
		return ip
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// provisionLearned records the route's load for a provider that teaches
// its secret: the scope's first load ever opens the enrollment window for
// enroll_window (store.Secrets.RouteLoaded). A store failure is logged,
// not fatal: no window is opened, and the operator can open one.
func (h *Handler) provisionLearned(ctx context.Context) {
	ss := h.backend.secrets
	if h.learned == nil || ss == nil || validateOnly() {
		return // validated, not loaded: the window opens when the config runs
	}
	learningScopes.add(h.Scope, h.backend)
	loaded := func() {
		sctx, cancel := context.WithTimeout(ctx, storeTimeout)
		defer cancel()
		if err := ss.RouteLoaded(sctx, h.Scope, h.clock(), h.enrollWindow()); err != nil {
			h.logger.Warn("recording the route's first load failed: no enrollment window opened; open one with `caddy webhook-idempotency secrets enroll`",
				zap.String("scope", h.Scope), zap.Error(err))
		}
	}
	if p := h.backend.pending; p != nil && !p.Ready() {
		// The store is opened in the background: the load is recorded
		// when it is, unless the route is gone by then.
		go func() {
			select {
			case <-ctx.Done():
			case <-p.readyCh:
				loaded()
			}
		}()
		return
	}
	loaded()
}

// learnedSecret is a route's secret learned in a handshake, cached.
type learnedSecret struct {
	provider string
	opts     signature.Options // the route's options; Secrets = the configured ones

	mu       sync.Mutex
	secret   string             // "" until one is learned
	verifier signature.Verifier // configured + learned secrets; nil when there are none
	read     time.Time          // when the store was last read
}

// learningScopes maps each scope of a provisioned route whose provider
// teaches its secret to its backends, for the secrets admin API.
var learningScopes = newScopeIndex[*backend]()

// errSecretStore marks a failure to read the learned secret: 503, not a
// refusal.
var errSecretStore = errors.New("reading the learned secret failed")

// learnsSecret reports whether a provider's handshake teaches the route its
// signing secret, so the route may have no secret of its own.
func learnsSecret(provider string) bool {
	p, ok := signature.Lookup(provider)
	if !ok {
		return false
	}
	return slices.ContainsFunc(p.Challenges, func(c signature.Challenge) bool { return c.LearnSecret != "" })
}

// newVerifier builds the route's verifier. A provider that learns its
// secret may have no configured one: its deliveries are verified with the
// learned secret (see verify).
func (h *Handler) newVerifier(opts signature.Options) (signature.Verifier, error) {
	if len(opts.Secrets) > 0 {
		h.answerSecret = opts.Secrets[0]
	}
	if !learnsSecret(h.Provider) {
		return signature.New(h.Provider, opts)
	}
	l := &learnedSecret{provider: h.Provider, opts: opts}
	if len(opts.Secrets) > 0 {
		v, err := signature.New(h.Provider, opts)
		if err != nil {
			return nil, err
		}
		l.verifier = v
	}
	h.learned = l
	return l, nil
}

// Verify implements signature.Verifier with the configured and cached
// learned secrets, without the store; verify refreshes them.
func (l *learnedSecret) Verify(body []byte, hdr http.Header) error {
	l.mu.Lock()
	v := l.verifier
	l.mu.Unlock()
	if v == nil {
		return fmt.Errorf("no secret configured and none learned from the provider's handshake yet: %w", signature.ErrNoMatchingSignature)
	}
	return v.Verify(body, hdr)
}

// verifyLearned checks a delivery's signature on a route whose provider
// teaches its secret (verify). It reads the learned secret from the store
// when its cached copy is older than learnedRefresh, or when the cached one
// fails to verify and the store was not read within learnedRetry (another
// instance learned a new one). A store failure wraps errSecretStore.
func (h *Handler) verifyLearned(ctx context.Context, body []byte, hdr http.Header) error {
	l := h.learned
	if l.stale(learnedRefresh) {
		if err := h.refreshLearned(ctx); err != nil {
			return err
		}
	}
	err := l.Verify(body, hdr)
	if err == nil || errors.Is(err, signature.ErrMissingHeader) || errors.Is(err, signature.ErrMalformedHeader) ||
		!l.stale(learnedRetry) {
		return err
	}
	if err := h.refreshLearned(ctx); err != nil {
		return err
	}
	return l.Verify(body, hdr)
}

func (l *learnedSecret) stale(age time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Since(l.read) >= age
}

// refreshLearned reads the route's learned secret from the store.
func (h *Handler) refreshLearned(parent context.Context) error {
	ss := h.backend.secrets
	if ss == nil {
		return fmt.Errorf("%w: the store keeps no learned secrets", errSecretStore)
	}
	ctx, cancel := context.WithTimeout(parent, storeTimeout)
	defer cancel()
	ls, err := ss.LearnedSecret(ctx, h.Scope)
	switch {
	case errors.Is(err, store.ErrNotFound):
		ls.Secret = ""
	case err != nil:
		return fmt.Errorf("%w: %w", errSecretStore, err)
	}
	return h.learned.set(ls.Secret)
}

// set caches secret (read from the store or just stored) and rebuilds the
// verifier when it changed.
func (l *learnedSecret) set(secret string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.read = time.Now()
	if secret == l.secret && (l.verifier != nil || secret == "") {
		return nil
	}
	o := l.opts
	o.Secrets = slices.Clone(l.opts.Secrets)
	if secret != "" {
		o.Secrets = append(o.Secrets, secret)
	}
	var v signature.Verifier
	if len(o.Secrets) > 0 {
		var err error
		if v, err = signature.New(l.provider, o); err != nil {
			return err
		}
	}
	l.secret, l.verifier = secret, v
	return nil
}

// learnSecret stores a secret learned in a handshake of r and uses it at
// once. Outside an enrollment window a new secret is refused
// (store.ErrEnrollmentClosed); learned_secret keep refuses a different one
// (store.ErrSecretExists).
func (h *Handler) learnSecret(parent context.Context, r *http.Request, secret string) error {
	ss := h.backend.secrets
	if ss == nil || h.learned == nil {
		return errors.New("the store keeps no learned secrets")
	}
	ctx, cancel := context.WithTimeout(parent, storeTimeout)
	defer cancel()
	err := ss.LearnSecret(ctx, store.Learn{Scope: h.Scope, Secret: secret, Replace: h.LearnedSecret == "replace",
		Now: h.clock(), From: clientAddr(r), By: instanceName()})
	if err != nil {
		return err
	}
	h.logger.Info("learned the route's signing secret from the provider's handshake",
		zap.String("scope", h.Scope), zap.String("provider", h.Provider), zap.String("client", clientAddr(r)),
		zap.String("fingerprint", secretFingerprint(secret)))
	return h.learned.set(secret)
}
