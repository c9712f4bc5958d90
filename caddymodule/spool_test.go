package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/spool"
)

// prepared parses a webhook_idempotency block and applies its defaults
// and checks (no I/O).
func prepared(t *testing.T, lines string) (*Handler, error) {
	t.Helper()
	h := new(Handler)
	require.NoError(t, h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("webhook_idempotency {\n"+lines+"}")))
	return h, h.prepareConfig()
}

// The spool is on by default where the provider does not redeliver a
// failed delivery on its own (the preset's delivery facts: GitHub), off
// where it does (Stripe); spool on|off|<dir> overrides it; routes it does
// not apply to default to off.
func TestSpoolDefaults(t *testing.T) {
	t.Setenv("SPOOL_TEST_DIR", "/srv/spool/from-env")
	def := func(scope string) string {
		return filepath.Join(caddy.AppDataDir(), "webhook_idempotency", "spool", scope)
	}
	async := "mode async\ndeliver_to http://127.0.0.1:9\nstorage postgres postgres://u@127.0.0.1/db\n"
	for _, tc := range []struct{ name, lines, want string }{
		{"github: on", "provider github\nsecret s\n", def("github")},
		{"github, its scope", "provider github\nsecret s\nscope gh-main\n", def("gh-main")},
		{"stripe: off", "provider stripe\nsecret s\n", ""},
		{"standard: off (the specification recommends retries)", "provider standard\nsecret whsec_c2VjcmV0\n", ""},
		{"okta: on (one retry cannot outlast an outage)", "provider okta\nsecret s\n", def("okta")},
		{"hmac: on (generic, undocumented)", "provider hmac\nsecret s\nevent_id json id\nhmac {\nheader X-Signature\n}\n", def("hmac")},
		{"gitea: on (no retry documented)", "provider gitea\nsecret s\n", def("gitea")},
		{"slack: on (retries for 5 minutes)", "provider slack\nsecret s\n", def("slack")},
		{"gitlab: on (retries, for how long unsaid)", "provider gitlab\nsecret s\n", def("gitlab")},
		{"square: off (retries for 24 hours)", "provider square\nsecret s\nurl https://hooks.example.test/square\n", ""},
		{"github spool off", "provider github\nsecret s\nspool off\n", ""},
		{"stripe spool on", "provider stripe\nsecret s\nspool on\n", def("stripe")},
		{"a directory", "provider stripe\nsecret s\nspool /var/spool/stripe\n", "/var/spool/stripe"},
		{"a placeholder", "provider stripe\nsecret s\nspool {env.SPOOL_TEST_DIR}\n", "/srv/spool/from-env"},
		{"github async: off", "provider github\nsecret s\n" + async, ""},
		{"idempotency_key: off", "provider idempotency_key\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := prepared(t, tc.lines)
			require.NoError(t, err)
			require.Equal(t, tc.want, h.spoolDir)
			require.EqualValues(t, defaultSpoolMax, h.SpoolMax)
		})
	}
}

// Spool settings that cannot work are refused at load, saying what to
// write instead; a bad size is a Caddyfile error.
func TestSpoolRefusedConfigs(t *testing.T) {
	async := "mode async\ndeliver_to http://127.0.0.1:9\nstorage postgres postgres://u@127.0.0.1/db\n"
	for _, tc := range []struct{ name, lines, want string }{
		{"relative directory", "provider github\nsecret s\nspool spool/here\n", "absolute directory"},
		{"async", "provider github\nsecret s\nspool on\n" + async, "only with mode sync"},
		{"idempotency_key", "provider idempotency_key\nspool on\n", "not with provider idempotency_key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := prepared(t, tc.lines)
			require.ErrorContains(t, err, tc.want)
		})
	}
	for _, bad := range []string{"spool_max 0\n", "spool_max lots\n", "spool\n", "spool a b\n"} {
		h := new(Handler)
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("webhook_idempotency {\nprovider github\nsecret s\n" + bad + "}"))
		require.Error(t, err, bad)
	}
	h, err := prepared(t, "provider github\nsecret s\nspool_max 2GB\n")
	require.NoError(t, err)
	require.EqualValues(t, 2_000_000_000, h.SpoolMax)
}

