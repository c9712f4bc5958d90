package dispatch

import (
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRouteURLAndBackoff(t *testing.T) {
	mustURL := func(s string) *url.URL {
		u, err := url.Parse(s)
		require.NoError(t, err)
		return u
	}
	cfg := &Route{Target: mustURL("http://127.0.0.1:9000"), Schedule: []time.Duration{time.Second, time.Minute}}
	require.Equal(t, "http://127.0.0.1:9000/hooks?a=1", cfg.urlFor("/hooks?a=1"))
	cfg.Target = mustURL("http://127.0.0.1:9000/")
	require.Equal(t, "http://127.0.0.1:9000/hooks?a=1", cfg.urlFor("/hooks?a=1"))
	cfg.Target = mustURL("https://legacy.example/stripe?k=v")
	require.Equal(t, "https://legacy.example/stripe?k=v", cfg.urlFor("/hooks?a=1"))
	cfg.Target = mustURL("https://legacy.example/?k=v")
	require.Equal(t, "https://legacy.example/?k=v", cfg.urlFor("/hooks?a=1"), "a query makes deliver_to used as is")
	for range 100 {
		d := cfg.backoff(1)
		require.True(t, d >= 800*time.Millisecond && d <= 1200*time.Millisecond, d)
		d = cfg.backoff(7)
		require.True(t, d >= 48*time.Second && d <= 72*time.Second, d)
	}
	require.Equal(t, DefaultWorkers, cfg.workers())
	cfg.MaxConcurrency = 3
	require.Equal(t, 3, cfg.workers())
}
