package cache

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

func TestCompleted(t *testing.T) {
	t.Parallel()
	c, err := New(100, time.Minute)
	require.NoError(t, err)
	t.Cleanup(c.Close)

	_, ok := c.Has("stripe", "evt_1")
	require.False(t, ok)
	c.Add("stripe", "evt_1", 201)
	c.c.Wait() // ristretto applies writes asynchronously
	e, ok := c.Has("stripe", "evt_1")
	require.True(t, ok)
	require.Equal(t, 201, e.Status)
	require.Equal(t, "evt_1", e.ID, "the ID, as a string")

	_, ok = c.Has("github", "evt_1")
	require.False(t, ok, "scopes are separate")
	_, ok = c.Has("stripe\x00evt", "_1")
	require.False(t, ok)

	c.Forget("stripe", "evt_1")
	_, ok = c.Has("stripe", "evt_1")
	require.False(t, ok)
}

func TestCompletedTTL(t *testing.T) {
	t.Parallel()
	c, err := New(100, 50*time.Millisecond)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	c.Add("s", "e", 200)
	c.c.Wait()
	_, ok := c.Has("s", "e")
	require.True(t, ok)
	require.Eventually(t, func() bool { _, ok := c.Has("s", "e"); return !ok }, 3*time.Second, 20*time.Millisecond)
}

func TestDisabled(t *testing.T) {
	t.Parallel()
	c, err := New(0, time.Minute)
	require.NoError(t, err)
	require.Nil(t, c)
	c.Add("s", "e", 200) // no-ops on nil
	_, ok := c.Has("s", "e")
	require.False(t, ok)
	c.Forget("s", "e")
	c.Close()
}

func TestBounded(t *testing.T) {
	t.Parallel()
	c, err := New(100, time.Minute)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	key := func(i int) string { return "evt_" + time.Duration(i).String() }
	for i := range 10_000 {
		c.Add("s", key(i), 200)
	}
	c.c.Wait()
	held := 0
	for i := range 10_000 {
		if _, ok := c.Has("s", key(i)); ok {
			held++
		}
	}
	require.LessOrEqual(t, held, 100, "at most the configured entries are held")
}

// A cache holds about as many events as it is given entries: ristretto
// counted its own per-item overhead in each entry's cost, so 1,000 entries
// held 17 events and the default 100,000 about 1,750.
func TestHoldsItsEntries(t *testing.T) {
	t.Parallel()
	for _, entries := range []int{50, 1000} {
		c, err := New(entries, time.Minute)
		require.NoError(t, err)
		t.Cleanup(c.Close)
		key := func(i int) string { return fmt.Sprintf("evt_%d", i) }
		for i := range entries {
			c.Add("s", key(i), 200)
			if i%25 == 24 {
				c.c.Wait() // ristretto drops writes its buffers cannot take at once
			}
		}
		c.c.Wait()
		held := 0
		for i := range entries {
			if _, ok := c.Has("s", key(i)); ok {
				held++
			}
		}
		require.GreaterOrEqual(t, held, entries*9/10, "cache %d holds its events", entries)
	}
}

// A settle that outlives its config may Add after Close: no panic, no effect.
func TestUseAfterClose(t *testing.T) {
	t.Parallel()
	c, err := New(100, time.Minute)
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 1000 {
			c.Add("s", "e"+time.Duration(i).String(), 200)
		}
	}()
	c.Close()
	<-done
	c.Close()
	c.Add("s", "late", 200)
	_, ok := c.Has("s", "late")
	require.False(t, ok)
	c.Forget("s", "late")
}

func TestCompletedResponse(t *testing.T) {
	t.Parallel()
	c, err := New(100, time.Minute)
	require.NoError(t, err)
	t.Cleanup(c.Close)

	resp := &store.Response{Status: 200, Header: http.Header{"Content-Type": {"text/xml"}},
		Body: []byte("<Response/>"), Size: 11, BodyStored: true}
	c.AddResponse("twilio", "SM1", resp, 0)
	c.Wait()
	got, ok := c.Response("twilio", "SM1")
	require.True(t, ok)
	require.Same(t, resp, got)
	_, ok = c.Response("twilio\x00SM", "1")
	require.False(t, ok)

	// Not cached: headers only, or a body over MaxCachedBody.
	c.AddResponse("r", "headers_only", &store.Response{Status: 200, Size: 1 << 20}, 0)
	c.AddResponse("r", "big", &store.Response{Status: 200, Body: make([]byte, MaxCachedBody+1),
		Size: MaxCachedBody + 1, BodyStored: true}, 0)
	c.Wait()
	_, ok = c.Response("r", "headers_only")
	require.False(t, ok)
	_, ok = c.Response("r", "big")
	require.False(t, ok)

	// A shorter TTL (retention) is kept.
	c.AddResponse("r", "short", resp, 50*time.Millisecond)
	c.Wait()
	_, ok = c.Response("r", "short")
	require.True(t, ok)
	require.Eventually(t, func() bool {
		_, ok := c.Response("r", "short")
		return !ok
	}, 2*time.Second, 10*time.Millisecond)

	c.Forget("twilio", "SM1")
	_, ok = c.Response("twilio", "SM1")
	require.False(t, ok)

	var nilCache *Completed
	nilCache.AddResponse("s", "e", resp, 0)
	_, ok = nilCache.Response("s", "e")
	require.False(t, ok)
}
