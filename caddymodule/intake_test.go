package caddymodule

import (
	"bytes"
	"compress/gzip"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// Tests of the intake (intake.go): the body as it arrived, signature
// verification per provider, event IDs and gzip bodies. Several are field
// cases, their origin noted on each.

// TestCase_BR01_BodyVerifiedAndForwardedByteForByte: the bytes verified are
// the bytes that arrived (no re-serialisation, no newline changes, no
// trimming) and the upstream gets exactly those bytes.
//
// Origin: field case BR-01 of the project's case list (formerly cases_test.go,
// where the field cases were grouped by report).
func TestCase_BR01_BodyVerifiedAndForwardedByteForByte(t *testing.T) {
	t.Parallel()
	const secret = "whsec_test_BR01"
	const id = "evt_BR01_0001"
	pretty := []byte("{\n  \"id\": \"evt_BR01_0001\",\n  \"object\": \"event\",\n  \"type\": \"payment_intent.succeeded\",\n  \"data\": {\n    \"object\": {\n      \"id\": \"pi_BR01\",\n      \"amount\": 1000\n    }\n  }\n}\n")
	g := newGateway(t, `webhook_idempotency {
		provider stripe
		secret whsec_test_BR01
	}`)
	sig := stripeHeader(secret, pretty, g.clock.Unix())
	deliver := func(body []byte) answer {
		return g.serve(newDelivery("http://gateway.test/webhooks/stripe", body,
			"Content-Type", "application/json", "Stripe-Signature", sig))
	}

	var compact bytes.Buffer
	require.NoError(t, json.Compact(&compact, pretty))
	var parsed map[string]any
	require.NoError(t, json.Unmarshal(pretty, &parsed))
	reserialised, err := json.Marshal(parsed) // JSON.stringify(JSON.parse(body))
	require.NoError(t, err)
	altered := map[string][]byte{
		"(b) LF turned into CRLF":         bytes.ReplaceAll(pretty, []byte("\n"), []byte("\r\n")),
		"(c) compacted":                   compact.Bytes(),
		"trailing newline trimmed":        bytes.TrimSuffix(pretty, []byte("\n")),
		"parsed and re-serialised":        reserialised,
		"leading whitespace added":        append([]byte(" "), pretty...),
		"same JSON, one value re-spelled": bytes.Replace(pretty, []byte(`1000`), []byte(`1000.0`), 1),
	}
	for name, body := range altered {
		require.NotEqual(t, pretty, body, name)
		a := deliver(body)
		requireRefused(t, a, http.StatusBadRequest, "no matching signature")
		require.Equal(t, 0, g.up.count(), name)
		g.requireNoRow("stripe", id)
	}

	// (a) as signed: forwarded once, byte for byte, trailing \n included.
	a := deliver(pretty)
	requireRelayed(t, a)
	require.Equal(t, 1, g.up.count())
	c := g.requireForwarded(0, pretty, "application/json")
	require.Equal(t, byte('\n'), c.Body[len(c.Body)-1])
	require.Equal(t, sig, c.Header.Get("Stripe-Signature"))
	e := g.requireRow("stripe", id, store.StateCompleted)
	require.Equal(t, 1, e.Attempts)

	// (b) again after (a): still refused, the row untouched.
	requireRefused(t, deliver(altered["(b) LF turned into CRLF"]), http.StatusBadRequest, "no matching signature")
	require.Equal(t, 1, g.requireRow("stripe", id, store.StateCompleted).Attempts)

	// (e) (a) with a fresh t: a duplicate, answered at the edge.
	g.clock.Advance(42 * time.Second)
	requireDuplicate(t, g.serve(g.stripe(secret, pretty, g.clock.Unix())))
	require.Equal(t, 1, g.up.count())

	// (d) generic route: the signed trailing CRLF is kept.
	gen := newGateway(t, `webhook_idempotency {
		provider hmac
		secret gen_BR01
		event_id header X-Event-Id
		hmac {
			header X-Signature
		}
	}`)
	body := []byte("[{\"event\":\"processed\",\"sg_event_id\":\"sgev_BR01\"}]\r\n")
	a = gen.serve(newDelivery("http://gateway.test/webhooks/generic", body,
		"Content-Type", "application/json",
		"X-Event-Id", "gen-BR01-d",
		"X-Signature", hexOf(mac256([]byte("gen_BR01"), body))))
	requireRelayed(t, a)
	c = gen.requireForwarded(0, body, "application/json")
	require.True(t, bytes.HasSuffix(c.Body, []byte("\r\n")))
	gen.requireRow("hmac", "gen-BR01-d", store.StateCompleted)
	// A signature over the trimmed body does not verify the body with CRLF.
	a = gen.serve(newDelivery("http://gateway.test/webhooks/generic", body,
		"Content-Type", "application/json",
		"X-Event-Id", "gen-BR01-d2",
		"X-Signature", hexOf(mac256([]byte("gen_BR01"), bytes.TrimSuffix(body, []byte("\r\n"))))))
	requireRefused(t, a, http.StatusBadRequest, "no matching signature")
	require.Equal(t, 1, gen.up.count())
	gen.requireNoRow("hmac", "gen-BR01-d2")
}

// TestCase_BR03_StripeSignatureParsing: every v1 and every secret is tried
// (rotation), ambiguous headers are refused, header names are
// case-insensitive (also on the wire, HTTP/1.1 and HTTP/2), and dedupe is on
// the event ID, never on the signature string.
//
// Origin: field case BR-03 of the project's case list (formerly cases_test.go,
// where the field cases were grouped by report).
func TestCase_BR03_StripeSignatureParsing(t *testing.T) {
	t.Parallel()
	const sOld, sNew = "whsec_old_BR03", "whsec_new_BR03"
	body := func(n string) []byte {
		return []byte(`{"id":"evt_BR03_` + n + `","object":"event","type":"invoice.paid"}`)
	}
	g := newGateway(t, `webhook_idempotency {
		provider stripe
		secret whsec_new_BR03
	}`)
	now := strconv.FormatInt(g.clock.Unix(), 10)
	stale := strconv.FormatInt(g.clock.Unix()-3600, 10)
	deliver := func(gw *gateway, b []byte, sigHeaders ...string) answer {
		h := []string{"Content-Type", "application/json"}
		for _, v := range sigHeaders {
			h = append(h, "Stripe-Signature", v)
		}
		return gw.serve(newDelivery("http://gateway.test/webhooks/stripe", b, h...))
	}

	// (a) old and new signature, gateway has only the new secret.
	b1 := body("1")
	a := deliver(g, b1, "t="+now+",v1="+stripeSig(sOld, b1, now)+",v1="+stripeSig(sNew, b1, now))
	requireRelayed(t, a)
	g.requireForwarded(0, b1, "application/json")
	// (b) the order reversed.
	b2 := body("2")
	requireRelayed(t, deliver(g, b2, "t="+now+",v1="+stripeSig(sNew, b2, now)+",v1="+stripeSig(sOld, b2, now)))
	require.Equal(t, 2, g.up.count())
	// (a) again with its signatures in the other order: a duplicate.
	requireDuplicate(t, deliver(g, b1, "t="+now+",v1="+stripeSig(sNew, b1, now)+",v1="+stripeSig(sOld, b1, now)))
	require.Equal(t, 2, g.up.count())

	// (c) gateway secrets [S_OLD, S_NEW], only the new signature: the first
	// secret failing does not end the loop.
	both := newGateway(t, `webhook_idempotency {
		provider stripe
		secret whsec_old_BR03
		secret whsec_new_BR03
	}`, withClock(g.clock))
	b3 := body("3")
	requireRelayed(t, deliver(both, b3, "t="+now+",v1="+stripeSig(sNew, b3, now)))
	both.requireRow("stripe", "evt_BR03_3", store.StateCompleted)

	// (d) only a v0 is valid: v0 is never read.
	b4 := body("4")
	a = deliver(g, b4, "t="+now+",v0="+stripeSig(sNew, b4, now)+",v1="+strings.Repeat("0", 64))
	requireRefused(t, a, http.StatusBadRequest, "no matching signature")
	g.requireNoRow("stripe", "evt_BR03_4")

	// (e) two t= fields, either order: ambiguous.
	b5 := body("5")
	for _, hdr := range []string{
		"t=" + now + ",t=" + stale + ",v1=" + stripeSig(sNew, b5, stale),
		"t=" + stale + ",t=" + now + ",v1=" + stripeSig(sNew, b5, stale),
		"t=" + now + ",t=" + now + ",v1=" + stripeSig(sNew, b5, now),
	} {
		requireRefused(t, deliver(g, b5, hdr), http.StatusBadRequest, "malformed signature header")
	}
	g.requireNoRow("stripe", "evt_BR03_5")

	// (f) two Stripe-Signature lines, one valid, one garbage, either order.
	b6 := body("6")
	valid := "t=" + now + ",v1=" + stripeSig(sNew, b6, now)
	requireRefused(t, deliver(g, b6, valid, "t=1,v1=garbage"), http.StatusBadRequest, "malformed signature header")
	requireRefused(t, deliver(g, b6, "t=1,v1=garbage", valid), http.StatusBadRequest, "malformed signature header")
	// A valid line and a lower-case line of the same header are two lines too.
	req := newDelivery("http://gateway.test/webhooks/stripe", b6, "Content-Type", "application/json", "Stripe-Signature", valid)
	req.Header["stripe-signature"] = []string{"t=1,v1=garbage"}
	requireRefused(t, g.serve(req), http.StatusBadRequest, "malformed signature header")
	g.requireNoRow("stripe", "evt_BR03_6")
	require.Equal(t, 2, g.up.count())

	// (g) header name in lower case: as a hand-built header map holds it,
	// and on the wire over HTTP/1.1 and HTTP/2.
	b7 := body("7")
	req = newDelivery("http://gateway.test/webhooks/stripe", b7, "Content-Type", "application/json")
	req.Header["stripe-signature"] = []string{"t=" + now + ",v1=" + stripeSig(sNew, b7, now)}
	requireRelayed(t, g.serve(req))
	require.Equal(t, 3, g.up.count())

	for _, proto := range []int{1, 2} {
		n := fmt.Sprintf("8_h%d", proto)
		b := body(n)
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := g.h.ServeHTTP(w, withReplacer(r), g.up); err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
			}
		}))
		if proto == 2 {
			srv.EnableHTTP2 = true
			srv.StartTLS()
		} else {
			srv.Start()
		}
		wire, err := http.NewRequest(http.MethodPost, srv.URL+"/webhooks/stripe", bytes.NewReader(b))
		require.NoError(t, err)
		wire.Header["content-type"] = []string{"application/json"}
		wire.Header["stripe-signature"] = []string{"t=" + now + ",v1=" + stripeSig(sNew, b, now)}
		resp, err := srv.Client().Do(wire)
		require.NoError(t, err)
		got, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		srv.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "HTTP/%d: %s", proto, got)
		require.Equal(t, "ok", string(got))
		require.Equal(t, proto, resp.ProtoMajor)
		c := g.up.call(t, g.up.count()-1)
		require.Equal(t, proto, c.Proto)
		require.Equal(t, b, c.Body)
		g.requireRow("stripe", "evt_BR03_"+n, store.StateCompleted)
	}
	require.Equal(t, 5, g.up.count())

	// (h) Paddle: ts=NOW;h1=<bad>;h1=<good>.
	paddle := newGateway(t, `webhook_idempotency {
		provider paddle
		secret pdl_ntfset_BR03
	}`, withClock(g.clock))
	pb := []byte(`{"event_id":"evt_BR03_paddle","event_type":"transaction.paid","data":{"id":"txn_BR03"}}`)
	good := hexOf(mac256([]byte("pdl_ntfset_BR03"), []byte(now+":"), pb))
	bad := hexOf(mac256([]byte("pdl_ntfset_other"), []byte(now+":"), pb))
	a = paddle.serve(newDelivery("http://gateway.test/webhooks/paddle", pb,
		"Content-Type", "application/json", "Paddle-Signature", "ts="+now+";h1="+bad+";h1="+good))
	requireRelayed(t, a)
	paddle.requireForwarded(0, pb, "application/json")
	paddle.requireRow("paddle", "evt_BR03_paddle", store.StateCompleted)
}

