package caddymodule

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// The secrets admin API: the secrets routes learned in handshakes (asana,
// notion), never their values, and the enrollment windows.
//
//	GET    /webhook_idempotency/secrets[?scope=asana]             learned secrets: fingerprint, when, from where, by which instance; the enrollment window
//	POST   /webhook_idempotency/secrets/enroll?scope=asana&for=10m open the scope's enrollment window for that long (for=0 closes it)
//	DELETE /webhook_idempotency/secrets?scope=asana              forget the scope's learned secret (a handshake may teach one again within a window)
//
// Only scopes of provisioned routes whose provider teaches its secret are
// served: 404 otherwise.

// SecretJSON is a scope's learned secret as the admin API shows it.
type SecretJSON struct {
	Scope string `json:"scope"`
	// Fingerprint is "sha256:" and the first 16 hex digits of the secret's
	// SHA-256 (compare with `printf %s "$SECRET" | sha256sum`); omitted
	// when no secret is learned.
	Fingerprint string     `json:"fingerprint,omitempty"`
	LearnedAt   *time.Time `json:"learned_at,omitempty"`
	// LearnedFrom is the address the teaching handshake came from,
	// LearnedBy the gateway instance (host name) that stored it; empty for
	// a secret learned by a version that recorded neither.
	LearnedFrom string `json:"learned_from,omitempty"`
	LearnedBy   string `json:"learned_by,omitempty"`
	// FirstLoadedAt is when a route of the scope was first loaded.
	FirstLoadedAt *time.Time `json:"first_loaded_at,omitempty"`
	// EnrollUntil is when the enrollment window closes or closed;
	// EnrollOpen whether it is open now (by this instance's clock).
	EnrollUntil *time.Time `json:"enroll_until,omitempty"`
	EnrollOpen  bool       `json:"enroll_open"`
}

// secretFingerprint identifies a secret without revealing it.
func secretFingerprint(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// serveSecrets serves /webhook_idempotency/secrets[/enroll].
func (a *Admin) serveSecrets(ctx context.Context, w http.ResponseWriter, r *http.Request, parts []string) error {
	q := r.URL.Query()
	scope := q.Get("scope")
	switch {
	case len(parts) == 2 && parts[1] == "enroll":
		if err := allow(w, r, http.MethodPost); err != nil {
			return err
		}
		return a.enroll(ctx, w, scope, q.Get("for"))
	case len(parts) != 1:
		return apiErr(http.StatusNotFound, "want /webhook_idempotency/secrets or /webhook_idempotency/secrets/enroll")
	}
	if err := allow(w, r, http.MethodGet, http.MethodDelete); err != nil {
		return err
	}
	if r.Method == http.MethodDelete {
		return a.forgetSecret(ctx, w, scope)
	}
	return a.listSecrets(ctx, w, scope)
}

// secretStores returns the stores of scope's learning routes ("" every
// learning scope's), by scope; 404 for a scope no such route has.
func secretStores(scope string) (map[string][]store.Secrets, error) {
	out := map[string][]store.Secrets{}
	for s, bs := range learningScopes.lookup(scope) {
		for _, b := range bs {
			if b.secrets != nil && !slices.Contains(out[s], b.secrets) {
				out[s] = append(out[s], b.secrets)
			}
		}
	}
	if scope != "" && len(out) == 0 {
		return nil, apiErr(http.StatusNotFound, "no route of scope %q learns its secret in a handshake", scope)
	}
	return out, nil
}

func (a *Admin) listSecrets(ctx context.Context, w http.ResponseWriter, scope string) error {
	stores, err := secretStores(scope)
	if err != nil {
		return err
	}
	now := time.Now()
	out := []SecretJSON{}
	seen := map[string]bool{}
	for s, sss := range stores {
		for _, ss := range sss {
			list, err := ss.LearnedSecrets(ctx)
			if err != nil {
				return storeErr(err)
			}
			for _, ls := range list {
				if ls.Scope != s || seen[s] {
					continue
				}
				seen[s] = true
				out = append(out, secretJSON(ls, now))
			}
		}
		if !seen[s] {
			out = append(out, SecretJSON{Scope: s})
		}
	}
	slices.SortFunc(out, func(a, b SecretJSON) int { return strings.Compare(a.Scope, b.Scope) })
	return writeJSON(w, map[string]any{"secrets": out})
}

func secretJSON(ls store.LearnedSecret, now time.Time) SecretJSON {
	out := SecretJSON{Scope: ls.Scope, LearnedFrom: ls.From, LearnedBy: ls.By,
		FirstLoadedAt: nonZero(ls.FirstLoadedAt), EnrollUntil: nonZero(ls.EnrollUntil),
		EnrollOpen: ls.EnrollUntil.After(now)}
	if ls.Secret != "" {
		out.Fingerprint, out.LearnedAt = secretFingerprint(ls.Secret), nonZero(ls.LearnedAt)
	}
	return out
}

func nonZero(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

func (a *Admin) enroll(ctx context.Context, w http.ResponseWriter, scope, forText string) error {
	if scope == "" {
		return apiErr(http.StatusBadRequest, "scope is required")
	}
	d, err := time.ParseDuration(forText)
	if err != nil || d < 0 || d > maxEnrollWindow {
		return apiErr(http.StatusBadRequest, "for: want a duration from 0 (close) to %s, e.g. for=10m", maxEnrollWindow)
	}
	stores, err := secretStores(scope)
	if err != nil {
		return err
	}
	until := time.Now().Add(d)
	for _, ss := range stores[scope] {
		if err := ss.Enroll(ctx, scope, until); err != nil {
			return storeErr(err)
		}
	}
	a.logger.Info("enrollment window set by operator", zap.String("scope", scope), zap.Time("until", until))
	return writeJSON(w, map[string]any{"scope": scope, "enroll_until": until.UTC(), "enroll_open": d > 0})
}

func (a *Admin) forgetSecret(ctx context.Context, w http.ResponseWriter, scope string) error {
	if scope == "" {
		return apiErr(http.StatusBadRequest, "scope is required")
	}
	stores, err := secretStores(scope)
	if err != nil {
		return err
	}
	found := false
	for _, ss := range stores[scope] {
		err := ss.ForgetLearnedSecret(ctx, scope)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return storeErr(err)
		}
		found = true
	}
	if !found {
		return apiErr(http.StatusNotFound, "scope %q has no learned secret", scope)
	}
	a.logger.Info("learned secret forgotten by operator", zap.String("scope", scope))
	return writeJSON(w, map[string]any{"forgotten": true, "scope": scope})
}
