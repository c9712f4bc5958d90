package store

import (
	"crypto/rand"
	"encoding/hex"
	"time"
)

// NewToken returns a fresh claim token: 128 random bits from crypto/rand,
// as 32 lowercase hex characters. Stores call it once per Claim.
func NewToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails: crypto/rand crashes the program instead
	return hex.EncodeToString(b[:])
}

// RetryAfter turns the time left on a live lease into Claim.RetryAfter: the
// remaining time rounded up to whole seconds (Retry-After is in seconds), and
// at least one second.
func RetryAfter(remaining time.Duration) time.Duration {
	if remaining <= time.Second {
		return time.Second
	}
	secs := (remaining + time.Second - 1) / time.Second
	return secs * time.Second
}