// TestCase_BR04_TimestampToleranceTwoSided: the window is checked in both
// directions, in seconds, and a refused attempt records nothing.
//
// Origin: field case BR-04 of the project's case list (formerly cases_test.go,
// where the field cases were grouped by report).
func TestCase_BR04_TimestampToleranceTwoSided(t *testing.T) {
	t.Parallel()
	const secret = "whsec_test_BR04"
	body := func(n int) []byte {
		return []byte(fmt.Sprintf(`{"id":"evt_BR04_%d","object":"event","type":"charge.refunded"}`, n))
	}
	id := func(n int) string { return fmt.Sprintf("evt_BR04_%d", n) }
	g := newGateway(t, `webhook_idempotency {
		provider stripe
		secret whsec_test_BR04
		tolerance 300s
	}`)
	now := g.clock.Unix()
	withT := func(n int, tsText string) answer {
		return g.serve(newDelivery("http://gateway.test/webhooks/stripe", body(n),
			"Content-Type", "application/json",
			"Stripe-Signature", "t="+tsText+",v1="+stripeSig(secret, body(n), tsText)))
	}
	ts := func(v int64) string { return strconv.FormatInt(v, 10) }

	// (a) NOW-299: accepted.
	requireRelayed(t, withT(1, ts(now-299)))
	require.Equal(t, 1, g.up.count())
	// Two-sided: NOW+299 is inside the window too.
	requireRelayed(t, withT(6, ts(now+299)))
	require.Equal(t, 2, g.up.count())

	// (b) NOW-301, (c) NOW+301, (d) NOW in milliseconds: refused, no row.
	for n, tsText := range map[int]string{2: ts(now - 301), 3: ts(now + 301), 4: ts(now * 1000)} {
		requireRefused(t, withT(n, tsText), http.StatusBadRequest, "timestamp outside tolerance")
		g.requireNoRow("stripe", id(n))
	}
	// (e) t=abc, and no t at all.
	requireRefused(t, withT(5, "abc"), http.StatusBadRequest, "malformed signature header")
	a := g.serve(newDelivery("http://gateway.test/webhooks/stripe", body(5),
		"Content-Type", "application/json", "Stripe-Signature", "v1="+stripeSig(secret, body(5), ts(now))))
	requireRefused(t, a, http.StatusBadRequest, "malformed signature header")
	g.requireNoRow("stripe", id(5))
	require.Equal(t, 2, g.up.count())

	// (f) the stale event, now retried fresh: forwarded, the stale attempt
	// poisoned nothing.
	requireRelayed(t, withT(2, ts(now)))
	require.Equal(t, 3, g.up.count())
	g.requireForwarded(2, body(2), "application/json")
	g.requireRow("stripe", id(2), store.StateCompleted)

	// (g) Standard Webhooks with webhook-timestamp NOW-301.
	sw := newGateway(t, `webhook_idempotency {
		provider standard
		secret whsec_QlI0NC10ZXN0LWtleS0wMTIzNDU2Nzg5YWJjZGVmISE=
	}`, withClock(g.clock))
	key := swKey(t, "whsec_QlI0NC10ZXN0LWtleS0wMTIzNDU2Nzg5YWJjZGVmISE=")
	swBody := []byte(`{"type":"user.created","data":{"id":"user_BR04"}}`)
	a = sw.serve(newDelivery("http://gateway.test/webhooks/standard", swBody,
		"Content-Type", "application/json",
		"webhook-id", "msg_BR04_g",
		"webhook-timestamp", ts(now-301),
		"webhook-signature", "v1,"+swSig(key, "msg_BR04_g", now-301, swBody)))
	requireRefused(t, a, http.StatusBadRequest, "timestamp outside tolerance")
	require.Equal(t, 0, sw.up.count())
	sw.requireNoRow("standard", "msg_BR04_g")
}

