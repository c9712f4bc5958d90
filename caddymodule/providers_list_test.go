package caddymodule

import (
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/require"
)

// caddy validate refuses an unknown provider and lists every preset,
// including those of issue 25.
func TestUnknownProviderListsPresets(t *testing.T) {
	t.Parallel()
	h := &Handler{Provider: "nope", Secrets: []string{"s"}}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
	t.Cleanup(cancel)
	err := h.Provision(ctx)
	require.ErrorContains(t, err, `unknown provider "nope"`)
	for _, name := range []string{"adyen", "braintree", "mollie", "recurly", "chargebee", "authorizenet", "mercadopago",
		"revolut", "airwallex", "flutterwave", "xendit", "midtrans", "fastspring", "rapyd"} {
		require.Contains(t, err.Error(), " "+name+",", name)
	}
}

// A misspelt provider names the one it is closest to (a new user's trial:
// 109 names and no hint).
func TestMisspeltProviderSuggested(t *testing.T) {
	t.Parallel()
	for typo, want := range map[string]string{"strpe": "stripe", "gihub": "github", "shopfy": "shopify"} {
		h := &Handler{Provider: typo, Secrets: []string{"s"}}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
		err := h.Provision(ctx)
		cancel()
		require.ErrorContains(t, err, `unknown provider "`+typo+`": did you mean `+want+`?`)
	}
}
