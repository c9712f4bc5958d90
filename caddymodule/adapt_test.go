package caddymodule

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/stretchr/testify/require"
)

// TestCaddyfileAdapt adapts each testdata/*.caddyfiletest (a Caddyfile, a
// line of dashes, the expected JSON) and the shipped examples/Caddyfile
// (against examples/Caddyfile.json, the JSON the README documents).
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob("testdata/*.caddyfiletest")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	split := regexp.MustCompile(`(?m)^-{5,}\s*$`)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			require.NoError(t, err)
			parts := split.Split(string(raw), 2)
			require.Len(t, parts, 2, "want a Caddyfile, a line of dashes, then the JSON")
			require.True(t, caddytest.CompareAdapt(t, f, parts[0], "caddyfile", strings.TrimSpace(parts[1])),
				"adapted JSON differs (the diff is printed above)")
		})
	}
	t.Run("examples/Caddyfile", func(t *testing.T) {
		cfg, err := os.ReadFile("../examples/Caddyfile")
		require.NoError(t, err)
		want, err := os.ReadFile("../examples/Caddyfile.json")
		require.NoError(t, err)
		require.True(t, caddytest.CompareAdapt(t, "examples/Caddyfile", string(cfg), "caddyfile", strings.TrimSpace(string(want))))
	})
}

// The directive needs no global order line: it sorts before reverse_proxy.
func TestDirectiveOrderedBeforeReverseProxy(t *testing.T) {
	raw := "http://localhost:9999 {\n\treverse_proxy 127.0.0.1:9000\n\twebhook_idempotency {\n\t\tprovider stripe\n\t\tsecret s\n\t}\n}\n"
	out, err := adaptJSON(raw)
	require.NoError(t, err)
	i := strings.Index(out, `"handler":"webhook_idempotency"`)
	j := strings.Index(out, `"handler":"reverse_proxy"`)
	require.True(t, i >= 0 && j > i, "webhook_idempotency must come before reverse_proxy: %s", out)
}

// A site-level webhook_idempotency runs before the site's handle and route
// blocks, as basic_auth does: ordered just before reverse_proxy, it came
// after them, and a handle block holding the reverse_proxy answered every
// request without it (a new user's trial: unsigned bodies forwarded, each
// redelivery run again, nothing logged).
func TestDirectiveOrderedBeforeHandle(t *testing.T) {
	for _, block := range []string{"handle /webhooks/*", "route /webhooks/*", "handle_path /webhooks/*"} {
		raw := "http://localhost:9999 {\n\t" + block + " {\n\t\treverse_proxy 127.0.0.1:9000\n\t}\n\trespond 404\n" +
			"\twebhook_idempotency {\n\t\tprovider stripe\n\t\tsecret s\n\t}\n}\n"
		out, err := adaptJSON(raw)
		require.NoError(t, err)
		i := strings.Index(out, `"handler":"webhook_idempotency"`)
		j := strings.Index(out, `"handler":"reverse_proxy"`)
		k := strings.Index(out, `"handler":"static_response"`)
		require.True(t, i >= 0 && j > i && k > i, "%s: webhook_idempotency must come first: %s", block, out)
	}
}

func adaptJSON(caddyfileText string) (string, error) {
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfileText), nil)
	return string(out), err
}