// TestCase_BR09_GitHubSHA1AndDowngrade: the legacy SHA-1 header counts only
// with allow_sha1 and only when X-Hub-Signature-256 is absent; the reason
// of a 400 tells "missing" from "mismatch", in the answer and in the log.
// Every variant has a route of its own: the body is the same in all of
// them, and dedupe_body (on for github) would answer a later one as a
// replay of an earlier one.
//
// Origin: field case BR-09 of the project's case list (formerly cases_test.go,
// where the field cases were grouped by report).
func TestCase_BR09_GitHubSHA1AndDowngrade(t *testing.T) {
	t.Parallel()
	const secret = "gh_BR09"
	body := []byte(`{"zen":"Keep it simple.","hook_id":9}`)
	gh256 := "sha256=" + hexOf(mac256([]byte(secret), body))
	gh1 := "sha1=" + hexOf(mac1([]byte(secret), body))
	wrong256 := "sha256=" + hexOf(mac256([]byte("gh_other"), body))
	garbage1 := "sha1=" + strings.Repeat("ab", 20)
	tests := []struct {
		name      string
		allowSHA1 bool
		headers   []string
		accepted  bool
		reason    string
	}{
		{"a both valid", false, []string{"X-Hub-Signature-256", gh256, "X-Hub-Signature", gh1}, true, ""},
		{"b valid sha256, garbage sha1", false, []string{"X-Hub-Signature-256", gh256, "X-Hub-Signature", garbage1}, true, ""},
		{"c bad sha256, valid sha1", false, []string{"X-Hub-Signature-256", wrong256, "X-Hub-Signature", gh1}, false, "no matching signature"},
		{"c bad sha256, valid sha1, allow_sha1", true, []string{"X-Hub-Signature-256", wrong256, "X-Hub-Signature", gh1}, false, "no matching signature"},
		{"c garbage sha256, valid sha1, allow_sha1", true, []string{"X-Hub-Signature-256", "sha256=zz", "X-Hub-Signature", gh1}, false, "malformed signature header"},
		{"d only sha1", false, []string{"X-Hub-Signature", gh1}, false, "missing signature header"},
		{"e only sha1, allow_sha1", true, []string{"X-Hub-Signature", gh1}, true, ""},
		{"e only bad sha1, allow_sha1", true, []string{"X-Hub-Signature", garbage1}, false, "no matching signature"},
		{"f no signature", false, nil, false, "missing signature header"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := "webhook_idempotency {\n provider github\n secret gh_BR09\n"
			if tc.allowSHA1 {
				cfg += " allow_sha1\n"
			}
			g := newGateway(t, cfg+"}")
			guid := fmt.Sprintf("a0b0c0d0-0000-4000-8000-0000000009%02d", i)
			h := append([]string{"Content-Type", "application/json", "X-GitHub-Event", "ping", "X-GitHub-Delivery", guid}, tc.headers...)
			a := g.serve(newDelivery("http://gateway.test/webhooks/github", body, h...))
			if tc.accepted {
				requireRelayed(t, a)
				require.Equal(t, 1, g.up.count())
				g.requireForwarded(0, body, "application/json")
				g.requireRow("github", guid, store.StateCompleted)
				return
			}
			requireRefused(t, a, http.StatusBadRequest, tc.reason)
			require.Equal(t, 0, g.up.count())
			require.Empty(t, g.rows(), "no row, neither the ID's nor the body's")
			log := g.deliveryLog()
			require.Len(t, log, 1)
			require.Equal(t, outcomeInvalidSignature, log[0]["outcome"])
			require.Contains(t, log[0]["reason"], tc.reason, "the log line names the reason")
		})
	}
}

