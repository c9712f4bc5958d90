package signature

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// docs/providers.md is generated from the presets (go generate
// ./internal/signature): this test fails when the file is stale.
func TestProvidersDoc(t *testing.T) {
	t.Parallel()
	got, err := os.ReadFile("../../docs/providers.md")
	require.NoError(t, err, "docs/providers.md is missing; run go generate ./internal/signature")
	require.Equal(t, ProvidersDoc(), string(got), "docs/providers.md is stale; run go generate ./internal/signature")
}

// Every preset's delivery facts are researched: each names its source or
// says the provider does not document it.
func TestDeliveryFacts(t *testing.T) {
	t.Parallel()
	for _, name := range Providers() {
		p := registry[name]
		if unresearched[name] {
			require.False(t, p.Delivery.Researched(), "%s is researched now: remove it from unresearched", name)
			continue
		}
		require.True(t, p.Delivery.Researched(), "%s: every delivery fact needs a Source (a document or Undocumented)", name)
	}
	// The generic preset stands for any sender: no document can state its
	// facts, so every one is Undocumented (and its spool is on by default).
	d := registry["hmac"].Delivery
	for _, s := range []Source{d.Retry.Source, d.MaxBody.Source, d.Timeout.Source, d.Answer.Source, d.Refusal.Source} {
		require.Equal(t, Undocumented, s, "hmac is generic: its delivery facts are undocumented by definition")
	}
}

// unresearched lists the presets whose delivery facts are still to be
// looked up; it only shrinks.
var unresearched = map[string]bool{
	"authorizenet": true,

	"fastspring": true,

	"easypost": true,
	"heroku":   true,
	"trello":   true,
}
