package caddymodule

import (
	"errors"
	"fmt"
	"net/http"
	"slices"

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
// route's store (store.Secrets), shared by every instance (learned.go).
// Batches are in batch.go.

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
	// replace the learned secret within an enrollment window. Either way a
	// handshake teaches a secret only while the scope's enrollment window
	// is open (EnrollWindow, `secrets enroll`); the secret already learned
	// is accepted again at any time.
	LearnedSecret string `json:"learned_secret,omitempty"`

	// EnrollWindow is how long after a route of the scope is first loaded
	// (ever: recorded in the store, shared by every instance) a handshake
	// may teach the scope its secret, for providers that teach one (asana,
	// notion): register the webhook at the provider within it. Neither
	// provider authenticates its handshake, so outside an enrollment window
	// a handshake bringing a new secret is refused and logged; the operator
	// opens one with `caddy webhook-idempotency secrets enroll --scope S
	// --for 10m` (admin API POST /webhook_idempotency/secrets/enroll). The
	// first load opens none when a secret is already stored; learning a
	// secret closes the window. Nil: 10m; 0 (Caddyfile "off"): none, only
	// the operator opens windows. At most 24h.
	EnrollWindow *caddy.Duration `json:"enroll_window,omitempty"`

	// Batch is how deliveries carrying several events are deduplicated,
	// for providers that batch (adyen, fastspring, gocardless, hubspot, okta, sendgrid):
	// "set" keys the delivery on the set of its items' IDs and forwards it
	// whole; "split" forwards each item not yet seen as its own request
	// under its own claim (the forwarded bodies are no longer the signed
	// bytes: only for upstreams that do not verify signatures). Default: the
	// provider's policy (split for adyen, which signs each item and refuses
	// set; set for the others).
	Batch string `json:"batch,omitempty"`

	verifyTokens []string
	answerSecret string           // the first configured secret: Zoom's answer is an HMAC with it
	batch        *signature.Batch // nil: the route keys one event per delivery
	learned      *learnedSecret   // nil: the provider teaches no secret
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
	if h.EnrollWindow != nil && !learnsSecret(h.Provider) {
		return fmt.Errorf("enroll_window: provider %s learns no secret in a handshake", h.Provider)
	}
	if w := h.enrollWindow(); w < 0 || w > maxEnrollWindow {
		return fmt.Errorf("enroll_window: want off or a duration up to %s, got %s", maxEnrollWindow, w)
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

// matchHandshake reports whether the request is one of the preset's
// handshakes (signature.Preset.MatchHandshake) and builds its answer.
func (h *Handler) matchHandshake(r *http.Request, body []byte) (signature.HandshakeAnswer, bool) {
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
func (h *Handler) serveHandshake(w http.ResponseWriter, a signature.HandshakeAnswer, next caddyhttp.Handler, d *delivery) error {
	d.outcome = outcomeHandshake
	h.logHandshake(a)
	ctx := d.r.Context()
	if a.Forward || h.Handshake == "forward" {
		err := h.passOn(w, d.forwardable(), next, d)
		if a.Secret != "" && d.status >= 200 && d.status < 300 {
			if serr := h.learnSecret(ctx, d.r, a.Secret); serr != nil {
				h.logger.Warn("the upstream accepted a handshake whose secret the gateway could not store",
					zap.String("scope", h.Scope), zap.String("handshake", a.Challenge.Name), zap.Error(serr))
			}
		}
		return err
	}
	if a.Challenge.Auth == signature.AuthVerifyToken && !a.CheckToken(h.verifyTokens) {
		h.answer(w, d, ansRefused, say{reason: "verify token does not match"})
		return nil
	}
	if a.Incomplete != "" {
		// Never claimed nor forwarded: it has the handshake's shape, and the
		// upstream of a route that answers handshakes at the edge does not
		// know them.
		h.answer(w, d, ansBadRequest, say{reason: a.Challenge.Name + " handshake without its " + a.Incomplete})
		return nil
	}
	if a.Secret != "" {
		err := h.learnSecret(ctx, d.r, a.Secret)
		switch {
		case errors.Is(err, store.ErrEnrollmentClosed):
			h.warnThrottled("handshake refused: it brings a secret the scope has not learned and no enrollment window is open; "+
				"to register the webhook, open one with `caddy webhook-idempotency secrets enroll --scope "+h.Scope+" --for 10m`",
				zap.String("scope", h.Scope), zap.String("handshake", a.Challenge.Name), zap.String("client", clientAddr(d.r)))
			h.answer(w, d, ansRefused, say{reason: "no enrollment window is open for a new secret"})
			return nil
		case errors.Is(err, store.ErrSecretExists):
			h.warnThrottled("handshake refused: it brings a new secret and the route keeps the one it learned (learned_secret keep)",
				zap.String("scope", h.Scope), zap.String("handshake", a.Challenge.Name))
			h.answer(w, d, ansRefused, say{reason: "a different secret was learned before (learned_secret keep)"})
			return nil
		case err != nil:
			if h.providerGone(d, false) {
				return nil
			}
			h.warnThrottled("storing the learned secret failed; answered 503",
				zap.String("scope", h.Scope), zap.String("handshake", a.Challenge.Name), zap.Error(err))
			h.answer(w, d, ansStoreUnavailable, say{})
			return nil
		}
	}
	d.status = a.Status
	a.Respond(w)
	return nil
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
	case "enroll_window":
		var w caddy.Duration
		if v != "off" {
			dur, err := caddy.ParseDuration(v)
			if err != nil {
				return d.Errf("enroll_window: want off or a duration, got %q", v)
			}
			w = caddy.Duration(dur)
		}
		h.EnrollWindow = &w
	case "batch":
		if v != string(signature.BatchSet) && v != string(signature.BatchSplit) {
			return d.Errf("batch: want set or split, got %q", v)
		}
		h.Batch = v
	}
	return nil
}