// TestCase_BR11_Shopify: base64 HMAC, re-sends, and the key: Event-Id (one
// per event, shared by subscriptions) before Webhook-Id (per delivery).
//
// Origin: field case BR-11 of the project's case list (formerly cases_test.go,
// where the field cases were grouped by report).
func TestCase_BR11_Shopify(t *testing.T) {
	t.Parallel()
	const secret = "shpss_BR11"
	body := []byte(`{"id":820982911946154508,"email":"buyer@example.invalid","total_price":"10.00"}`)
	sig := b64Of(mac256([]byte(secret), body))
	deliver := func(g *gateway, webhookID, eventID, signature string) answer {
		h := []string{
			"Content-Type", "application/json",
			"X-Shopify-Topic", "orders/paid",
			"X-Shopify-Shop-Domain", "example.myshopify.com",
			"X-Shopify-Hmac-Sha256", signature,
			"X-Shopify-Webhook-Id", webhookID,
		}
		if eventID != "" {
			h = append(h, "X-Shopify-Event-Id", eventID)
		}
		return g.serve(newDelivery("http://gateway.test/webhooks/shopify", body, h...))
	}
	const b1, b2, b3 = "7a6b5c4d-0000-4000-8000-0000000000b1", "7a6b5c4d-0000-4000-8000-0000000000b2", "7a6b5c4d-0000-4000-8000-0000000000b3"
	const e1 = "9f8e7d6c-0000-4000-8000-0000000000e1"

	g := newGateway(t, `webhook_idempotency {
		provider shopify
		secret shpss_BR11
	}`)
	// (a) forwarded once.
	requireRelayed(t, deliver(g, b1, e1, sig))
	g.requireForwarded(0, body, "application/json")
	g.requireRow("shopify", e1, store.StateCompleted)
	g.requireNoRow("shopify", b1)
	// (b) the identical request 60 s later.
	g.clock.Advance(60 * time.Second)
	requireDuplicate(t, deliver(g, b1, e1, sig))
	// (c) second subscription: same Event-Id, another Webhook-Id.
	requireDuplicate(t, deliver(g, b2, e1, sig))
	// (d) fresh Webhook-Id, signature as hex instead of base64.
	hexSig := hexOf(mac256([]byte(secret), body))
	requireRefused(t, deliver(g, b3, e1, hexSig), http.StatusBadRequest, "malformed signature header")
	require.Equal(t, 1, g.up.count())
	g.requireNoRow("shopify", b3)

	// Without X-Shopify-Event-Id the key is X-Shopify-Webhook-Id.
	other := newGateway(t, `webhook_idempotency {
		provider shopify
		secret shpss_BR11
	}`)
	requireRelayed(t, deliver(other, b1, "", sig))
	other.requireRow("shopify", b1, store.StateCompleted)

	// A route that chooses the per-delivery key explicitly (one
	// subscription per upstream), without body dedupe: (c) is then a new
	// delivery and forwarded. The choice is the route's, written down.
	perDelivery := newGateway(t, `webhook_idempotency {
		provider shopify
		secret shpss_BR11
		event_id header X-Shopify-Webhook-Id
		dedupe_body off
	}`)
	requireRelayed(t, deliver(perDelivery, b1, e1, sig))
	requireDuplicate(t, deliver(perDelivery, b1, e1, sig))
	requireRelayed(t, deliver(perDelivery, b2, e1, sig))
	require.Equal(t, 2, perDelivery.up.count())
}

