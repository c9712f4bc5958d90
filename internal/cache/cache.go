// Package cache holds the IDs of completed events in memory (ristretto), so a
// redelivery of a completed event is answered without a store round trip.
// Only the final completed state is ever cached; a miss means "ask the store".
package cache

import (
	"time"

	"github.com/dgraph-io/ristretto/v2"
)

// Completed is a bounded set of completed (scope, event ID) keys. A nil
// *Completed is a disabled cache: Has reports false and Add does nothing.
type Completed struct {
	c   *ristretto.Cache[string, int]
	ttl time.Duration
}

// New returns a cache holding at most entries keys, each for at most ttl
// (0 = no expiry). The TTL bounds how long an instance keeps answering an
// event that an operator forgot in the store. entries <= 0 returns nil.
func New(entries int, ttl time.Duration) (*Completed, error) {
	if entries <= 0 {
		return nil, nil
	}
	c, err := ristretto.NewCache(&ristretto.Config[string, int]{
		NumCounters: int64(entries) * 10,
		MaxCost:     int64(entries),
		BufferItems: 64,
	})
	if err != nil {
		return nil, err
	}
	return &Completed{c: c, ttl: ttl}, nil
}

func key(scope, eventID string) string { return scope + "\x00" + eventID }

// Has reports whether (scope, event ID) is known to be completed, and the
// upstream status it completed with.
func (c *Completed) Has(scope, eventID string) (int, bool) {
	if c == nil {
		return 0, false
	}
	return c.c.Get(key(scope, eventID))
}

// Add remembers a completed event. ristretto may drop the write; that only
// costs a store round trip later.
func (c *Completed) Add(scope, eventID string, status int) {
	if c == nil {
		return
	}
	c.c.SetWithTTL(key(scope, eventID), status, 1, c.ttl)
}

// Forget drops an event, e.g. after an operator deleted it in the store.
func (c *Completed) Forget(scope, eventID string) {
	if c == nil {
		return
	}
	c.c.Del(key(scope, eventID))
}

// Close stops the cache's goroutines.
func (c *Completed) Close() {
	if c != nil {
		c.c.Close()
	}
}
