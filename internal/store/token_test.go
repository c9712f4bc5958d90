package store_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		remaining, want time.Duration
	}{
		{0, time.Second},
		{-time.Second, time.Second},
		{time.Millisecond, time.Second},
		{time.Second, time.Second},
		{time.Second + time.Microsecond, 2 * time.Second},
		{29*time.Second + 999*time.Millisecond, 30 * time.Second},
		{30 * time.Second, 30 * time.Second},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, store.RetryAfter(tc.remaining), "remaining %s", tc.remaining)
	}
}

func TestNewToken(t *testing.T) {
	t.Parallel()
	a, b := store.NewToken(), store.NewToken()
	require.Regexp(t, `^[0-9a-f]{32}$`, a)
	require.NotEqual(t, a, b)
}