// TestCase_BR12_StandardWebhooks: whsec_ keys are base64-decoded, every v1
// in the list is tried and v1a skipped, a header with nothing verifiable
// fails closed, svix-* names are aliases, webhook-id is signed.
//
// Origin: field case BR-12 of the project's case list (formerly cases_test.go,
// where the field cases were grouped by report).
func TestCase_BR12_StandardWebhooks(t *testing.T) {
	t.Parallel()
	rawKey := []byte("BR12-test-key-0123456789abcdef!!")
	secret := "whsec_" + b64Of(rawKey)
	body := []byte(`{"type":"user.created","data":{"id":"user_BR12"}}`)
	g := newGateway(t, `webhook_idempotency {
		provider standard
		secret `+secret+`
	}`)
	now := g.clock.Unix()
	ts := strconv.FormatInt(now, 10)
	deliver := func(prefix, id, signature string) answer {
		return g.serve(newDelivery("http://gateway.test/webhooks/standard", body,
			"Content-Type", "application/json",
			prefix+"-id", id, prefix+"-timestamp", ts, prefix+"-signature", signature))
	}
	random64 := make([]byte, 64)
	_, _ = rand.Read(random64)
	zero32 := make([]byte, 32)

	// (a)
	good1 := "v1," + swSig(rawKey, "msg_BR12_1", now, body)
	requireRelayed(t, deliver("webhook", "msg_BR12_1", good1))
	g.requireForwarded(0, body, "application/json")
	// (b) v1a and a wrong v1 before the good one, new id.
	good2 := "v1," + swSig(rawKey, "msg_BR12_2", now, body)
	requireRelayed(t, deliver("webhook", "msg_BR12_2", "v1a,"+b64Of(random64)+" v1,"+b64Of(zero32)+" "+good2))
	require.Equal(t, 2, g.up.count())
	// (c) only an asymmetric v1a entry: nothing verifiable, refused.
	requireRefused(t, deliver("webhook", "msg_BR12_3", "v1a,"+b64Of(random64)), http.StatusBadRequest, "malformed signature header")
	g.requireNoRow("standard", "msg_BR12_3")
	// (d) HMAC keyed with the whole "whsec_..." string.
	requireRefused(t, deliver("webhook", "msg_BR12_4", "v1,"+swSig([]byte(secret), "msg_BR12_4", now, body)),
		http.StatusBadRequest, "no matching signature")
	g.requireNoRow("standard", "msg_BR12_4")
	// (e) (a) under the svix-* names: the same event, a duplicate.
	requireDuplicate(t, deliver("svix", "msg_BR12_1", good1))
	// (f) (a) with another webhook-id, signature unchanged.
	requireRefused(t, deliver("webhook", "msg_BR12_other", good1), http.StatusBadRequest, "no matching signature")
	g.requireNoRow("standard", "msg_BR12_other")
	require.Equal(t, 2, g.up.count())
}

