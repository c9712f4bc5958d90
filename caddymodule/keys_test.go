package caddymodule

import (
	"testing"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/keyfetch/keyfetchtest"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// keys is the local key server of this package's tests: the presets
// verified with the provider's fetched keys (paypal, sns, pubsub) read
// their certificates and key sets from it, through keyfetch's test-only
// override (no configuration can install it). TestMain starts it.
var keys *keyfetchtest.Server

// fetchedSetting is what each fetched-key preset is configured with in
// tests: PayPal's webhook ID, the SNS topic, the Pub/Sub service account.
var fetchedSetting = map[string]string{
	"paypal":   "8PT597110X687430LKGECATA",
	"sns":      "arn:aws:sns:us-east-1:123456789012:orders",
	"pubsub":   "push@project-1.iam.gserviceaccount.com",
	"wise":     "test",
	"plaid":    "sandbox:client-a:secret-a",
	"appstore": "com.example.app",
}

// fetchedSigningSecret returns a signing secret (setting|private key) for
// a fetched-key preset, ok false for the others.
func fetchedSigningSecret(t *testing.T, provider string) (string, bool) {
	t.Helper()
	setting, ok := fetchedSetting[provider]
	if !ok {
		return "", false
	}
	s, err := signature.NewSigningSecret(provider, setting)
	if err != nil {
		t.Fatal(err)
	}
	return s, true
}
