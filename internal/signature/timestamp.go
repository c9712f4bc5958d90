package signature

import (
	"fmt"
	"net/http"
	"time"
)

// layoutChecker returns a checkTimestamp for timestamps written as dates in
// layout (time.RFC3339Nano also accepts RFC 3339 without fractions), with
// the same both-ways tolerance and errors.
func layoutChecker(layout string) func(string, time.Duration, time.Duration, time.Time) error {
	return func(text string, _, tolerance time.Duration, now time.Time) error {
		if text == "" || len(text) > 64 {
			return fmt.Errorf("timestamp is not a %s date: %w", layoutName(layout), ErrMalformedHeader)
		}
		t, err := time.Parse(layout, text)
		if err != nil && layout == layoutISOUTC {
			// Orb's SDK reads a timestamp with a zone as written.
			t, err = time.Parse(time.RFC3339Nano, text)
		}
		if err != nil {
			return fmt.Errorf("timestamp is not a %s date: %w", layoutName(layout), ErrMalformedHeader)
		}
		return checkInstant(t, tolerance, now)
	}
}

// layoutISOUTC is an ISO 8601 date and time without a zone, read as UTC
// (Orb writes X-Orb-Timestamp so); one with a zone (RFC 3339) is accepted
// too.
const layoutISOUTC = "2006-01-02T15:04:05.999999999"

func layoutName(layout string) string {
	switch layout {
	case time.RFC3339Nano, time.RFC3339:
		return "RFC 3339"
	case layoutISOUTC:
		return "ISO 8601"
	}
	return "dated"
}

// checkInstant checks t is within tolerance of now, in both directions;
// exactly tolerance away is still accepted.
func checkInstant(t time.Time, tolerance time.Duration, now time.Time) error {
	switch {
	case t.Before(now.Add(-tolerance)):
		return fmt.Errorf("timestamp is %s old, tolerance %s: %w", now.Sub(t).Round(time.Second), tolerance, ErrTimestampOutOfTolerance)
	case t.After(now.Add(tolerance)):
		return fmt.Errorf("timestamp is %s in the future, tolerance %s: %w", t.Sub(now).Round(time.Second), tolerance, ErrTimestampOutOfTolerance)
	}
	return nil
}

// clock returns a timestamped scheme's tolerance (o.Tolerance, else the
// preset's default) and clock (o.Now, else time.Now).
func clock(p Preset, o Options) (time.Duration, func() time.Time) {
	tolerance := p.DefaultTolerance
	if o.Tolerance > 0 {
		tolerance = o.Tolerance
	}
	now := o.Now
	if now == nil {
		now = time.Now
	}
	return tolerance, now
}

// signedAt reads the one value (oneValue) of a scheme's signature header and
// of its timestamp header, in that order.
func signedAt(h http.Header, sigHeader, tsHeader string) (sig, ts string, err error) {
	if sig, err = oneValue(h, sigHeader); err != nil {
		return "", "", err
	}
	if ts, err = oneValue(h, tsHeader); err != nil {
		return "", "", err
	}
	return sig, ts, nil
}