// TestCase_BR13_SlackSlashCommandForm: the form body is hashed raw and
// forwarded untouched; the route says explicitly how it is deduplicated.
//
// Origin: field case BR-13 of the project's case list (formerly cases_test.go,
// where the field cases were grouped by report).
func TestCase_BR13_SlackSlashCommandForm(t *testing.T) {
	t.Parallel()
	const secret = "slack_BR13"
	const form = "application/x-www-form-urlencoded"
	body := []byte("team_id=T0BR13&command=%2Fdeploy&text=%2Abold%2A+caf%C3%A9+a%26b&trigger_id=BR13.trigger.0001&response_url=https%3A%2F%2Fhooks.slack.example%2Fcommands%2FBR13")
	rebuilt := []byte("team_id=T0BR13&command=%2Fdeploy&text=*bold*+caf%C3%A9+a%26b&trigger_id=BR13.trigger.0001&response_url=https%3A%2F%2Fhooks.slack.example%2Fcommands%2FBR13")
	deliver := func(g *gateway, b []byte, sigHeaders []string) answer {
		return g.serve(newDelivery("http://gateway.test/slack/commands", b, append([]string{"Content-Type", form}, sigHeaders...)...))
	}

	t.Run("keyed on form field trigger_id", func(t *testing.T) {
		t.Parallel()
		g := newGateway(t, `webhook_idempotency {
			provider slack
			secret slack_BR13
			event_id form trigger_id
		}`)
		sigA := slackHeaders(secret, body, g.clock.Unix())
		requireRelayed(t, deliver(g, body, sigA))
		g.requireForwarded(0, body, form)
		g.requireRow("slack", "BR13.trigger.0001", store.StateCompleted)
		// (b) identical bytes, fresh timestamp and signature.
		g.clock.Advance(20 * time.Second)
		requireDuplicate(t, deliver(g, body, slackHeaders(secret, body, g.clock.Unix())))
		// (c) the body rebuilt from parsed params, (a)'s signature.
		requireRefused(t, deliver(g, rebuilt, sigA), http.StatusBadRequest, "no matching signature")
		require.Equal(t, 1, g.up.count())
	})

	t.Run("dedupe disabled: on_missing_id forward", func(t *testing.T) {
		t.Parallel()
		scope := uniqueScope("br13")
		g := newGateway(t, `webhook_idempotency {
			provider slack
			secret slack_BR13
			scope `+scope+`
			on_missing_id forward
		}`)
		sigA := slackHeaders(secret, body, g.clock.Unix())
		requireRelayed(t, deliver(g, body, sigA))
		g.clock.Advance(20 * time.Second)
		requireRelayed(t, deliver(g, body, slackHeaders(secret, body, g.clock.Unix())))
		require.Equal(t, 2, g.up.count())
		g.requireForwarded(0, body, form)
		g.requireForwarded(1, body, form)
		require.Empty(t, g.rows())
		require.Equal(t, 2.0, g.outcomes(outcomeForwardedNoID))
		requireRefused(t, deliver(g, rebuilt, sigA), http.StatusBadRequest, "no matching signature")
		require.Equal(t, 2, g.up.count())
	})

	t.Run("neither: refused, never silently forwarded", func(t *testing.T) {
		t.Parallel()
		g := newGateway(t, `webhook_idempotency {
			provider slack
			secret slack_BR13
		}`)
		requireRefused(t, deliver(g, body, slackHeaders(secret, body, g.clock.Unix())), http.StatusBadRequest, "json event_id")
		require.Equal(t, 0, g.up.count())
		require.Empty(t, g.rows())
	})
}

// TestCase_BR14_SlackEventsRetries: retries are keyed on event_id whatever
// their retry headers say, and the record outlives Slack's retry window.
//
// Origin: field case BR-14 of the project's case list (formerly cases_test.go,
// where the field cases were grouped by report).
func TestCase_BR14_SlackEventsRetries(t *testing.T) {
	t.Parallel()
	const secret = "slack_BR14"
	event := func(id string) []byte {
		return []byte(`{"type":"event_callback","team_id":"T0BR14","event_id":"` + id + `","event_time":1700000000,"event":{"type":"app_mention","text":"hi","ts":"1700000000.000100"}}`)
	}
	up := newUpstream()
	up.entered = make(chan int, 10)
	release := make(chan struct{})
	up.respond = func(w http.ResponseWriter, r *http.Request, n int) error {
		if r.Header.Get("X-Test-Slow") == "1" {
			<-release
		}
		return answerWith(http.StatusOK, "text/plain", "ok")(w, r, n)
	}
	g := newGateway(t, `webhook_idempotency {
		provider slack
		secret slack_BR14
	}`, withUpstream(up))
	deliver := func(b []byte, retry string, extra ...string) *http.Request {
		h := append([]string{"Content-Type", "application/json"}, slackHeaders(secret, b, g.clock.Unix())...)
		if retry != "" {
			h = append(h, "X-Slack-Retry-Num", retry, "X-Slack-Retry-Reason", "http_timeout")
		}
		return newDelivery("http://gateway.test/slack/events", b, append(h, extra...)...)
	}

	// (a) attempt 1 never arrived; attempt 2 (a retry) is forwarded.
	b1 := event("Ev0BR14AAA1")
	requireRelayed(t, g.serve(deliver(b1, "1")))
	<-up.entered
	c := g.requireForwarded(0, b1, "application/json")
	require.Equal(t, "1", c.Header.Get("X-Slack-Retry-Num"), "retry headers pass through")
	// (b) attempt 3, 5 min 10 s later, signed at its own send time.
	g.clock.Advance(5*time.Minute + 10*time.Second)
	requireDuplicate(t, g.serve(deliver(b1, "2")))
	require.Equal(t, 1, up.count())
	g.requireRow("slack", "Ev0BR14AAA1", store.StateCompleted)

	// (c) a slow event; Slack's retry #1 arrives while it is in flight.
	b2 := event("Ev0BR14AAA2")
	done := make(chan answer, 1)
	slow := deliver(b2, "", "X-Test-Slow", "1")
	go func() { done <- g.serve(slow) }()
	<-up.entered
	g.clock.Advance(3 * time.Second)
	a := g.serve(deliver(b2, "1"))
	requireRefused(t, a, http.StatusConflict, "being processed")
	require.NotEmpty(t, a.header.Get("Retry-After"))
	close(release)
	requireRelayed(t, <-done)
	require.Equal(t, 2, up.count(), "one upstream call for Ev0BR14AAA2")
	g.clock.Advance(time.Minute)
	requireDuplicate(t, g.serve(deliver(b2, "2")))
	require.Equal(t, 2, up.count())

	// A retention shorter than the providers' retry window is refused.
	require.ErrorContains(t, provisionErr(t, `webhook_idempotency {
		provider slack
		secret slack_BR14
		retention 5m
	}`), "retention")
}

