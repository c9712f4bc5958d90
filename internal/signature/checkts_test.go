package signature

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCheckTimestampReason(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_764_547_200, 0)
	tol := 5 * time.Minute
	tests := []struct {
		name, text string
		unit       time.Duration
		want       string // "" = accepted
	}{
		{name: "now", text: "1764547200", unit: time.Second},
		{name: "edge of the past", text: "1764546900", unit: time.Second},
		{name: "edge of the future", text: "1764547500", unit: time.Second},
		{name: "one second past the edge", text: "1764546899", unit: time.Second,
			want: "timestamp 1764546899 (unix seconds) is further in the past than the tolerance of 5m0s"},
		{name: "milliseconds to a seconds scheme", text: "1764547200000", unit: time.Second,
			want: "timestamp 1764547200000 (unix seconds; it looks like milliseconds) is further in the future than the tolerance of 5m0s"},
		{name: "seconds to a milliseconds scheme", text: "1764547200", unit: time.Millisecond,
			want: "timestamp 1764547200 (unix milliseconds; it looks like seconds) is further in the past than the tolerance of 5m0s"},
		{name: "largest 18 digits", text: "999999999999999999", unit: time.Second,
			want: "timestamp 999999999999999999 (unix seconds) is further in the future than the tolerance of 5m0s"},
		{name: "zero", text: "0", unit: time.Second,
			want: "timestamp 0 (unix seconds) is further in the past than the tolerance of 5m0s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := checkTimestamp(tc.text, tc.unit, tol, now)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrTimestampOutOfTolerance)
			require.Equal(t, tc.want+": "+ErrTimestampOutOfTolerance.Error(), err.Error())
		})
	}
}
