package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// The handshake path: a provider's endpoint handshakes and heartbeats
// (signature.Challenge) are answered at the edge, or forwarded with
// `handshake forward`, and never claimed. Secrets a handshake teaches
// (Asana's X-Hook-Secret, Notion's verification_token) are kept in the
// route's store (store.Secrets), shared by every instance. Batches are in
// batch.go.

// ProtocolConfig holds what a route says about its provider's protocol
// beyond the signature: handshakes, verify tokens, learned secrets and
// batches.
type ProtocolConfig struct {
	// Handshake is who answers the provider's endpoint handshakes (Slack
	// url_verification, Meta hub.challenge, Microsoft Graph validationToken,
	// Twitch webhook_callback_verification, Asana X-Hook-Secret, ...):
	// "edge" (default) answers them here, as the provider documents, so the
	// upstream need not know the protocol; "forward" passes them to the
	// upstream. Either way they are authenticated as the provider documents
	// (a signature is verified first; a verify token is the upstream's to
	// check under forward) and never claimed nor deduplicated.
	Handshake string `json:"handshake,omitempty"`

	// VerifyTokens are the verify tokens of providers whose handshake
	// carries one (Meta's hub.verify_token): the token you chose
	// when registering the endpoint, not the signing secret. Several may be
	// listed (rotation). {env.NAME} placeholders are expanded; compared in
	// constant time; never logged. Required for such providers with
	// handshake edge.
	VerifyTokens []string `json:"verify_tokens,omitempty"`

	// LearnedSecret is what a handshake that brings a new secret (Asana's
	// X-Hook-Secret, Notion's verification_token) does when a different
	// secret was already learned for the scope. Neither provider
	// authenticates such a handshake, so "keep" (default) refuses it with
	// the refusal status and the learned secret stays; "replace" lets it
	// replace the learned secret (anyone who can reach the route can then
	// replace it: enable it only while re-registering the webhook). The
	// first handshake of a scope is always accepted.
	LearnedSecret string `json:"learned_secret,omitempty"`

	// Batch is how deliveries carrying several events are deduplicated,
	// for providers that batch (sendgrid, gocardless, okta, hubspot):
	// "set" keys the delivery on the set of its items' IDs and forwards it
	// whole; "split" forwards each item not yet seen as its own request
	// under its own claim (the forwarded bodies are no longer the signed
	// bytes: only for upstreams that do not verify signatures). Default: the
	// provider's policy (set for all of them).
	Batch string `json:"batch,omitempty"`

	verifyTokens []string
	answerSecret string           // the first configured secret: Zoom's answer is an HMAC with it
	batch        *signature.Batch // nil: the route keys one event per delivery
	learned      *learnedSecret   // nil: the provider teaches no secret
}

// learnedRefresh is how long a learned secret is used from memory before
// the store is asked again (another instance may have replaced it);
// learnedRetry is the least time between two store reads caused by a
// delivery the cached secret does not verify.
const (
	learnedRefresh = 30 * time.Second
	learnedRetry   = time.Second
)

// learnedSecret is a route's secret learned in a handshake, cached.
type learnedSecret struct {
	provider string
	opts     signature.Options // the route's options; Secrets = the configured ones

	mu       sync.Mutex
	secret   string             // "" until one is learned
	verifier signature.Verifier // configured + learned secrets; nil when there are none
	read     time.Time          // when the store was last read
}

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

// protocolDefaults applies the protocol fields' defaults (part of
// applyDefaults).
func (h *Handler) protocolDefaults() {
	if h.Handshake == "" {
		h.Handshake = "edge"
	}
	if h.LearnedSecret == "" {
		h.LearnedSecret = "keep"
	}
}