// TestCase_BR15_URLBoundSignatures: Twilio and Square sign the public URL;
// the gateway uses the configured URL, never the request's Host or
// X-Forwarded-* headers.
//
// Origin: field case BR-15 of the project's case list (formerly cases_test.go,
// where the field cases were grouped by report).
func TestCase_BR15_URLBoundSignatures(t *testing.T) {
	t.Parallel()
	const twilioURL = "https://hooks.example.test/twilio/sms?tenant=a"
	const form = "application/x-www-form-urlencoded"
	twBody := []byte("AccountSid=AC_BR15&Body=Hello&From=%2B15550000001&MessageSid=SM_BR15_0001&To=%2B15550000002")
	// SIG-TWILIO: URL, then the params sorted by name, values decoded.
	twSig := func(u string) string {
		return b64Of(mac1([]byte("tw_BR15"), []byte(u+"AccountSidAC_BR15BodyHelloFrom+15550000001MessageSidSM_BR15_0001To+15550000002")))
	}
	twCfg := `webhook_idempotency {
		provider twilio
		secret tw_BR15
		url "` + twilioURL + `"
	}`
	twDeliver := func(g *gateway, sig string, extra ...string) answer {
		req := newDelivery("http://10.0.0.5:8080/twilio/sms?tenant=a", twBody, append([]string{
			"Content-Type", form,
			"I-Twilio-Idempotency-Token", "idem-BR15-0001",
			"X-Twilio-Signature", sig,
		}, extra...)...)
		require.Equal(t, "10.0.0.5:8080", req.Host)
		return g.serve(req)
	}

	// (a) as is; resent: a duplicate.
	g := newGateway(t, twCfg)
	requireRelayed(t, twDeliver(g, twSig(twilioURL)))
	c := g.requireForwarded(0, twBody, form)
	require.Equal(t, "/twilio/sms?tenant=a", c.URL[strings.Index(c.URL, "/twilio"):])
	g.requireRow("twilio", "idem-BR15-0001", store.StateCompleted)
	requireReplayedAnswer(t, twDeliver(g, twSig(twilioURL))) // twilio reads the answer: replay response
	require.Equal(t, 1, g.up.count())

	// (b) signed over the URL with the default port.
	gb := newGateway(t, twCfg)
	requireRelayed(t, twDeliver(gb, twSig("https://hooks.example.test:443/twilio/sms?tenant=a")))
	require.Equal(t, 1, gb.up.count())

	// (c) a client-supplied X-Forwarded-Host and a signature over that host.
	gc := newGateway(t, twCfg)
	a := twDeliver(gc, twSig("https://evil.example/twilio/sms?tenant=a"),
		"X-Forwarded-Host", "evil.example", "X-Forwarded-Proto", "https")
	requireRefused(t, a, http.StatusBadRequest, "no matching signature")
	require.Equal(t, 0, gc.up.count())
	require.Empty(t, gc.rows())
	// Nor the request's own URL.
	requireRefused(t, twDeliver(gc, twSig("http://10.0.0.5:8080/twilio/sms?tenant=a")), http.StatusBadRequest, "no matching signature")

	// Square.
	const squareURL = "https://hooks.example.test/square/webhook"
	sqBody := []byte(`{"merchant_id":"M_BR15","type":"payment.updated","event_id":"6a8f5f28-0000-4000-8000-0000000015aa","data":{"type":"payment","id":"P_BR15"}}`)
	sqSig := b64Of(mac256([]byte("sq_sig_BR15"), []byte(squareURL), sqBody))
	sqDeliver := func(g *gateway) answer {
		return g.serve(newDelivery("http://10.0.0.5:8080/square/webhook", sqBody,
			"Content-Type", "application/json", "x-square-hmacsha256-signature", sqSig))
	}
	// (d) as is: accepted, deduplicated on event_id.
	sq := newGateway(t, `webhook_idempotency {
		provider square
		secret sq_sig_BR15
		url `+squareURL+`
	}`)
	requireRelayed(t, sqDeliver(sq))
	sq.requireForwarded(0, sqBody, "application/json")
	sq.requireRow("square", "6a8f5f28-0000-4000-8000-0000000015aa", store.StateCompleted)
	requireDuplicate(t, sqDeliver(sq))
	require.Equal(t, 1, sq.up.count())
	// (e) the route misconfigured with a trailing slash: 400, and the log
	// line names the URL the signature was checked against.
	sqe := newGateway(t, `webhook_idempotency {
		provider square
		secret sq_sig_BR15
		url `+squareURL+`/
	}`)
	requireRefused(t, sqDeliver(sqe), http.StatusBadRequest, "no matching signature")
	require.Equal(t, 0, sqe.up.count())
	log := sqe.deliveryLog()
	require.Len(t, log, 1)
	require.Equal(t, squareURL+"/", log[0]["signed_url"])
}

