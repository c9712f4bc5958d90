package cli_test

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/cli"
)

// sign --provider discord (and telnyx) with a malformed secret says the
// private seed it wants, as its help does, never "public key" (a new user's
// trial: the verifier's message about public keys was printed).
func TestSignWantsPrivateSeed(t *testing.T) {
	cases := []struct{ provider, secret, want string }{
		{"discord", "abcd", "discord signing secret must be a 32-byte private seed in hex"},
		{"discord", strings.Repeat("ab", 31), "private seed"},
		{"telnyx", base64.StdEncoding.EncodeToString(make([]byte, 32)), "seed:<base64 32-byte seed>"},
	}
	for _, c := range cases {
		_, err := cli.BuildDelivery(cli.SignParams{Provider: c.provider, Secret: c.secret})
		require.Error(t, err, c.provider)
		require.Contains(t, err.Error(), "--secret: ")
		require.Contains(t, err.Error(), c.want)
		require.NotContains(t, err.Error(), "public key")
	}
	// A well-formed seed still signs.
	_, err := cli.BuildDelivery(cli.SignParams{Provider: "discord", Secret: strings.Repeat("ab", 32)})
	require.NoError(t, err)
}
