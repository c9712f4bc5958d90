package lease_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/lease"
)

var errLost = errors.New("lease lost")

func TestKeep(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// results are what successive renewals return; the last repeats.
		results  []error
		stopAt   int // close stop after this many renewals; 0: never
		wantErr  error
		wantWarn int // "renewing test lease failed" lines
	}{
		{name: "renews until stopped", results: []error{nil}, stopAt: 3},
		{name: "lost ends it", results: []error{nil, errLost}, wantErr: errLost},
		{name: "wrapped lost ends it", results: []error{wrap(errLost)}, wantErr: errLost},
		{name: "failures are logged and renewing goes on", results: []error{errors.New("store down"), errors.New("store down"), nil}, stopAt: 4, wantWarn: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			core, logs := observer.New(zap.WarnLevel)
			stop := make(chan struct{})
			var calls atomic.Int32
			err := lease.Keep(t.Context(), stop, lease.Renewal{
				Lease: 30 * time.Millisecond,
				Renew: func(ctx context.Context) error {
					_, ok := ctx.Deadline()
					require.True(t, ok, "each renewal is bounded")
					n := int(calls.Add(1))
					if n == tc.stopAt {
						close(stop)
					}
					return tc.results[min(n, len(tc.results))-1]
				},
				Lost:   errLost,
				Logger: zap.New(core),
				Name:   "test lease",
				Fields: []zap.Field{zap.String("scope", "s")},
			})
			require.ErrorIs(t, err, tc.wantErr)
			if tc.wantErr == nil {
				require.NoError(t, err)
			}
			warns := logs.FilterMessage("renewing test lease failed")
			require.Equal(t, tc.wantWarn, warns.Len())
			for _, e := range warns.All() {
				require.Equal(t, "s", e.ContextMap()["scope"])
				require.Equal(t, "store down", e.ContextMap()["error"])
			}
		})
	}
}

func TestKeepEndsWithContext(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zap.WarnLevel)
	ctx, cancel := context.WithCancel(t.Context())
	err := lease.Keep(ctx, nil, lease.Renewal{
		Lease: 30 * time.Millisecond,
		Renew: func(context.Context) error {
			cancel() // the work ended during the renewal
			return context.Canceled
		},
		Lost:   errLost,
		Logger: zap.New(core),
		Name:   "test lease",
	})
	require.NoError(t, err)
	require.Zero(t, logs.Len(), "a renewal cut off by the work's end is not a failure")
}

func wrap(err error) error { return errors.Join(errors.New("renewing"), err) }

// After a failed renewal the next one is tried a tenth of the interval
// later, not a whole interval: a store back in time keeps the lease. With
// a 3 s lease (renewals 1 s apart) the retry after a failure comes ~100 ms
// later; a whole interval would be 1 s.
func TestFailedRenewalRetriedSooner(t *testing.T) {
	t.Parallel()
	var (
		calls  atomic.Int32
		second = make(chan time.Duration, 1)
		first  time.Time
	)
	h := lease.Start(t.Context(), lease.Renewal{
		Lease: 3 * time.Second,
		Renew: func(context.Context) error {
			switch calls.Add(1) {
			case 1:
				first = time.Now()
				return errors.New("store down")
			case 2:
				second <- time.Since(first)
			}
			return nil
		},
		Name: "test lease",
	})
	defer func() { _ = h.Stop() }()
	select {
	case d := <-second:
		require.Less(t, d, 600*time.Millisecond, "retried %s after the failure", d)
	case <-time.After(5 * time.Second):
		t.Fatal("no renewal after the failed one")
	}
}
