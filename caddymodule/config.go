package caddymodule

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// The handler's config is checked in one place. Provision looks up the
// provider's preset, applies the defaults (applyDefaults) and calls
// checkConfig before it opens any store, pool or queue, so a refused config
// never dials a database nor runs a migration; Validate calls checkConfig
// again. The Caddyfile parser reports only syntax: a subdirective unknown,
// repeated or with the wrong number of arguments, an argument that does not
// parse as its type (a duration, a size, a number, a URL's rate). Every rule
// on values and between fields is here, for the JSON and the Caddyfile alike.

// prepareConfig is Provision's first step: the preset, the defaults, then
// checkConfig. It does no I/O.
func (h *Handler) prepareConfig() error {
	h.preset, _ = signature.Lookup(h.Provider) // checkConfig refuses an unknown provider; idempotency_key has none
	h.applyDefaults()
	if err := h.checkConfig(); err != nil {
		return err
	}
	h.keepRowsWhileValid()
	return nil
}

// keepText says how long the route keeps its scope's rows, for routes that
// share the scope (useScopeStorage): retention, replay_window, tolerance.
func (h *Handler) keepText() string {
	return fmt.Sprintf("retention %s, replay_window %s, tolerance %s",
		time.Duration(h.Retention), time.Duration(h.ReplayWindow), h.tolerance())
}

// keepRowsWhileValid raises retention to twice the tolerance for a provider
// that signs a timestamp: it keeps no replay record, so the event's row is
// what refuses a capture while its timestamp is accepted, up to twice the
// tolerance after it arrived (a timestamp may be ahead of the clock by the
// tolerance). A shorter retention let a capture through again once its row
// was swept (an adversarial trial: tolerance 100h, retention 72h).
func (h *Handler) keepRowsWhileValid() {
	tol := h.tolerance()
	if h.replayRecord || h.Retention >= caddy.Duration(2*tol) {
		return
	}
	if h.logger != nil {
		h.logger.Warn("retention is shorter than twice the tolerance; event rows are kept for twice the tolerance, so a captured delivery is refused while its timestamp is accepted",
			zap.String("scope", h.Scope), zap.Duration("retention", time.Duration(h.Retention)), zap.Duration("kept", 2*tol))
	}
	h.Retention = caddy.Duration(2 * tol)
	h.ReplayWindow = max(h.ReplayWindow, h.Retention) // no record to keep; Validate wants it
}

// applyDefaults fills the fields left zero with their defaults, some of
// which come from the provider's preset (h.preset). It does no I/O and
// reads no placeholder; checkConfig then judges the result.
func (h *Handler) applyDefaults() {
	h.dedupeBody = h.preset.DedupeBody
	if h.DedupeBody != nil {
		h.dedupeBody = *h.DedupeBody
	}
	h.replayRecord = h.keepsReplayRecord()
	if h.Scope == "" {
		h.Scope = h.Provider
	}
	if h.Lease == 0 {
		h.Lease = caddy.Duration(defaultLease)
	}
	if h.Retention == 0 && h.Provider == providerIdempotencyKey {
		h.Retention = caddy.Duration(idemRetention)
	}
	if h.Retention == 0 {
		h.Retention = caddy.Duration(defaultRetention)
	}
	h.replayWindowSet = h.replayWindowSet || h.ReplayWindow != 0
	if h.ReplayWindow == 0 {
		h.ReplayWindow = caddy.Duration(max(defaultReplayWindow, time.Duration(h.Retention)))
	}
	if h.MaxBody == 0 {
		// The provider's documented largest body when it is larger (GitHub
		// 25 MiB): a body refused here is never forwarded, and a provider
		// that does not retry never sends it again.
		h.MaxBody = max(defaultMaxBody, h.preset.Delivery.MaxBody.Limit())
	}
	if h.BodyBudget == 0 {
		h.BodyBudget = max(defaultBodyBudget, minBodyBudget(h.MaxBody))
	}
	if h.ForwardTimeout == 0 {
		h.ForwardTimeout = caddy.Duration(defaultForwardTimeout)
	}
	if h.ReadTimeout == 0 {
		h.ReadTimeout = caddy.Duration(defaultReadTimeout)
	}
	if h.CompleteBy == "" {
		h.CompleteBy = completeByGateway
	}
	if h.OnAmbiguous == "" {
		h.OnAmbiguous = "reforward"
	}
	if h.OnMissingID == "" {
		h.OnMissingID = "reject"
	}
	if h.RefuseStatus == 0 {
		h.RefuseStatus = h.preset.RefuseStatus
	}
	if h.RefuseStatus == 0 {
		h.RefuseStatus = http.StatusBadRequest // idempotency_key: nothing is verified
	}
	h.asyncDefaults()
	h.protocolDefaults()
	h.replayDefaults()
	h.spoolDefaults()
}