// checkProtocol checks the protocol fields against the preset (part of
// checkConfig): the handshake and learned_secret values, verify tokens
// only where a handshake carries one and none empty, and the batch policy
// (checkBatch).
func (h *Handler) checkProtocol(preset signature.Preset) error {
	if h.Handshake != "edge" && h.Handshake != "forward" {
		return fmt.Errorf("handshake: want edge or forward, got %q", h.Handshake)
	}
	tokens, err := h.expandedVerifyTokens()
	if err != nil {
		return err
	}
	if len(tokens) > 0 && !tokenAuth(preset) {
		return fmt.Errorf("verify_token: provider %s has no handshake with a verify token", h.Provider)
	}
	if h.LearnedSecret != "keep" && h.LearnedSecret != "replace" {
		return fmt.Errorf("learned_secret: want keep or replace, got %q", h.LearnedSecret)
	}
	if h.LearnedSecret == "replace" && !learnsSecret(h.Provider) {
		return fmt.Errorf("learned_secret: provider %s learns no secret in a handshake", h.Provider)
	}
	return h.checkBatch(preset)
}

// tokenAuth reports whether one of the preset's handshakes is
// authenticated by a verify token.
func tokenAuth(p signature.Preset) bool {
	return slices.ContainsFunc(p.Challenges, func(c signature.Challenge) bool {
		return c.Auth == signature.AuthVerifyToken
	})
}

// expandedVerifyTokens returns the verify tokens with their placeholders
// expanded, refusing any that expands to nothing.
func (h *Handler) expandedVerifyTokens() ([]string, error) {
	repl := caddy.NewReplacer()
	var tokens []string
	for _, raw := range h.VerifyTokens {
		t := repl.ReplaceAll(raw, "")
		if t == "" {
			return nil, fmt.Errorf("verify_token: a verify token is empty%s", emptyHint(raw))
		}
		tokens = append(tokens, t)
	}
	return tokens, nil
}

