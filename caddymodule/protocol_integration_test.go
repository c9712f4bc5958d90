package caddymodule

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha1" //nolint:gosec // Braintree's documented scheme
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/cli"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// These tests drive a real in-process Caddy (caddytest, fixed ports: no
// t.Parallel, run under the caddymodule flock) with one route per provider
// of issue 13 in front of a recording upstream, on the test PostgreSQL:
// each provider's handshake is answered at the edge, its deliveries are
// verified and forwarded once, redeliveries are answered at the edge, and
// batches follow their policy.

// pathUpstream records every forwarded request by path.
type pathUpstream struct {
	*httptest.Server
	mu    sync.Mutex
	calls map[string][]recorded
	// fail makes the upstream answer 500 to bodies containing it.
	fail atomic.Value
}

type recorded struct {
	method string
	body   []byte
	header http.Header
}

func newPathUpstream(t *testing.T) *pathUpstream {
	u := &pathUpstream{calls: map[string][]recorded{}}
	u.fail.Store("")
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.calls[r.URL.Path] = append(u.calls[r.URL.Path], recorded{r.Method, body, r.Header.Clone()})
		u.mu.Unlock()
		w.Header().Set("X-Upstream", "yes")
		if f := u.fail.Load().(string); f != "" && bytes.Contains(body, []byte(f)) {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"upstream":true}`)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *pathUpstream) got(path string) []recorded {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]recorded(nil), u.calls[path]...)
}

// protoRoute is one provider's route in the test config.
type protoRoute struct {
	provider string
	path     string
	signing  string // signs deliveries; "" for a learned secret
	config   string // the block's lines beyond provider and storage
	idFrom   string // where the test puts event IDs, when the preset has no default
	url      string // URL-signed schemes
}

func protoRoutes(t *testing.T) []protoRoute {
	secret := func(provider string) string { return cliSigningSecret(t, provider) }
	var routes []protoRoute
	add := func(provider, path string, lines ...string) {
		r := protoRoute{provider: provider, path: path}
		if path == "" {
			r.path = "/p/" + provider
		}
		p, ok := signature.Lookup(provider)
		require.True(t, ok, provider)
		if !learnsSecret(provider) {
			r.signing = secret(provider)
			pub, err := signature.PublicSecret(provider, r.signing)
			require.NoError(t, err)
			lines = append(lines, fmt.Sprintf("secret %q", pub))
		}
		if len(p.EventID) == 0 && p.Batch == nil {
			r.idFrom = "json id"
			lines = append(lines, "event_id json id")
		}
		if p.NeedsURL {
			r.url = gatewayBase + r.path
			lines = append(lines, "url "+r.url)
		}
		r.config = strings.Join(lines, "\n\t\t\t")
		routes = append(routes, r)
	}
	for _, p := range []string{"msgraph", "trello", "okta", "twitch", "dropbox", "mailgun", "linear", "woocommerce",
		"gitea", "slack", "discord", "xero", "asana", "notion"} {
		add(p, "")
	}
	add("meta", "", "verify_token {env.WI_TEST_META_VERIFY}", "verify_token old-verify-token")
	add("zoom", "", "scope zoom_proto")
	add("sendgrid", "/p/sendgrid-set")
	add("sendgrid", "/p/sendgrid-split", "batch split", "scope sendgrid_split")
	add("gocardless", "/p/gocardless-split", "batch split")
	add("hubspot", "")
	for _, p := range presetsB {
		add(p, "")
	}
	// Plivo and Mandrill post forms: their event IDs are form fields.
	for _, f := range []struct{ provider, field string }{{"plivo", "CallUUID"}, {"mandrill", "mandrill_events"}} {
		add(f.provider, "")
		r := &routes[len(routes)-1]
		r.config = strings.Replace(r.config, "event_id json id", "event_id form "+f.field, 1)
		r.idFrom = "form " + f.field
	}
	for _, p := range []string{"paypal", "sns", "pubsub", "wise", "plaid", "appstore"} {
		add(p, "")
	}
	add("adyen", "")
	for _, p := range []string{"mollie", "recurly", "revolut", "airwallex", "fastspring", "authorizenet", "flutterwave",
		"xendit", "chargebee", "midtrans", "mercadopago", "rapyd", "braintree"} {
		add(p, "")
	}
	add("adyen", "/p/adyen-basic", `secret "basic:ws_adyen:{env.WI_TEST_ADYEN_PASS}"`, "scope adyen_basic")
	return routes
}

// presetsB are the issue 25 presets that deliver a JSON body through the
// generic route (TestProtocolsThroughCaddy "<name> delivers").
var presetsB = []string{
	"zendesk", "segment", "clickup", "sanity", "liveblocks", "lithic", "aftership", "moderntreasury", "finch",
	"onfido", "cashfree", "cloudinary", "pusher", "vonage", "postmark", "hygraph", "attio", "launchdarkly", "helpscout", "orb", "coinify", "moonpay", "jira", "fintoc", "zohopayments",
}

// protoConfig renders the Caddyfile: every route on table, plus extra
// lines on each block (to make a reload provision anew).
func protoConfig(routes []protoRoute, dsn, table, upstream, extra string) string {
	var b strings.Builder
	b.WriteString("{\n" + caddyTestGlobals + "}\nhttp://localhost:9080 {\n")
	for _, r := range routes {
		fmt.Fprintf(&b, "\thandle %s {\n\t\twebhook_idempotency {\n\t\t\tprovider %s\n\t\t\tstorage postgres %q\n\t\t\ttable %s\n\t\t\t%s\n\t\t\t%s\n\t\t}\n\t\treverse_proxy %s\n\t}\n",
			r.path, r.provider, dsn, table, r.config, extra, upstream)
	}
	b.WriteString("}\n")
	return b.String()
}

// doReq sends a request to the gateway.
func doReq(t *testing.T, method, path string, body []byte, header http.Header) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, gatewayBase+path, bytes.NewReader(body))
	require.NoError(t, err)
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func TestProtocolsThroughCaddy(t *testing.T) {
	if testing.Short() {
		t.Skip("in-process Caddy: skipped with -short")
	}
	t.Setenv("WI_TEST_META_VERIFY", "meta-verify-"+randomHex(4))
	t.Setenv("WI_TEST_ADYEN_PASS", "adyen-pass-"+randomHex(4))
	dsn := pgDSN(t)
	table := "pt_" + randomHex(6)
	t.Cleanup(func() { dropTable(dsn, table) })
	up := newPathUpstream(t)
	routes := protoRoutes(t)
	byPath := map[string]protoRoute{}
	for _, r := range routes {
		byPath[r.path] = r
	}
	tester := caddytest.NewTester(t)
	tester.InitServer(protoConfig(routes, dsn, table, up.Listener.Addr().String(), ""), "caddyfile")
	require.False(t, t.Failed(), "caddy config did not load")

	// deliver signs an event (a fresh one when id is ""), sends it, and
	// returns the event ID.
	deliver := func(t *testing.T, r protoRoute, secret, id string) (string, int, http.Header, string) {
		t.Helper()
		d, err := cli.BuildDelivery(cli.SignParams{Provider: r.provider, Secret: secret, URL: r.url, EventIDFrom: r.idFrom, EventID: id})
		require.NoError(t, err)
		st, h, body := doReq(t, http.MethodPost, r.path, d.Body, d.Header)
		return d.EventID, st, h, body
	}
	// requireDelivers: a fresh event is forwarded once with its bytes, and
	// the same event signed again is answered at the edge.
	requireDelivers := func(t *testing.T, r protoRoute, secret string) {
		t.Helper()
		before := len(up.got(r.path))
		id, st, h, body := deliver(t, r, secret, "")
		require.Equal(t, http.StatusOK, st, "delivery refused: %s", body)
		require.Equal(t, "yes", h.Get("X-Upstream"))
		require.Len(t, up.got(r.path), before+1)
		_, st, h, body = deliver(t, r, secret, id)
		require.Equal(t, http.StatusOK, st, body)
		require.Equal(t, "true", h.Get("Idempotent-Replayed"), "the redelivery is answered at the edge")
		require.Len(t, up.got(r.path), before+1)
	}
	// requireAnswered: the handshake got the edge's answer and nothing
	// reached the upstream.
	requireAnswered := func(t *testing.T, path string, st int, h http.Header, body string, wantCT, wantBody string) {
		t.Helper()
		require.Equal(t, http.StatusOK, st, body)
		require.Empty(t, h.Get("X-Upstream"), "answered at the edge")
		require.Empty(t, h.Get("Idempotent-Replayed"))
		require.Equal(t, wantCT, h.Get("Content-Type"))
		require.Equal(t, wantBody, body)
		require.Empty(t, up.got(path), "a handshake never reaches the upstream")
	}
	signed := func(t *testing.T, r protoRoute, body []byte, id string, header http.Header) ([]byte, http.Header) {
		t.Helper()
		from := r.idFrom
		if id == "" {
			from = ""
		}
		d, err := cli.BuildDelivery(cli.SignParams{Provider: r.provider, Secret: r.signing, URL: r.url, Body: body, Headers: header, EventIDFrom: from, EventID: id})
		require.NoError(t, err)
		return d.Body, d.Header
	}

	t.Run("meta hub.challenge with the verify token", func(t *testing.T) {
		r := byPath["/p/meta"]
		q := "?hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token="
		st, _, body := doReq(t, http.MethodGet, r.path+q+"meta-verify-wrong", nil, nil)
		require.Equal(t, http.StatusBadRequest, st)
		require.JSONEq(t, `{"error":"verify token does not match"}`, body)
		st, _, _ = doReq(t, http.MethodGet, r.path+"?hub.mode=subscribe&hub.challenge=1158201444", nil, nil)
		require.Equal(t, http.StatusBadRequest, st, "no token")
		for _, token := range []string{os.Getenv("WI_TEST_META_VERIFY"), "old-verify-token"} {
			st, h, body := doReq(t, http.MethodGet, r.path+q+token, nil, nil)
			requireAnswered(t, r.path, st, h, body, "text/plain; charset=utf-8", "1158201444")
		}
		requireDelivers(t, r, r.signing)
	})

	t.Run("msgraph validationToken", func(t *testing.T) {
		r := byPath["/p/msgraph"]
		st, h, body := doReq(t, http.MethodPost, r.path+"?validationToken=Validation%3A+Testing+client+application+reachability", nil, nil)
		requireAnswered(t, r.path, st, h, body, "text/plain; charset=utf-8", "Validation: Testing client application reachability")
		requireDelivers(t, r, r.signing)
	})

	// SharePoint list webhooks and OneDrive validate with a lower-case
	// ?validationtoken=; Graph with validationToken.
	t.Run("msgraph lower-case validationtoken", func(t *testing.T) {
		r := byPath["/p/msgraph"]
		before := len(up.got(r.path))
		st, h, body := doReq(t, http.MethodPost, r.path+"?validationtoken=sp-token-1", nil, nil)
		require.Equal(t, http.StatusOK, st, body)
		require.Empty(t, h.Get("X-Upstream"), "answered at the edge")
		require.Equal(t, "text/plain; charset=utf-8", h.Get("Content-Type"))
		require.Equal(t, "sp-token-1", body)
		require.Len(t, up.got(r.path), before, "a handshake never reaches the upstream")
	})

	// SharePoint puts a UTF-8 byte order mark before the JSON: the ID and
	// clientState are read past it, and the upstream gets the exact bytes.
	t.Run("msgraph body with a UTF-8 BOM", func(t *testing.T) {
		r := byPath["/p/msgraph"]
		d, err := cli.BuildDelivery(cli.SignParams{Provider: r.provider, Secret: r.signing, URL: r.url, EventIDFrom: r.idFrom})
		require.NoError(t, err)
		bom := append([]byte("\xEF\xBB\xBF"), d.Body...)
		before := len(up.got(r.path))
		st, h, body := doReq(t, http.MethodPost, r.path, bom, d.Header)
		require.Equal(t, http.StatusOK, st, "delivery refused: %s", body)
		require.Equal(t, "yes", h.Get("X-Upstream"))
		got := up.got(r.path)
		require.Len(t, got, before+1)
		require.Equal(t, bom, got[len(got)-1].body, "the exact bytes, BOM included")
		st, h, body = doReq(t, http.MethodPost, r.path, bom, d.Header)
		require.Equal(t, http.StatusOK, st, body)
		require.Equal(t, "true", h.Get("Idempotent-Replayed"))
		require.Len(t, up.got(r.path), before+1)
	})

	t.Run("trello HEAD probe", func(t *testing.T) {
		r := byPath["/p/trello"]
		st, h, _ := doReq(t, http.MethodHead, r.path, nil, nil)
		require.Equal(t, http.StatusOK, st)
		require.Empty(t, h.Get("X-Upstream"))
		require.Empty(t, up.got(r.path))
		requireDelivers(t, r, r.signing)
	})

	t.Run("okta verification GET", func(t *testing.T) {
		r := byPath["/p/okta"]
		st, h, body := doReq(t, http.MethodGet, r.path, nil, http.Header{"X-Okta-Verification-Challenge": {"pCQfxWhFKvdm2E3p7Ue6"}})
		requireAnswered(t, r.path, st, h, body, "application/json", `{"verification":"pCQfxWhFKvdm2E3p7Ue6"}`)
		requireDelivers(t, r, r.signing)
	})

	t.Run("dropbox challenge with nosniff", func(t *testing.T) {
		r := byPath["/p/dropbox"]
		st, h, body := doReq(t, http.MethodGet, r.path+"?challenge=GbAx8LrOUVm0", nil, nil)
		requireAnswered(t, r.path, st, h, body, "text/plain; charset=utf-8", "GbAx8LrOUVm0")
		require.Equal(t, "nosniff", h.Get("X-Content-Type-Options"))
		requireDelivers(t, r, r.signing)
	})

	t.Run("twitch webhook_callback_verification, signed", func(t *testing.T) {
		r := byPath["/p/twitch"]
		hs := []byte(`{"challenge":"pogchamp-kappa-360noscope-vohiyo","subscription":{"id":"f1c2a387","status":"webhook_callback_verification_pending"}}`)
		b, h := signed(t, r, hs, "hs-"+randomHex(4), http.Header{"Twitch-Eventsub-Message-Type": {"webhook_callback_verification"}})
		st, rh, body := doReq(t, http.MethodPost, r.path, b, h)
		requireAnswered(t, r.path, st, rh, body, "text/plain; charset=utf-8", "pogchamp-kappa-360noscope-vohiyo")
		// The same challenge again is answered again (never deduplicated).
		st, rh, body = doReq(t, http.MethodPost, r.path, b, h)
		requireAnswered(t, r.path, st, rh, body, "text/plain; charset=utf-8", "pogchamp-kappa-360noscope-vohiyo")
		// Unsigned: refused, never answered (no signing oracle).
		h.Set("Twitch-Eventsub-Message-Signature", "sha256="+strings.Repeat("0", 64))
		st, _, body = doReq(t, http.MethodPost, r.path, b, h)
		require.Equal(t, http.StatusBadRequest, st)
		require.Contains(t, body, "no matching signature")
		requireDelivers(t, r, r.signing)
	})

	t.Run("slack url_verification", func(t *testing.T) {
		r := byPath["/p/slack"]
		b, h := signed(t, r, []byte(`{"token":"t","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}`), "", nil)
		st, rh, body := doReq(t, http.MethodPost, r.path, b, h)
		requireAnswered(t, r.path, st, rh, body, "application/json", `{"challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}`)
		requireDelivers(t, r, r.signing)
	})

	t.Run("zoom endpoint.url_validation", func(t *testing.T) {
		r := byPath["/p/zoom"]
		b, h := signed(t, r, []byte(`{"event":"endpoint.url_validation","payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1654503849680}`), "", nil)
		st, rh, body := doReq(t, http.MethodPost, r.path, b, h)
		m := hmac.New(sha256.New, []byte(r.signing))
		m.Write([]byte("qgg8vlvZRS6UYooatFL8Aw"))
		requireAnswered(t, r.path, st, rh, body, "application/json",
			`{"encryptedToken":"`+hex.EncodeToString(m.Sum(nil))+`","plainToken":"qgg8vlvZRS6UYooatFL8Aw"}`)
		requireDelivers(t, r, r.signing)
	})

	t.Run("discord PING", func(t *testing.T) {
		r := byPath["/p/discord"]
		b, h := signed(t, r, []byte(`{"type":1,"id":"ping-1","application_id":"1"}`), "", nil)
		st, rh, body := doReq(t, http.MethodPost, r.path, b, h)
		requireAnswered(t, r.path, st, rh, body, "application/json", `{"type":1}`)
		requireDelivers(t, r, r.signing)
	})

	t.Run("xero intent to receive", func(t *testing.T) {
		r := byPath["/p/xero"]
		b, h := signed(t, r, []byte(`{"events":[],"firstEventSequence":0,"lastEventSequence":0,"entropy":"S0m3r4Nd0mt3xt"}`), "", nil)
		st, rh, _ := doReq(t, http.MethodPost, r.path, b, h)
		require.Equal(t, http.StatusOK, st)
		require.Empty(t, rh.Get("X-Upstream"))
		require.Empty(t, up.got(r.path))
		// Xero validates the endpoint with incorrectly signed payloads
		// too, and requires 401 Unauthorized for them.
		h.Set("x-xero-signature", "bm90IHRoZSBzaWduYXR1cmU=")
		st, _, _ = doReq(t, http.MethodPost, r.path, b, h)
		require.Equal(t, http.StatusUnauthorized, st)
		require.Empty(t, up.got(r.path))
		requireDelivers(t, r, r.signing)
	})

	for _, p := range []string{"mailgun", "linear", "woocommerce", "gitea", "mollie", "recurly", "revolut", "airwallex",
		"authorizenet", "flutterwave", "xendit", "chargebee", "midtrans", "mercadopago", "rapyd"} {
		t.Run(p+" delivers", func(t *testing.T) {
			r := byPath["/p/"+p]
			requireDelivers(t, r, r.signing)
		})
	}

	for _, p := range presetsB {
		t.Run(p+" delivers", func(t *testing.T) {
			r := byPath["/p/"+p]
			requireDelivers(t, r, r.signing)
			// A delivery signed with another secret is refused with the
			// preset's refusal status and never reaches the upstream.
			before := len(up.got(r.path))
			_, st, _, body := deliver(t, r, cliSigningSecret(t, p), "")
			preset, _ := signature.Lookup(p)
			require.Equal(t, preset.RefuseStatus, st, body)
			require.Len(t, up.got(r.path), before)
		})
	}

	// formDelivers: a form delivery (the ID in a form field) is forwarded
	// once with its bytes; the same event again is answered at the edge.
	formDelivers := func(t *testing.T, r protoRoute, form url.Values, id string) {
		t.Helper()
		_, field, _ := strings.Cut(r.idFrom, " ")
		form.Set(field, id)
		sp := cli.SignParams{Provider: r.provider, Secret: r.signing, URL: r.url, Body: []byte(form.Encode()),
			ContentType: "application/x-www-form-urlencoded", EventIDFrom: r.idFrom, EventID: id}
		d, err := cli.BuildDelivery(sp)
		require.NoError(t, err)
		st, h, body := doReq(t, http.MethodPost, r.path, d.Body, d.Header)
		require.Equal(t, http.StatusOK, st, "delivery refused: %s", body)
		require.Equal(t, "yes", h.Get("X-Upstream"))
		got := up.got(r.path)
		require.Equal(t, d.Body, got[len(got)-1].body, "forwarded byte for byte")
		d, err = cli.BuildDelivery(sp) // signed again (Plivo: a new nonce)
		require.NoError(t, err)
		st, h, body = doReq(t, http.MethodPost, r.path, d.Body, d.Header)
		require.Equal(t, http.StatusOK, st, body)
		require.Equal(t, "true", h.Get("Idempotent-Replayed"), "the redelivery is answered at the edge")
		require.Len(t, up.got(r.path), len(got))
		// The same form with a changed field fails the signature.
		tampered := bytes.Replace(d.Body, []byte("inbound"), []byte("outbound"), 1)
		tampered = bytes.Replace(tampered, []byte("send"), []byte("open"), 1)
		st, _, body = doReq(t, http.MethodPost, r.path, tampered, d.Header)
		require.Equal(t, http.StatusBadRequest, st, body)
		require.Len(t, up.got(r.path), len(got))
	}

	t.Run("plivo form delivers", func(t *testing.T) {
		r := byPath["/p/plivo"]
		form := url.Values{"Direction": {"inbound"}, "From": {"15550000001"}, "To": {"15550000002"}, "Event": {"StartApp"}}
		formDelivers(t, r, form, "call-"+randomHex(6))
	})

	t.Run("mandrill form delivers", func(t *testing.T) {
		r := byPath["/p/mandrill"]
		formDelivers(t, r, url.Values{}, `[{"event":"send","_id":"`+randomHex(8)+`","ts":1764547200}]`)
	})

	asanaSecret := "asana-hook-secret-" + randomHex(8)
	t.Run("asana X-Hook-Secret learned, heartbeat, deliveries", func(t *testing.T) {
		r := byPath["/p/asana"]
		// Before the handshake nothing verifies.
		_, st, _, body := deliver(t, r, asanaSecret, "")
		require.Equal(t, http.StatusBadRequest, st, body)
		st, h, body := doReq(t, http.MethodPost, r.path, nil, http.Header{"X-Hook-Secret": {asanaSecret}})
		require.Equal(t, http.StatusOK, st, body)
		require.Equal(t, asanaSecret, h.Get("X-Hook-Secret"), "the secret is echoed")
		require.Empty(t, h.Get("X-Upstream"))
		require.Empty(t, body)
		requireDelivers(t, r, asanaSecret)
		// A heartbeat: signed with the learned secret, empty events.
		d, err := cli.BuildDelivery(cli.SignParams{Provider: "asana", Secret: asanaSecret, Body: []byte(`{"events":[]}`)})
		require.NoError(t, err)
		before := len(up.got(r.path))
		st, h, _ = doReq(t, http.MethodPost, r.path, d.Body, d.Header)
		require.Equal(t, http.StatusOK, st)
		require.Empty(t, h.Get("X-Upstream"))
		require.Len(t, up.got(r.path), before)
		// A second handshake with another secret is refused (learning the
		// first closed the enrollment window) and the first secret stays in
		// use.
		st, h, body = doReq(t, http.MethodPost, r.path, nil, http.Header{"X-Hook-Secret": {"forged-" + randomHex(4)}})
		require.Equal(t, http.StatusBadRequest, st)
		require.Empty(t, h.Get("X-Hook-Secret"))
		require.Contains(t, body, "no enrollment window is open")
		requireDelivers(t, r, asanaSecret)
	})

	t.Run("notion verification_token learned", func(t *testing.T) {
		r := byPath["/p/notion"]
		token := "secret_" + randomHex(16)
		st, h, body := doReq(t, http.MethodPost, r.path, []byte(`{"verification_token":"`+token+`"}`), http.Header{"Content-Type": {"application/json"}})
		require.Equal(t, http.StatusOK, st, body)
		require.Empty(t, h.Get("X-Upstream"))
		require.Empty(t, up.got(r.path))
		requireDelivers(t, r, token)
	})

	sendgrid := func(t *testing.T, r protoRoute, ids ...string) (int, http.Header, string) {
		t.Helper()
		items := make([]string, len(ids))
		for i, id := range ids {
			items[i] = fmt.Sprintf(`{"email":"a@example.test","event":"delivered","sg_event_id":%q,"timestamp":1700000000}`, id)
		}
		body := []byte("[" + strings.Join(items, ",") + "]")
		h := http.Header{"Content-Type": {"application/json"}}
		body, err := signature.SignDelivery("sendgrid", signature.Options{Secrets: []string{r.signing}}, body, h, time.Now())
		require.NoError(t, err)
		return doReq(t, http.MethodPost, r.path, body, h)
	}

	t.Run("sendgrid batch set", func(t *testing.T) {
		r := byPath["/p/sendgrid-set"]
		e1, e2, e3 := "sg1."+randomHex(4), "sg2."+randomHex(4), "sg3."+randomHex(4)
		st, h, _ := sendgrid(t, r, e1, e2)
		require.Equal(t, http.StatusOK, st)
		require.Equal(t, "yes", h.Get("X-Upstream"))
		st, h, _ = sendgrid(t, r, e2, e1) // the same set, reordered
		require.Equal(t, http.StatusOK, st)
		require.Equal(t, "true", h.Get("Idempotent-Replayed"))
		st, h, _ = sendgrid(t, r, e1, e2, e3) // re-batched with a new item
		require.Equal(t, http.StatusOK, st)
		require.Equal(t, "yes", h.Get("X-Upstream"), "a new set is forwarded whole")
		got := up.got(r.path)
		require.Len(t, got, 2)
		require.Contains(t, string(got[1].body), e1, "under set the upstream sees e1 and e2 twice")
		require.Contains(t, string(got[1].body), e3)
		// The signature headers reach the upstream: it can verify the body.
		require.NotEmpty(t, got[1].header.Get("X-Twilio-Email-Event-Webhook-Signature"))
	})

	t.Run("sendgrid batch split", func(t *testing.T) {
		r := byPath["/p/sendgrid-split"]
		e1, e2, e3 := "sg1."+randomHex(4), "sg2."+randomHex(4), "sg3."+randomHex(4)
		st, h, body := sendgrid(t, r, e1, e2)
		require.Equal(t, http.StatusOK, st, body)
		require.JSONEq(t, `{"received":true,"items":2,"forwarded":2,"duplicates":0}`, body)
		require.Empty(t, h.Get("X-Upstream"), "the gateway answers for the items")
		got := up.got(r.path)
		require.Len(t, got, 2)
		require.Contains(t, string(got[0].body), e1)
		require.NotContains(t, string(got[0].body), e2)
		require.True(t, strings.HasPrefix(string(got[0].body), "[{") && strings.HasSuffix(string(got[0].body), "}]"), "one-item array")
		require.Equal(t, "1/2", got[0].header.Get("Webhook-Batch-Item"))
		st, h, _ = sendgrid(t, r, e1, e2)
		require.Equal(t, http.StatusOK, st)
		require.Equal(t, "true", h.Get("Idempotent-Replayed"))
		st, _, body = sendgrid(t, r, e1, e2, e3)
		require.Equal(t, http.StatusOK, st, body)
		require.JSONEq(t, `{"received":true,"items":3,"forwarded":1,"duplicates":2}`, body)
		got = up.got(r.path)
		require.Len(t, got, 3, "only e3 is forwarded the second time")
		require.Contains(t, string(got[2].body), e3)
		require.NotContains(t, string(got[2].body), e1)

		// An item the upstream refuses: non-2xx so the provider retries;
		// the retry forwards only that item.
		e4, e5 := "sg4."+randomHex(4), "sg5fail."+randomHex(4)
		up.fail.Store("sg5fail")
		st, _, body = sendgrid(t, r, e4, e5)
		require.Equal(t, http.StatusBadGateway, st, body)
		require.Contains(t, body, "1 of 2 items not completed")
		require.Len(t, up.got(r.path), 5)
		up.fail.Store("")
		st, _, body = sendgrid(t, r, e4, e5)
		require.Equal(t, http.StatusOK, st, body)
		require.JSONEq(t, `{"received":true,"items":2,"forwarded":1,"duplicates":1}`, body)
		got = up.got(r.path)
		require.Len(t, got, 6)
		require.Contains(t, string(got[5].body), e5)
	})

	t.Run("gocardless batch split", func(t *testing.T) {
		r := byPath["/p/gocardless-split"]
		body := []byte(`{"events":[{"id":"EV1` + randomHex(3) + `","action":"paid"},{"id":"EV2` + randomHex(3) + `","action":"paid"}],"meta":{"webhook_id":"WB1"}}`)
		h := http.Header{"Content-Type": {"application/json"}}
		body, err := signature.SignDelivery("gocardless", signature.Options{Secrets: []string{r.signing}}, body, h, time.Now())
		require.NoError(t, err)
		st, _, resp := doReq(t, http.MethodPost, r.path, body, h)
		require.Equal(t, http.StatusOK, st, resp)
		got := up.got(r.path)
		require.Len(t, got, 2)
		require.Contains(t, string(got[1].body), `"meta":{"webhook_id":"WB1"}`, "the rest of the delivery is kept")
		st, rh, _ := doReq(t, http.MethodPost, r.path, body, h)
		require.Equal(t, http.StatusOK, st)
		require.Equal(t, "true", rh.Get("Idempotent-Replayed"))
	})

	// Adyen signs each notification item; a real Adyen-shaped delivery of
	// two items, one with a tampered amount: the tampered item is refused
	// and never forwarded, the other is forwarded once, and "[accepted]"
	// comes only when every item is accepted. Adyen keeps a delivery that
	// was not accepted in its retry queue and resends it whole: the item
	// already completed is then a duplicate, and the other is forwarded.
	t.Run("adyen items verified one by one", func(t *testing.T) {
		r := byPath["/p/adyen"]
		psp1, psp2 := "79140733"+randomHex(4), "88254081"+randomHex(4)
		unsigned := []byte(`{"live":"false","notificationItems":[` +
			`{"NotificationRequestItem":{"additionalData":{"authCode":"58747"},"amount":{"currency":"EUR","value":1000},"eventCode":"AUTHORISATION","eventDate":"2025-12-01T00:00:00+01:00","merchantAccountCode":"TestMerchant","merchantReference":"order-1","paymentMethod":"visa","pspReference":"` + psp1 + `","reason":"","success":"true"}},` +
			`{"NotificationRequestItem":{"additionalData":{},"amount":{"currency":"EUR","value":2500},"eventCode":"AUTHORISATION","eventDate":"2025-12-01T00:00:01+01:00","merchantAccountCode":"TestMerchant","merchantReference":"order-2","paymentMethod":"mc","pspReference":"` + psp2 + `","reason":"","success":"true"}}]}`)
		h := http.Header{"Content-Type": {"application/json"}}
		genuine, err := signature.SignDelivery("adyen", signature.Options{Secrets: []string{r.signing}}, unsigned, h, time.Now())
		require.NoError(t, err)
		tampered := bytes.Replace(genuine, []byte(`"value":2500`), []byte(`"value":1`), 1)
		require.NotEqual(t, genuine, tampered)

		st, rh, body := doReq(t, http.MethodPost, r.path, tampered, h)
		require.Equal(t, http.StatusBadRequest, st, body)
		require.Contains(t, body, "1 of 2 items failed verification")
		require.NotEqual(t, "[accepted]", body)
		require.Empty(t, rh.Get("X-Upstream"))
		got := up.got(r.path)
		require.Len(t, got, 1, "only the authentic item is forwarded")
		require.Contains(t, string(got[0].body), psp1)
		require.NotContains(t, string(got[0].body), psp2)
		v, err := signature.New("adyen", signature.Options{Secrets: []string{r.signing}})
		require.NoError(t, err)
		require.NoError(t, v.Verify(got[0].body, nil), "the forwarded item keeps its own hmacSignature")

		// Adyen retries the delivery (still tampered by whoever sits in
		// the middle): refused again, nothing forwarded again.
		st, _, body = doReq(t, http.MethodPost, r.path, tampered, h)
		require.Equal(t, http.StatusBadRequest, st, body)
		require.Len(t, up.got(r.path), 1)

		// The genuine delivery: the second item is forwarded once, the
		// first is a duplicate, and Adyen gets [accepted].
		st, rh, body = doReq(t, http.MethodPost, r.path, genuine, h)
		require.Equal(t, http.StatusOK, st, body)
		require.Equal(t, "[accepted]", body)
		require.Empty(t, rh.Get("X-Upstream"))
		got = up.got(r.path)
		require.Len(t, got, 2)
		require.Contains(t, string(got[1].body), psp2)
		require.Contains(t, string(got[1].body), `"value":2500`)

		// Redelivered: answered at the edge, still [accepted].
		st, rh, body = doReq(t, http.MethodPost, r.path, genuine, h)
		require.Equal(t, http.StatusOK, st, body)
		require.Equal(t, "[accepted]", body)
		require.Equal(t, "true", rh.Get("Idempotent-Replayed"))
		require.Len(t, up.got(r.path), 2, "each item forwarded exactly once")
	})

	t.Run("adyen with Basic credentials", func(t *testing.T) {
		r := byPath["/p/adyen-basic"]
		body := []byte(`{"live":"false","notificationItems":[{"NotificationRequestItem":{"additionalData":{},"amount":{"currency":"EUR","value":700},"eventCode":"CAPTURE","merchantAccountCode":"TestMerchant","merchantReference":"order-3","originalReference":"8313842560770001","pspReference":"88254081` + randomHex(4) + `","success":"true"}}]}`)
		h := http.Header{"Content-Type": {"application/json"}}
		body, err := signature.SignDelivery("adyen", signature.Options{Secrets: []string{r.signing}}, body, h, time.Now())
		require.NoError(t, err)
		st, _, resp := doReq(t, http.MethodPost, r.path, body, h)
		require.Equal(t, http.StatusBadRequest, st, "no Authorization: %s", resp)
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("ws_adyen:"+os.Getenv("WI_TEST_ADYEN_PASS"))))
		st, _, resp = doReq(t, http.MethodPost, r.path, body, h)
		require.Equal(t, http.StatusOK, st, resp)
		require.Equal(t, "[accepted]", resp)
		require.Len(t, up.got(r.path), 1)
	})

	t.Run("fastspring batch set", func(t *testing.T) {
		r := byPath["/p/fastspring"]
		body := []byte(`{"events":[{"id":"fs1` + randomHex(4) + `","type":"order.completed","data":{"total":10.0}},{"id":"fs2` + randomHex(4) + `","type":"subscription.activated","data":{}}]}`)
		h := http.Header{"Content-Type": {"application/json"}}
		body, err := signature.SignDelivery("fastspring", signature.Options{Secrets: []string{r.signing}}, body, h, time.Now())
		require.NoError(t, err)
		st, rh, resp := doReq(t, http.MethodPost, r.path, body, h)
		require.Equal(t, http.StatusOK, st, resp)
		require.Equal(t, "yes", rh.Get("X-Upstream"), "batch set forwards the delivery whole")
		require.Len(t, up.got(r.path), 1)
		require.Equal(t, body, up.got(r.path)[0].body)
		st, rh, _ = doReq(t, http.MethodPost, r.path, body, h)
		require.Equal(t, http.StatusOK, st)
		require.Equal(t, "true", rh.Get("Idempotent-Replayed"))
		require.Len(t, up.got(r.path), 1)
	})

	t.Run("braintree bt_challenge and signed form", func(t *testing.T) {
		r := byPath["/p/braintree"]
		pub, priv, ok := strings.Cut(r.signing, ":")
		require.True(t, ok)
		challenge := randomHex(10)
		st, h, body := doReq(t, http.MethodGet, r.path+"?bt_challenge="+challenge, nil, nil)
		k := sha1.Sum([]byte(priv))
		m := hmac.New(sha1.New, k[:])
		m.Write([]byte(challenge))
		requireAnswered(t, r.path, st, h, body, "text/plain; charset=utf-8", pub+"|"+hex.EncodeToString(m.Sum(nil)))

		d, err := cli.BuildDelivery(cli.SignParams{Provider: "braintree", Secret: r.signing})
		require.NoError(t, err)
		require.Len(t, d.EventID, 64)
		st, h, body = doReq(t, http.MethodPost, r.path, d.Body, d.Header)
		require.Equal(t, http.StatusOK, st, body)
		require.Equal(t, "yes", h.Get("X-Upstream"))
		st, h, _ = doReq(t, http.MethodPost, r.path, d.Body, d.Header)
		require.Equal(t, http.StatusOK, st)
		require.Equal(t, "true", h.Get("Idempotent-Replayed"), "Braintree's retry is answered at the edge")
		require.Len(t, up.got(r.path), 1)
		forged := bytes.Replace(d.Body, []byte("bt_payload=e"), []byte("bt_payload=f"), 1)
		if !bytes.Equal(forged, d.Body) {
			st, _, body = doReq(t, http.MethodPost, r.path, forged, d.Header)
			require.Equal(t, http.StatusBadRequest, st, body)
		}
		require.Len(t, up.got(r.path), 1)
	})

	t.Run("hubspot batch set", func(t *testing.T) {
		r := byPath["/p/hubspot"]
		body := []byte(`[{"eventId":` + fmt.Sprint(time.Now().UnixNano()%1e9) + `,"subscriptionType":"contact.creation"}]`)
		h := http.Header{"Content-Type": {"application/json"}}
		body, err := signature.SignDelivery("hubspot", signature.Options{Secrets: []string{r.signing}, URL: r.url}, body, h, time.Now())
		require.NoError(t, err)
		st, rh, _ := doReq(t, http.MethodPost, r.path, body, h)
		require.Equal(t, http.StatusOK, st)
		require.Equal(t, "yes", rh.Get("X-Upstream"))
		st, rh, _ = doReq(t, http.MethodPost, r.path, body, h)
		require.Equal(t, http.StatusOK, st)
		require.Equal(t, "true", rh.Get("Idempotent-Replayed"))
	})

	t.Run("paypal, sns, pubsub, wise, plaid and appstore verified with the provider's keys", func(t *testing.T) {
		for _, p := range []string{"/p/paypal", "/p/sns", "/p/pubsub", "/p/wise", "/p/plaid", "/p/appstore"} {
			requireDelivers(t, byPath[p], byPath[p].signing)
		}
		// A signature PayPal's certificate does not verify is refused.
		r := byPath["/p/paypal"]
		d, err := cli.BuildDelivery(cli.SignParams{Provider: r.provider, Secret: r.signing})
		require.NoError(t, err)
		d.Header.Set("Paypal-Transmission-Sig", strings.Repeat("QUJD", 86)+"QQ==")
		before := len(up.got(r.path))
		st, _, body := doReq(t, http.MethodPost, r.path, d.Body, d.Header)
		require.Equal(t, http.StatusBadRequest, st, body)
		require.JSONEq(t, `{"error":"no matching signature"}`, body)
		// A certificate URL off PayPal's hosts is refused before any fetch.
		d, err = cli.BuildDelivery(cli.SignParams{Provider: r.provider, Secret: r.signing})
		require.NoError(t, err)
		evil := "https://api.paypal.com.evil.example/v1/notifications/certs/CERT-1"
		d.Header.Set("Paypal-Cert-Url", evil)
		st, _, body = doReq(t, http.MethodPost, r.path, d.Body, d.Header)
		require.Equal(t, http.StatusBadRequest, st, body)
		require.JSONEq(t, `{"error":"malformed signature header"}`, body)
		require.Zero(t, keys.Hits(evil))
		require.Len(t, up.got(r.path), before)
	})

	t.Run("sns subscription messages are handshakes: verified, forwarded, never claimed", func(t *testing.T) {
		r := byPath["/p/sns"]
		for _, typ := range []string{"SubscriptionConfirmation", "UnsubscribeConfirmation"} {
			msg := `{"Type":"` + typ + `","MessageId":"` + randomHex(8) + `","Token":"2336412f37fb687f5d51e6e2425","TopicArn":"arn:aws:sns:us-east-1:123456789012:orders",` +
				`"Message":"You have chosen to subscribe to the topic.","SubscribeURL":"https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&Token=2336412f37fb687f5d51e6e2425",` +
				`"Timestamp":"2025-12-01T00:00:00.000Z"}`
			body, err := signature.SignDelivery("sns", signature.Options{Secrets: []string{r.signing}}, []byte(msg), http.Header{}, time.Now())
			require.NoError(t, err)
			h := http.Header{"Content-Type": {"text/plain; charset=UTF-8"}, "X-Amz-Sns-Message-Type": {typ}}
			before := len(up.got(r.path))
			for range 2 {
				st, rh, rb := doReq(t, http.MethodPost, r.path, body, h)
				require.Equal(t, http.StatusOK, st, rb)
				require.Equal(t, "yes", rh.Get("X-Upstream"), "the upstream confirms")
				require.Empty(t, rh.Get("Idempotent-Replayed"), "never claimed")
			}
			require.Len(t, up.got(r.path), before+2)
			require.Equal(t, body, up.got(r.path)[before].body)
			tampered := bytes.Replace(body, []byte("2336412f37fb687f5d51e6e2425"), []byte("2336412f37fb687f5d51e6e2426"), 1)
			st, _, rb := doReq(t, http.MethodPost, r.path, tampered, h)
			require.Equal(t, http.StatusBadRequest, st, rb)
			require.Len(t, up.got(r.path), before+2)
		}
	})

	t.Run("a provider key that cannot be fetched: 503, nothing recorded, the retry delivers", func(t *testing.T) {
		for _, p := range []string{"/p/paypal", "/p/sns", "/p/pubsub", "/p/plaid"} {
			r := byPath[p]
			d, err := cli.BuildDelivery(cli.SignParams{Provider: r.provider, Secret: r.signing, URL: r.url, EventIDFrom: r.idFrom})
			require.NoError(t, err)
			keyURL := d.Header.Get("Paypal-Cert-Url")
			switch r.provider {
			case "sns":
				keyURL = gjson.GetBytes(d.Body, "SigningCertURL").Str
			case "pubsub":
				keyURL = "https://www.googleapis.com/oauth2/v3/certs"
			case "plaid":
				keyURL = "https://sandbox.plaid.com/webhook_verification_key/get"
			}
			require.NotEmpty(t, keyURL)
			keys.SetFailing(keyURL, true)
			before := len(up.got(p))
			st, rh, body := doReq(t, http.MethodPost, p, d.Body, d.Header)
			keys.SetFailing(keyURL, false)
			require.Equal(t, http.StatusServiceUnavailable, st, body)
			require.JSONEq(t, `{"error":"provider key unavailable"}`, body)
			require.NotEmpty(t, rh.Get("Retry-After"))
			require.Len(t, up.got(p), before, "not forwarded")
			// Nothing was recorded: the provider's retry is forwarded once,
			// and its next retry is a duplicate.
			st, rh, body = doReq(t, http.MethodPost, p, d.Body, d.Header)
			require.Equal(t, http.StatusOK, st, body)
			require.Equal(t, "yes", rh.Get("X-Upstream"))
			st, rh, body = doReq(t, http.MethodPost, p, d.Body, d.Header)
			require.Equal(t, http.StatusOK, st, body)
			require.Equal(t, "true", rh.Get("Idempotent-Replayed"))
			require.Len(t, up.got(p), before+1)
		}
	})

	t.Run("asana's learned secret survives a config reload", func(t *testing.T) {
		// A new config (one field changed, so every handler is provisioned
		// anew, with an empty cache) verifies with the stored secret.
		tester.InitServer(protoConfig(routes, dsn, table, up.Listener.Addr().String(), "lease 31s"), "caddyfile")
		require.False(t, t.Failed(), "caddy config did not reload")
		requireDelivers(t, byPath["/p/asana"], asanaSecret)
	})

	t.Run("asana's learned secret is used by a second instance", func(t *testing.T) {
		// Another gateway instance: its own pool and cache on the same
		// database and table.
		first := &gateway{storage: Storage{Backend: "postgres", DSN: dsn, Table: table}}
		g := newGateway(t, "webhook_idempotency {\n provider asana\n event_id json id\n}", sharingStore(first), asInstance("second"))
		d, err := cli.BuildDelivery(cli.SignParams{Provider: "asana", Secret: asanaSecret, EventIDFrom: "json id"})
		require.NoError(t, err)
		req := httptest.NewRequest(http.MethodPost, "http://gateway.test/p/asana", bytes.NewReader(d.Body))
		req.Header = d.Header
		requireRelayed(t, g.serve(req))
		require.Equal(t, 1, g.up.count())
		// And a delivery signed with another secret is refused there too.
		d, err = cli.BuildDelivery(cli.SignParams{Provider: "asana", Secret: "not-the-learned-one", EventIDFrom: "json id"})
		require.NoError(t, err)
		req = httptest.NewRequest(http.MethodPost, "http://gateway.test/p/asana", bytes.NewReader(d.Body))
		req.Header = d.Header
		requireRefused(t, g.serve(req), http.StatusBadRequest, "no matching signature")
	})
}