// checkConfig reports the first rule the config breaks, naming the field
// as the Caddyfile spells it. It is pure: no I/O, no state changed; it runs
// on the config with its defaults applied and expands placeholders ({env.X})
// itself where a rule needs the value.
func (h *Handler) checkConfig() error {
	if h.Provider == "" {
		return errors.New("provider: required")
	}
	if err := h.validateReplay(); err != nil {
		return err
	}
	if h.Provider == providerIdempotencyKey {
		if err := h.validateIdempotencyKey(); err != nil {
			return err
		}
		return h.checkCommon()
	}
	preset, ok := signature.Lookup(h.Provider)
	if !ok {
		if best := closest(h.Provider, signature.Providers()); best != "" {
			return fmt.Errorf("provider: unknown provider %q: did you mean %s? (docs/providers.md lists every provider)", h.Provider, best)
		}
		return fmt.Errorf("provider: unknown provider %q (known: %s)", h.Provider, strings.Join(signature.Providers(), ", "))
	}
	if h.Provider == "hmac" && (h.HMAC == nil || h.HMAC.Header == "") {
		return errors.New("hmac: provider hmac needs an hmac { header <name> } block")
	}
	if strings.ContainsRune(h.Scope, '#') {
		// "<scope>#body" is the namespace of dedupe_body's body hashes.
		return fmt.Errorf("scope: %q must not contain '#'", h.Scope)
	}
	if h.Retention < caddy.Duration(minRetention) {
		return fmt.Errorf("retention: must be at least %s (providers retry for days), got %s", minRetention, time.Duration(h.Retention))
	}
	if h.replayWindowSet && !h.replayRecord {
		return fmt.Errorf("replay_window: applies only with dedupe_body on or to a provider without a signed timestamp (provider %s signs one: its tolerance stops replays)", h.Provider)
	}
	if _, err := h.expandedSecrets(); err != nil {
		return err
	}
	if len(h.EventID) == 0 && len(preset.EventID) == 0 && preset.Batch == nil { // a batch is keyed on its items (batch.go)
		return fmt.Errorf("event_id: provider %s has no event ID of its own; configure event_id header|json|form", h.Provider)
	}
	if err := h.checkProtocol(preset); err != nil {
		return err
	}
	return h.checkCommon()
}

// checkCommon checks the fields every provider has, idempotency_key's too.
func (h *Handler) checkCommon() error {
	if err := h.checkStorage(); err != nil {
		return err
	}
	switch h.OnAmbiguous {
	case "reforward", "hold":
	default:
		return fmt.Errorf("on_ambiguous: want reforward or hold, got %q", h.OnAmbiguous)
	}
	if err := h.checkCompleteBy(); err != nil {
		return err
	}
	switch h.OnMissingID {
	case "reject", "forward":
	default:
		return fmt.Errorf("on_missing_id: want reject or forward, got %q", h.OnMissingID)
	}
	if h.RefuseStatus < 400 || h.RefuseStatus > 499 {
		return fmt.Errorf("refuse_status: want a 4xx status, got %d", h.RefuseStatus)
	}
	if h.Lease < caddy.Duration(time.Second) {
		return fmt.Errorf("lease: must be at least 1s, got %s", time.Duration(h.Lease))
	}
	if h.ReplayWindow < h.Retention {
		return fmt.Errorf("replay_window: must be at least retention (%s), got %s: a body hash must outlive its event",
			time.Duration(h.Retention), time.Duration(h.ReplayWindow))
	}
	if h.MaxBody < 0 {
		return errors.New("max_body: must be positive")
	}
	if err := h.checkBodyBudget(); err != nil {
		return err
	}
	if h.Cache != nil && *h.Cache < 0 {
		return errors.New("cache: must be 0 or more")
	}
	if err := h.checkSpool(); err != nil {
		return err
	}
	return h.checkAsync()
}

// expandedSecrets returns the secrets with their placeholders expanded,
// refusing none at all and any that expands to nothing.
func (h *Handler) expandedSecrets() ([]string, error) {
	repl := caddy.NewReplacer()
	secrets := make([]string, 0, len(h.Secrets))
	for _, s := range h.Secrets {
		raw := s
		s = repl.ReplaceAll(s, "")
		if s == "" {
			// An {env.X} that is unset would otherwise verify with an empty key.
			return nil, fmt.Errorf("secret: a secret is empty%s", emptyHint(raw))
		}
		secrets = append(secrets, s)
	}
	if len(secrets) == 0 && !learnsSecret(h.Provider) { // asana, notion: learned in the handshake
		return nil, errors.New("secret: at least one secret is required")
	}
	return secrets, nil
}

// emptyHint says why a configured value expanded to nothing, naming its
// placeholders ({env.NAME}, {file.path}: names, never values): an unset
// variable and a missing file need different fixes.
func emptyHint(raw string) string {
	var env, file []string
	for rest := raw; ; {
		i := strings.Index(rest, "{")
		j := strings.Index(rest[i+1:], "}")
		if i < 0 || j < 0 {
			break
		}
		ph := rest[i : i+j+2]
		switch {
		case strings.HasPrefix(ph, "{env."):
			env = append(env, ph)
		case strings.HasPrefix(ph, "{file."):
			file = append(file, ph)
		}
		rest = rest[i+j+2:]
	}
	var hints []string
	if len(file) > 0 {
		hints = append(hints, strings.Join(file, ", ")+" read nothing: does the file exist, is it readable by Caddy's user and not empty?")
	}
	if len(env) > 0 {
		hints = append(hints, strings.Join(env, ", ")+" is empty: is the variable set in the environment of the running Caddy process?")
	}
	if len(hints) == 0 {
		return ""
	}
	return " (" + strings.Join(hints, "; ") + ")"
}

// retentionInterval is how often the retention sweep runs.
var retentionInterval = 10 * time.Minute

// minRetention: providers retry for days (Stripe about 3 days); a shorter
// retention would forget an event while its redeliveries still come. Only
// a binary built for make bench-sweep lowers it (benchretention.go).
var minRetention = 72 * time.Hour