// provisionProtocol sets up the protocol fields checkConfig has accepted:
// the expanded verify tokens and the batch policy. It does no I/O: it runs
// before the store opens.
func (h *Handler) provisionProtocol() error {
	tokens, err := h.expandedVerifyTokens()
	if err != nil {
		return err
	}
	h.verifyTokens = tokens
	if len(tokens) == 0 && tokenAuth(h.preset) && h.Handshake == "edge" {
		// Deliveries still pass; only the handshake is refused.
		h.logger.Warn("no verify_token configured: the provider's handshake will be refused until one is (or set handshake forward)",
			zap.String("provider", h.Provider))
	}
	h.provisionBatch()
	return nil
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

// verify checks a delivery's signature. A route whose provider teaches its
// secret reads the learned secret from the store when its cached copy is
// older than learnedRefresh, or when the cached one fails to verify and the
// store was not read within learnedRetry (another instance learned a new
// one). A store failure wraps errSecretStore.
func (h *Handler) verify(ctx context.Context, body []byte, hdr http.Header) error {
	l := h.learned
	if l == nil {
		return h.verifier.Verify(body, hdr)
	}
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

// matchHandshake reports whether the request is one of the preset's
// handshakes (signature.Preset.MatchHandshake) and builds its answer.
func (h *Handler) matchHandshake(r *http.Request, body []byte) (signature.HandshakeAnswer, bool) {
	if len(h.preset.Challenges) == 0 {
		return signature.HandshakeAnswer{}, false
	}
	return h.preset.MatchHandshake(r, body, h.answerSecret)
}

// serveHandshake answers a recognised handshake. Those authenticated by a
// signature have been verified by the caller; the others are checked here
// (a verify token) or need nothing. At the edge the answer is the
// provider's documented one, and a handshake without the value it echoes
// or teaches (signature.HandshakeAnswer.Incomplete) is refused 400; with
// handshake forward (or a challenge the preset forwards) the upstream
// answers, without a claim. A secret the handshake teaches is stored
// before it is answered (at the edge) or once the upstream answered 2xx
// (forward).
func (h *Handler) serveHandshake(w http.ResponseWriter, r *http.Request, a signature.HandshakeAnswer,
	forwardable func() *http.Request, next caddyhttp.Handler, d *delivery,
) error {
	d.outcome = outcomeHandshake
	h.logHandshake(a)
	if a.Forward || h.Handshake == "forward" {
		err := h.passOn(w, forwardable(), next, d)
		if a.Secret != "" && d.status >= 200 && d.status < 300 {
			if serr := h.learnSecret(r.Context(), a.Secret); serr != nil {
				h.logger.Warn("the upstream accepted a handshake whose secret the gateway could not store",
					zap.String("scope", h.Scope), zap.String("handshake", a.Challenge.Name), zap.Error(serr))
			}
		}
		return err
	}
	if a.Challenge.Auth == signature.AuthVerifyToken && !a.CheckToken(h.verifyTokens) {
		d.outcome, d.reason = outcomeInvalidSignature, "verify token does not match"
		respondError(w, h.RefuseStatus, d.reason, 0)
		return nil
	}
	if a.Incomplete != "" {
		// Never claimed nor forwarded: it has the handshake's shape, and the
		// upstream of a route that answers handshakes at the edge does not
		// know them.
		d.outcome, d.reason = outcomeBadRequest, a.Challenge.Name+" handshake without its "+a.Incomplete
		respondError(w, http.StatusBadRequest, d.reason, 0)
		return nil
	}
	if a.Secret != "" {
		err := h.learnSecret(r.Context(), a.Secret)
		switch {
		case errors.Is(err, store.ErrSecretExists):
			d.outcome, d.reason = outcomeInvalidSignature, "a different secret was learned before (learned_secret keep)"
			h.logger.Warn("handshake refused: it brings a new secret and the route keeps the one it learned (learned_secret keep)",
				zap.String("scope", h.Scope), zap.String("handshake", a.Challenge.Name))
			respondError(w, h.RefuseStatus, d.reason, 0)
			return nil
		case err != nil:
			d.outcome = outcomeStoreError
			h.logger.Warn("storing the learned secret failed; answered 503",
				zap.String("scope", h.Scope), zap.String("handshake", a.Challenge.Name), zap.Error(err))
			respondError(w, http.StatusServiceUnavailable, "event store unavailable", unavailableRetryAfter)
			return nil
		}
	}
	d.status = a.Status
	a.Respond(w)
	return nil
}

// learnSecret stores a secret learned in a handshake (learned_secret keep
// refuses a different one: store.ErrSecretExists) and uses it at once.
func (h *Handler) learnSecret(parent context.Context, secret string) error {
	ss := h.backend.secrets
	if ss == nil || h.learned == nil {
		return errors.New("the store keeps no learned secrets")
	}
	ctx, cancel := context.WithTimeout(parent, storeTimeout)
	defer cancel()
	if err := ss.SetLearnedSecret(ctx, h.Scope, secret, h.LearnedSecret == "replace"); err != nil {
		return err
	}
	h.logger.Info("learned the route's signing secret from the provider's handshake",
		zap.String("scope", h.Scope), zap.String("provider", h.Provider))
	return h.learned.set(secret)
}

// logHandshake writes a debug line naming the handshake, never its values.
func (h *Handler) logHandshake(a signature.HandshakeAnswer) {
	if c := h.logger.Check(zap.DebugLevel, "handshake"); c != nil {
		by := "edge"
		if a.Forward || h.Handshake == "forward" {
			by = "upstream"
		}
		c.Write(zap.String("scope", h.Scope), zap.String("provider", h.Provider),
			zap.String("handshake", a.Challenge.Name), zap.String("auth", string(a.Challenge.Auth)),
			zap.String("answered_by", by))
	}
}

// unmarshalProtocol parses handshake, verify_token, learned_secret and
// batch.
func (h *Handler) unmarshalProtocol(d *caddyfile.Dispenser, name string) error {
	var v string
	if !d.AllArgs(&v) {
		return d.ArgErr()
	}
	switch name {
	case "handshake":
		if v != "edge" && v != "forward" {
			return d.Errf("handshake: want edge or forward, got %q", v)
		}
		h.Handshake = v
	case "verify_token":
		h.VerifyTokens = append(h.VerifyTokens, v)
	case "learned_secret":
		if v != "keep" && v != "replace" {
			return d.Errf("learned_secret: want keep or replace, got %q", v)
		}
		h.LearnedSecret = v
	case "batch":
		if v != string(signature.BatchSet) && v != string(signature.BatchSplit) {
			return d.Errf("batch: want set or split, got %q", v)
		}
		h.Batch = v
	}
	return nil
}
