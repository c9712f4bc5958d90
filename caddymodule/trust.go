package caddymodule

import (
	"crypto/pbkdf2"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
)

// Routes that share a scope share its claims: a claim one route creates
// makes the other answer that event as a duplicate, never forwarded. So a
// scope may be shared only by routes of the same trust, where a request
// that can create a claim through one route could create the same claim
// through the other. Two routes have the same trust when they verify the
// same way: the same provider (and, for provider hmac, the same scheme),
// the same secrets, the same event ID source, and the same on_missing_id.
// An unverified route (provider idempotency_key) shares a scope only with
// routes like it: its claims are made by anyone who can reach it.

// trustOf describes how a delivery becomes a claim on this route, for
// comparing routes and for the admin API: never a secret, only
// secretsFingerprint of them.
func (h *Handler) trustOf(secrets []string) string {
	if h.Provider == providerIdempotencyKey {
		return "no signature (provider idempotency_key)"
	}
	parts := []string{"provider " + h.Provider}
	if c := h.HMAC; c != nil {
		parts = append(parts, "hmac "+strings.Join([]string{c.Header, c.Algorithm, c.Encoding, c.Prefix}, " "))
	}
	switch {
	case len(secrets) > 0:
		parts = append(parts, "secrets "+secretsFingerprint(secrets))
	default:
		parts = append(parts, "secret learned from the provider")
	}
	if len(h.EventID) > 0 {
		ids := make([]string, 0, len(h.EventID))
		for _, s := range h.EventID {
			ids = append(ids, s.String())
		}
		parts = append(parts, "event_id "+strings.Join(ids, " "))
	}
	if h.OnMissingID == "forward" {
		parts = append(parts, "on_missing_id forward")
	}
	return strings.Join(parts, ", ")
}

// fingerprintRounds is PBKDF2's iteration count for secretsFingerprint:
// each guess at a secret costs 2,000 HMACs instead of one hash, while a
// config of a hundred routes loads in 40 ms more (20,000 made such a load
// time out under a busy test run).
const fingerprintRounds = 2000

// secretsFingerprint identifies a set of secrets (in any order) the same
// way on every instance and every load, without revealing them: 64 bits of
// PBKDF2-HMAC-SHA256 (RFC 8018) of the sorted secrets, as "pbkdf2:<16 hex
// digits>". The fingerprint reaches the admin API and a refused config's
// error, so logs: a secret an operator chose (provider hmac) could be
// guessed from a plain hash, and the iterations make each guess cost what
// a route load does.
func secretsFingerprint(secrets []string) string {
	sorted := slices.Clone(secrets)
	slices.Sort(sorted)
	key, err := pbkdf2.Key(sha256.New, strings.Join(sorted, "\x00"), []byte("webhook_idempotency secrets"), fingerprintRounds, 8)
	if err != nil { // only for a key length or FIPS limit this call does not reach
		return "pbkdf2:unavailable"
	}
	return "pbkdf2:" + hex.EncodeToString(key)
}