// provisionSpooled provisions a GitHub route on an SQLite store in dir
// with the given spool lines.
func provisionSpooled(t *testing.T, ctx caddy.Context, dir, lines string) (*Handler, error) {
	t.Helper()
	h := new(Handler)
	require.NoError(t, h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("webhook_idempotency {\nprovider github\nsecret s\nstorage sqlite "+
		filepath.Join(dir, "events.db")+"\n"+lines+"}")))
	err := h.Provision(ctx)
	if err != nil {
		_ = h.Cleanup()
	}
	return h, err
}

// Routes naming one spool directory share one open spool, which survives
// a config reload (the new config provisions before the old one is
// cleaned up); they must agree on spool_max. A directory another process
// holds, or one that others can read, is refused with what to write.
func TestSpoolProvision(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "spool")
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()

	a, err := provisionSpooled(t, ctx, base, "spool "+dir+"\n")
	require.NoError(t, err)
	reload, err := provisionSpooled(t, ctx, base, "spool "+dir+"\n")
	require.NoError(t, err)
	require.Same(t, a.spooler.sp, reload.spooler.sp, "one spool per directory")
	require.Equal(t, os.FileMode(0o700), mustMode(t, dir))

	_, err = provisionSpooled(t, ctx, base, "spool "+dir+"\nspool_max 10MB\n")
	require.ErrorContains(t, err, "must agree")

	require.NoError(t, a.Cleanup())
	_, used := spools.References(dir)
	require.True(t, used, "the reloaded route still holds it")
	require.NoError(t, reload.Cleanup())
	_, used = spools.References(dir)
	require.False(t, used, "closed with its last route")

	// Another holder of the directory (here: this process, on another
	// file description, as a second Caddy process would).
	other, err := spool.Open(spool.Options{Dir: dir})
	require.NoError(t, err)
	_, err = provisionSpooled(t, ctx, base, "spool "+dir+"\n")
	require.ErrorContains(t, err, "in use by another process")
	require.ErrorContains(t, err, "spool off")
	require.NoError(t, other.Close())

	open := filepath.Join(base, "open")
	require.NoError(t, os.Mkdir(open, 0o755))
	require.NoError(t, os.Chmod(open, 0o755))
	_, err = provisionSpooled(t, ctx, base, "spool "+open+"\n")
	require.ErrorContains(t, err, "chmod 700")
}

func mustMode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	return fi.Mode().Perm()
}

