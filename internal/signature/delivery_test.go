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
		{"retries, nothing more said", Retry{Retries: true}, false},
		{"three days", Retry{Retries: true, For: 72 * time.Hour}, true},
		{"an hour", Retry{Retries: true, For: time.Hour}, true},
		{"42 minutes, 4 attempts", Retry{Retries: true, For: 42 * time.Minute, Attempts: 4}, false},
		{"one retry", Retry{Retries: true, Attempts: 2}, false},
		{"ten attempts, for how long unsaid", Retry{Retries: true, Attempts: 10}, false},
	} {
		if got := tc.r.OutlastsOutage(); got != tc.want {
			t.Errorf("%s: OutlastsOutage() = %v, want %v", tc.name, got, tc.want)
		}
	}
	for name, want := range map[string]bool{"stripe": true, "square": true, "github": false, "okta": false, "slack": false, "cashfree": false} {
		p, ok := Lookup(name)
		if !ok {
			t.Fatalf("no preset %s", name)
		}
		if got := p.Delivery.Retry.OutlastsOutage(); got != want {
			t.Errorf("%s: OutlastsOutage() = %v, want %v", name, got, want)
		}
	}
}
