package signature_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// A timestamp in the wrong unit is refused, and the refusal names the raw
// value, its unit and the tolerance, never a distance that a time.Duration
// cannot hold (milliseconds read as seconds lie ~55000 years ahead, which
// printed as "2562047h47m16s in the future"). Every timestamped preset.
func TestTimestampWrongUnitReason(t *testing.T) {
	t.Parallel()
	for _, f := range fixtures {
		p := f.preset(t)
		if p.DefaultTolerance == 0 || p.TimestampLayout != "" || f.provider == "linear" || f.provider == "pubsub" || f.provider == "plaid" {
			// No timestamp; or a date (RFC 3339: no unit to confuse); or
			// linear's, inside the signed body, whose refusal goes through
			// the same checkTimestamp (TestLinearBodyTimestamp); or a JWT's
			// iat and exp, always seconds (TestPubSub).
			continue
		}
		unit := p.TimestampUnit
		// The signing instant whose timestamp text, in the scheme's own unit,
		// is today's time in the other unit.
		var signAt time.Time
		var raw, hint string
		if unit == time.Millisecond {
			raw = strconv.FormatInt(now.Unix(), 10)
			signAt, hint = time.UnixMilli(now.Unix()), "looks like seconds"
		} else {
			raw = strconv.FormatInt(now.UnixMilli(), 10)
			signAt, hint = time.Unix(now.UnixMilli(), 0), "looks like milliseconds"
		}
		t.Run(f.provider, func(t *testing.T) {
			t.Parallel()
			h := f.signed(t, f.secrets[0], f.body, signAt)
			err := f.verify(t, f.secrets[:1], now, f.body, h)
			require.ErrorIs(t, err, signature.ErrTimestampOutOfTolerance)
			msg := err.Error()
			require.Contains(t, msg, "timestamp "+raw+" ")
			require.Contains(t, msg, hint)
			require.Contains(t, msg, "tolerance of "+p.DefaultTolerance.String())
			require.NotContains(t, msg, "2562047h")
		})
	}
}
