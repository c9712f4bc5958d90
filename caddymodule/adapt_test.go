package caddymodule

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

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
	requireFirst(t, "reverse_proxy", raw, "reverse_proxy")
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
		requireFirst(t, block, raw, "reverse_proxy", "static_response")
	}
	// invoke sorts just before handle: an invoked named route holding the
	// reverse_proxy answered without the handler, in a handle block too (an
	// adversarial trial).
	raw := "&(up) {\n\treverse_proxy 127.0.0.1:9000\n}\nhttp://localhost:9999 {\n\thandle /webhooks/* {\n\t\tinvoke up\n" +
		"\t\twebhook_idempotency {\n\t\t\tprovider stripe\n\t\t\tsecret s\n\t\t}\n\t}\n\trespond 404\n}\n"
	requireFirst(t, "invoke", raw, "invoke")
}

// requireFirst adapts raw and requires webhook_idempotency before each of
// the handlers after (by their JSON "handler" names).
func requireFirst(t *testing.T, name, raw string, after ...string) {
	t.Helper()
	out, err := adaptJSON(raw)
	require.NoError(t, err)
	i := strings.Index(out, `"handler":"webhook_idempotency"`)
	require.GreaterOrEqual(t, i, 0, "%s: no webhook_idempotency: %s", name, out)
	for _, a := range after {
		j := strings.Index(out, `"handler":"`+a+`"`)
		require.Greater(t, j, i, "%s: webhook_idempotency must come before %s: %s", name, a, out)
	}
}

func adaptJSON(caddyfileText string) (string, error) {
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfileText), nil)
	return string(out), err
}

// A handler at a site's top level and one of the same scope in a handle
// block both run now that the directive sorts before handle: the inner one
// passes deliveries on (the outer verified, claimed and settles them)
// instead of finding the outer's claim in flight and answering 409 to every
// delivery (an adversarial trial: an event lost to a provider that gives
// up). Unsigned bodies are still refused, redeliveries still duplicates.
// The mark cannot be forged by a config (a map directive writing the scope
// placeholder skipped the only handler), and scopes a, b, a nest too.
func TestNestedHandlerOfItsScopePassesOn(t *testing.T) {
	secret := "whsec_" + randomHex(8)
	db := filepath.Join(t.TempDir(), "events.db")
	block := func(scope string) string {
		return fmt.Sprintf("webhook_idempotency {\n\t\tprovider stripe\n\t\tsecret %q\n\t\tscope %s\n\t\tstorage sqlite %q\n\t}", secret, scope, db)
	}
	a, b := uniqueScope("nested_a"), uniqueScope("nested_b")
	for name, site := range map[string]func(up string) string{
		"top level and handle": func(up string) string {
			return block(a) + "\n\thandle /hook {\n\t" + block(a) + "\n\t\treverse_proxy " + up + "\n\t}"
		},
		"scopes a, b, a": func(up string) string {
			return block(a) + "\n\thandle /hook {\n\t" + block(b) + "\n\t\thandle /hook {\n\t" + block(a) +
				"\n\t\t\treverse_proxy " + up + "\n\t\t}\n\t}"
		},
		"a map writing the scope placeholder": func(up string) string {
			return "map {path} {http.webhook_idempotency.scope} {\n\t\tdefault " + a + "\n\t}\n\thandle /hook {\n\t" + block(a) +
				"\n\t\treverse_proxy " + up + "\n\t}"
		},
	} {
		up, forwards := countingUpstream(t)
		startCaddy(t, "{\n"+caddyTestGlobals+"}\nhttp://localhost:9080 {\n\t"+site(up.Listener.Addr().String())+
			"\n\thandle {\n\t\trespond 404\n\t}\n}\n")
		id := "evt_nested_" + randomHex(4)
		body := stripeBody(id, "x")
		first := send(t, stripeRequest(t, gatewayBase+"/hook", secret, body, time.Now(), id))
		require.Equal(t, http.StatusOK, first.status, "%s: %s", name, first.body)
		require.False(t, first.replayed, name)
		again := send(t, stripeRequest(t, gatewayBase+"/hook", secret, body, time.Now(), id))
		require.Equal(t, http.StatusOK, again.status, "%s: %s", name, again.body)
		require.True(t, again.replayed, "%s: the redelivery is a duplicate", name)
		forged := send(t, stripeRequest(t, gatewayBase+"/hook", "whsec_other", stripeBody("evt_forged", "x"), time.Now(), "forged"))
		require.Equal(t, http.StatusBadRequest, forged.status, "%s: %s", name, forged.body)
		require.Equal(t, int32(1), forwards.Load(), "%s: forwarded once, the forged body never", name)
	}
}
