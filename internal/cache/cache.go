// Package cache holds the IDs of completed events in memory (ristretto), so a
// redelivery of a completed event is answered without a store round trip.
// Only the final completed state is ever cached; a miss means "ask the store".
// Small stored responses (replay) are held next to them, bounded in bytes.
package cache

import (
	"sync"
	"time"
	"unsafe"

	"github.com/dgraph-io/ristretto/v2"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// Completed is a bounded set of completed (scope, event ID) keys. A nil
// *Completed is a disabled cache: Has reports false and Add does nothing.
type Completed struct {
	c   *ristretto.Cache[string, Entry]
	ttl time.Duration
	// r holds stored responses (AddResponse), cost = their size in bytes.
	r *ristretto.Cache[string, *store.Response]

	// mu guards closed: a forward that outlives its config may still settle
	// (and Add) after the pooled store, and its cache, were closed; ristretto
	// panics on a write racing its Close.
	mu     sync.RWMutex
	closed bool
}

// New returns a cache holding at most entries keys, each for at most ttl
// (0 = no expiry). The TTL bounds how long an instance keeps answering an
// event that an operator forgot in the store. entries <= 0 returns nil.
func New(entries int, ttl time.Duration) (*Completed, error) {
	if entries <= 0 {
		return nil, nil
	}
	c, err := ristretto.NewCache(&ristretto.Config[string, Entry]{
		NumCounters: int64(entries) * 10,
		MaxCost:     int64(entries),
		BufferItems: 64,
		// MaxCost counts entries (cost 1 each): without this ristretto
		// adds its own per-item overhead (about 56) to each cost, and the
		// default 100,000 held about 1,750 events (cache 50: none).
		IgnoreInternalCost: true,
	})
	if err != nil {
		return nil, err
	}
	r, err := ristretto.NewCache(&ristretto.Config[string, *store.Response]{
		NumCounters: responseCounters,
		MaxCost:     ResponseBytes,
		BufferItems: 64,
	})
	if err != nil {
		c.Close()
		return nil, err
	}
	return &Completed{c: c, ttl: ttl, r: r}, nil
}

// Bounds of the response cache: ResponseBytes of bodies and headers in
// all, none larger than MaxCachedBody (a larger one is read from the store).
const (
	ResponseBytes    = 32 << 20
	MaxCachedBody    = 64 << 10
	responseCounters = 100_000
	responseOverhead = 256 // status, sizes and map of one entry, roughly
)

func key(scope, eventID string) string { return scope + "\x00" + eventID }

// Entry is what the cache knows of a completed event.
type Entry struct {
	// Status is the upstream status the event completed with.
	Status int
	// ID is the event ID (a string) as an interface value, made once when
	// the event was added: a duplicate that hands it on as one (Caddy's
	// placeholders take any) allocates nothing for it.
	ID any
}

// Has reports whether (scope, event ID) is known to be completed, and what
// is known of it.
func (c *Completed) Has(scope, eventID string) (Entry, bool) {
	if c == nil {
		return Entry{}, false
	}
	// The key is built in a pooled buffer rather than concatenated: the
	// lookup is the duplicate path, which otherwise allocates nothing of its
	// own. ristretto's Get only hashes the key and keeps no reference to it,
	// so a string over the buffer is safe for the call.
	bp := keyBufs.Get().(*[]byte)
	k := append(append(append((*bp)[:0], scope...), 0), eventID...)
	e, ok := c.c.Get(unsafe.String(unsafe.SliceData(k), len(k))) //nolint:gosec // audited above: Get keeps no reference
	*bp = k
	keyBufs.Put(bp)
	return e, ok
}

var keyBufs = sync.Pool{New: func() any {
	b := make([]byte, 0, 320) // a scope and an event ID of up to 255 bytes
	return &b
}}

// Add remembers a completed event. ristretto may drop the write; that only
// costs a store round trip later.
func (c *Completed) Add(scope, eventID string, status int) {
	if c == nil {
		return
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if !c.closed {
		c.c.SetWithTTL(key(scope, eventID), Entry{Status: status, ID: eventID}, 1, c.ttl)
	}
}

// Forget drops an event, e.g. after an operator deleted it in the store.
func (c *Completed) Forget(scope, eventID string) {
	if c == nil {
		return
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if !c.closed {
		c.c.Del(key(scope, eventID))
		c.r.Del(key(scope, eventID))
	}
}

// AddResponse remembers a completed event's stored response for at most
// ttl (0: the cache's TTL; never longer), so its duplicates are replayed
// without a store round trip. Responses whose body is not stored or is
// larger than MaxCachedBody are not cached. resp must not be changed
// afterwards. ristretto may drop the write.
func (c *Completed) AddResponse(scope, eventID string, resp *store.Response, ttl time.Duration) {
	if c == nil || resp == nil || !resp.BodyStored || len(resp.Body) > MaxCachedBody {
		return
	}
	if ttl <= 0 || (c.ttl > 0 && ttl > c.ttl) {
		ttl = c.ttl
	}
	cost := int64(len(resp.Body) + responseOverhead)
	for k, vs := range resp.Header {
		cost += int64(len(k))
		for _, v := range vs {
			cost += int64(len(v))
		}
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if !c.closed {
		c.r.SetWithTTL(key(scope, eventID), resp, cost, ttl)
	}
}

// Response returns the cached stored response of a completed event. The
// caller must not change it.
func (c *Completed) Response(scope, eventID string) (*store.Response, bool) {
	if c == nil {
		return nil, false
	}
	bp := keyBufs.Get().(*[]byte)
	k := append(append(append((*bp)[:0], scope...), 0), eventID...)
	resp, ok := c.r.Get(unsafe.String(unsafe.SliceData(k), len(k))) //nolint:gosec // as in Has: Get keeps no reference
	*bp = k
	keyBufs.Put(bp)
	return resp, ok
}

// Wait blocks until buffered writes are applied (tests).
func (c *Completed) Wait() {
	if c == nil {
		return
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if !c.closed {
		c.c.Wait()
		c.r.Wait()
	}
}

// Close stops the cache's goroutines. Later calls of Has, Add and Forget
// are no-ops, so a settle that outlives the config cannot panic.
func (c *Completed) Close() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		c.c.Close()
		c.r.Close()
	}
}
