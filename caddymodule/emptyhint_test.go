package caddymodule

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A secret or verify token that expands to nothing names its placeholder and
// the fix of its kind: a {file.…} whose file is missing is not reported as an
// unset environment variable (a new user's trial), and the value of a
// placeholder that did expand never appears.
func TestEmptyPlaceholderSaysWhich(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "stripe_secret")
	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	t.Setenv("WI_TEST_EMPTY_SECRET", "")

	cases := []struct {
		raw, want, not string
	}{
		{"{file." + missing + "}", "{file." + missing + "} read nothing: does the file exist", "environment"},
		{"{file." + empty + "}", "not empty?", "environment"},
		{"{env.WI_TEST_EMPTY_SECRET}", "{env.WI_TEST_EMPTY_SECRET} is empty: is the variable set in the environment of the running Caddy process?", "file"},
		{"", "secret: a secret is empty", "("},
	}
	for _, c := range cases {
		h := &Handler{Provider: "stripe", Secrets: []string{"whsec_ok", c.raw}}
		_, err := h.expandedSecrets()
		require.Error(t, err, c.raw)
		require.Contains(t, err.Error(), c.want)
		require.NotContains(t, err.Error(), c.not)
		require.NotContains(t, err.Error(), "whsec_ok", "no secret in the error")

		h = &Handler{Provider: "meta"}
		h.VerifyTokens = []string{c.raw}
		_, err = h.expandedVerifyTokens()
		require.Error(t, err, c.raw)
		require.Contains(t, err.Error(), "verify_token: a verify token is empty")
		if c.raw != "" {
			require.Contains(t, err.Error(), c.want)
		}
	}
}

// A storage DSN or path that expands to nothing names its placeholder too
// (it said "DSN is required", a new user's trial), and nothing is opened.
func TestEmptyStoragePlaceholderSaysWhich(t *testing.T) {
	t.Setenv("WI_TEST_EMPTY_DSN", "")
	for backend, want := range map[string]string{
		"postgres": "storage postgres: the DSN is empty ({env.WI_TEST_EMPTY_DSN} is empty: is the variable set in the environment of the running Caddy process?)",
		"sqlite":   "storage sqlite: the path is empty ({env.WI_TEST_EMPTY_DSN} is empty: is the variable set in the environment of the running Caddy process?)",
	} {
		err := provisionErr(t, "webhook_idempotency {\n provider stripe\n secret whsec_ok\n storage "+backend+" {env.WI_TEST_EMPTY_DSN}\n}")
		require.EqualError(t, err, want)
	}
}