// Spooled deliveries replayed through nested handlers of two scopes, each
// on its own store, one of them down with a spool: the other handler
// passes the replay on, before or after the spool's (the outer one verified
// and claimed it, or the inner one spooled what the outer claimed and then
// completed on its 200). Either refused it (421) before, so the record was
// replayed forever: an event answered 200 and never forwarded (the second
// found by an adversarial trial).
func TestSpoolReplayThroughNestedScopes(t *testing.T) {
	for _, outerDown := range []bool{true, false} {
		link, u := cutStoreLink(t)
		secret := "whsec_" + randomHex(8)
		dir := t.TempDir()
		block := func(indent, scope string, down bool) string {
			storage := fmt.Sprintf("storage sqlite %q", filepath.Join(dir, "events.db"))
			if down {
				storage = fmt.Sprintf("storage postgres %q\n%sspool %q", u.String(), indent, filepath.Join(dir, "spool"))
			}
			return fmt.Sprintf("webhook_idempotency {\n%sprovider stripe\n%ssecret %q\n%sscope %s\n%s%s\n%s}",
				indent, indent, secret, indent, uniqueScope(scope), indent, storage, indent[1:])
		}
		up, forwards := countingUpstream(t)
		startCaddy(t, "{\n"+caddyTestGlobals+"}\nhttp://localhost:9080 {\n\t"+block("\t\t", "outer", outerDown)+
			"\n\thandle /hook {\n\t\t"+block("\t\t\t", "inner", !outerDown)+"\n\t\treverse_proxy "+up.Listener.Addr().String()+
			"\n\t}\n\thandle {\n\t\trespond 404\n\t}\n}\n")

		id := "evt_spool_nested_" + randomHex(4)
		body := stripeBody(id, "x")
		first := send(t, stripeRequest(t, gatewayBase+"/hook", secret, body, time.Now(), id))
		require.Equal(t, http.StatusOK, first.status, "outer down %v: kept in the spool: %s", outerDown, first.body)
		require.Zero(t, forwards.Load(), "outer down %v: nothing forwarded without a claim", outerDown)

		link.Restore()
		require.Eventually(t, func() bool { return forwards.Load() == 1 }, 30*time.Second, 50*time.Millisecond,
			"outer down %v: the spooled delivery is forwarded once the store is back", outerDown)
		again := send(t, stripeRequest(t, gatewayBase+"/hook", secret, body, time.Now(), id))
		require.Equal(t, http.StatusOK, again.status, "%s", again.body)
		require.True(t, again.replayed, "outer down %v: the redelivery is a duplicate", outerDown)
		time.Sleep(2 * time.Second) // a refused replay would be tried again
		require.Equal(t, int32(1), forwards.Load(), "outer down %v: forwarded exactly once", outerDown)
	}
}

// A spooled delivery whose route changed before it was replayed (its path
// now answered by another handler) reaches no handler of its spool: it is
// counted as refused, so it is tried with back-off and set aside (dead)
// after the spool's dead_after, where the admin API can retry or drop it.
// It waited before, forever, and could not be dropped (an adversarial
// trial: "409 is not dead").
func TestSpoolReplayThatMissesItsRouteIsRefused(t *testing.T) {
	link, u := cutStoreLink(t)
	secret := "whsec_" + randomHex(8)
	dir := t.TempDir()
	scope := uniqueScope("moved")
	up, forwards := countingUpstream(t)
	site := func(path string) string {
		return fmt.Sprintf("{\n%s}\nhttp://localhost:9080 {\n\thandle %s {\n\t\twebhook_idempotency {\n\t\t\tprovider stripe\n\t\t\tsecret %q\n"+
			"\t\t\tscope %s\n\t\t\tstorage postgres %q\n\t\t\tspool %q\n\t\t}\n\t\treverse_proxy %s\n\t}\n\thandle {\n\t\trespond 404\n\t}\n}\n",
			caddyTestGlobals, path, secret, scope, u.String(), filepath.Join(dir, "spool"), up.Listener.Addr().String())
	}
	startCaddy(t, site("/hook"))
	id := "evt_moved_" + randomHex(4)
	first := send(t, stripeRequest(t, gatewayBase+"/hook", secret, stripeBody(id, "x"), time.Now(), id))
	require.Equal(t, http.StatusOK, first.status, "kept in the spool: %s", first.body)

	startCaddy(t, site("/moved")) // a reload: /hook now answered 404
	link.Restore()
	var entry SpoolEntryJSON
	require.Eventually(t, func() bool {
		rec := httptest.NewRecorder()
		require.NoError(t, new(Admin).serve(rec, httptest.NewRequest(http.MethodGet, "/webhook_idempotency/spool", nil)))
		var spools []SpoolJSON
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &spools))
		for _, sp := range spools {
			for _, e := range sp.Deliveries {
				if e.EventID == id {
					entry = e
				}
			}
		}
		return entry.Attempts > 0
	}, 30*time.Second, 100*time.Millisecond, "the missed replay counts as a refused attempt")
	require.Equal(t, "refused", entry.Last)
	require.Zero(t, forwards.Load(), "nothing forwarded")
}
