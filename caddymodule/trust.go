package caddymodule

import (
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
// comparing routes and for the admin API: never a secret, only the first 96
// bits of the SHA-256 of the sorted secrets.
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
		sorted := slices.Clone(secrets)
		slices.Sort(sorted)
		sum := sha256.Sum256([]byte(strings.Join(sorted, "\x00")))
		parts = append(parts, "secrets sha256:"+hex.EncodeToString(sum[:12]))
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