// TestCase_BR16_GzipBodies: a gzip body is verified over its decoded bytes
// and forwarded as it arrived; max_body applies to the decoded size, so a
// decompression bomb is cut off with bounded memory; other encodings 415.
// Not parallel: (c) measures the process's allocations.
//
// Origin: field case BR-16 of the project's case list (formerly cases_test.go,
// where the field cases were grouped by report).
func TestCase_BR16_GzipBodies(t *testing.T) {
	const secret = "gen_BR16"
	const maxBody = 10 << 20
	g := newGateway(t, `webhook_idempotency {
		provider hmac
		secret gen_BR16
		event_id json message.id
		max_body 10MiB
		hmac {
			header X-Signature
		}
	}`)
	require.EqualValues(t, maxBody, g.h.MaxBody)
	u := []byte(`{"type":"message.new","message":{"id":"m_BR16_0001"}}`)
	sigU := hexOf(mac256([]byte(secret), u))
	gz := gzipped(t, u)
	deliver := func(body io.Reader, encoding, sig string) answer {
		req := newDelivery("http://gateway.test/webhooks/generic", nil,
			"Content-Type", "application/json", "Content-Encoding", encoding, "X-Signature", sig)
		req.Body = io.NopCloser(body)
		req.ContentLength = -1
		if b, ok := body.(*bytes.Reader); ok {
			req.ContentLength = int64(b.Len())
		}
		return g.serve(req)
	}

	// (b) signature over the compressed bytes: the provider signs U.
	requireRefused(t, deliver(bytes.NewReader(gz), "gzip", hexOf(mac256([]byte(secret), gz))),
		http.StatusBadRequest, "no matching signature")
	g.requireNoRow("hmac", "m_BR16_0001")

	// (a) accepted; the upstream gets the gzip bytes under Content-Encoding: gzip.
	requireRelayed(t, deliver(bytes.NewReader(gz), "gzip", sigU))
	c := g.requireForwarded(0, gz, "application/json")
	require.Equal(t, "gzip", c.Header.Get("Content-Encoding"))
	g.requireRow("hmac", "m_BR16_0001", store.StateCompleted)

	// (d) brotli: 415, nothing recorded.
	br := brotliStored([]byte(`{"type":"message.new","message":{"id":"m_BR16_0004"}}`))
	requireRefused(t, deliver(bytes.NewReader(br), "br", sigU), http.StatusUnsupportedMediaType, "Content-Encoding")
	g.requireNoRow("hmac", "m_BR16_0004")

	// (c) 1 GiB of spaces inside a JSON string, about 1 MB compressed,
	// signed over the decoded bytes.
	bomb, sig := gzipBomb(t, `{"type":"message.new","message":{"id":"m_BR16_0003"},"pad":"`, 1<<30, `"}`, secret)
	t.Logf("bomb: %d bytes compressed, 1 GiB decoded", len(bomb))
	require.Less(t, len(bomb), 2<<20)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	a := deliver(bytes.NewReader(bomb), "gzip", sig)
	runtime.ReadMemStats(&after)
	requireRefused(t, a, http.StatusRequestEntityTooLarge, "max_body")
	require.Equal(t, 1, g.up.count())
	g.requireNoRow("hmac", "m_BR16_0003")
	require.Len(t, g.rows(), 2, "only (a)'s rows: its event ID and its body hash (dedupe_body)")
	requireBoundedAlloc(t, after.TotalAlloc-before.TotalAlloc, maxBody)
}

// gzipBomb returns gzip(prefix + n spaces + suffix) and the hex HMAC-SHA256
// of the decoded bytes under secret, built from one compressed member of
// 16 MiB of spaces repeated (gzip readers read concatenated members as one
// stream), so making it costs little time or memory.
func gzipBomb(t testing.TB, prefix string, n int64, suffix, secret string) ([]byte, string) {
	t.Helper()
	const chunk = 16 << 20
	require.Zero(t, n%chunk)
	spaces := bytes.Repeat([]byte(" "), 1<<20)
	member := func(parts ...[]byte) []byte {
		var buf bytes.Buffer
		zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		require.NoError(t, err)
		for _, p := range parts {
			_, err := zw.Write(p)
			require.NoError(t, err)
		}
		require.NoError(t, zw.Close())
		return buf.Bytes()
	}
	var sixteen [][]byte
	for range chunk / len(spaces) {
		sixteen = append(sixteen, spaces)
	}
	spaceMember := member(sixteen...)
	var out bytes.Buffer
	out.Write(member([]byte(prefix)))
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(prefix))
	for range n / chunk {
		out.Write(spaceMember)
		for range chunk / len(spaces) {
			m.Write(spaces)
		}
	}
	out.Write(member([]byte(suffix)))
	m.Write([]byte(suffix))
	return out.Bytes(), hexOf(m.Sum(nil))
}

// brotliStored is a brotli stream holding data in one uncompressed
// meta-block (RFC 7932 9.2): enough for a "br" body; the gateway never
// decodes it.
func brotliStored(data []byte) []byte {
	n := len(data) - 1 // MLEN-1, 16 bits (MNIBBLES = 4)
	// WBITS=0 (1 bit), ISLAST=0, MNIBBLES=0 (2 bits), MLEN-1 (16 bits),
	// ISUNCOMPRESSED=1, then zero padding to the byte.
	bits := uint32(0) | 0<<1 | 0<<2 | uint32(n)<<4 | 1<<20
	out := []byte{byte(bits), byte(bits >> 8), byte(bits >> 16)}
	out = append(out, data...)
	return append(out, 0x03) // ISLAST=1, ISLASTEMPTY=1
}
