package signature

import (
	"testing"
	"time"
)

func TestRetryOutlastsOutage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		r    Retry
		want bool
	}{
		{"does not retry", Retry{}, false},
		{"retries, nothing more said", Retry{Retries: true}, true},
		{"three days", Retry{Retries: true, For: 72 * time.Hour}, true},
		{"an hour", Retry{Retries: true, For: time.Hour}, true},
		{"42 minutes, 4 attempts", Retry{Retries: true, For: 42 * time.Minute, Attempts: 4}, false},
		{"one retry", Retry{Retries: true, Attempts: 2}, false},
		{"three attempts, no duration", Retry{Retries: true, Attempts: 3}, true},
	} {
		if got := tc.r.OutlastsOutage(); got != tc.want {
			t.Errorf("%s: OutlastsOutage() = %v, want %v", tc.name, got, tc.want)
		}
	}
	for name, want := range map[string]bool{"stripe": true, "github": false, "okta": false, "cashfree": false} {
		p, ok := Lookup(name)
		if !ok {
			t.Fatalf("no preset %s", name)
		}
		if got := p.Delivery.Retry.OutlastsOutage(); got != want {
			t.Errorf("%s: OutlastsOutage() = %v, want %v", name, got, want)
		}
	}
}
