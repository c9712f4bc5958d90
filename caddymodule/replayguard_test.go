package caddymodule

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// mailgunDelivery signs body as Mailgun does at ts (the signature object
// written into the body).
func mailgunDelivery(t *testing.T, secret string, body []byte, ts time.Time) []byte {
	t.Helper()
	out, err := signature.SignDelivery("mailgun", signature.Options{Secrets: []string{secret}}, body, http.Header{}, ts)
	require.NoError(t, err)
	return out
}

func mailgunRequest(body []byte) *http.Request {
	return newDelivery("http://gateway.test/mailgun", body, "Content-Type", "application/json")
}

// Issue 22, item 4 (a): Mailgun signs only timestamp + token, not the event
// data. A genuine signature block pasted onto forged event data with new IDs,
// 20 s later, twice, used to be forwarded both times; the token is now
// remembered (scope "<scope>#once") and its reuse with another body refused
// 400. The genuine delivery sent again is a duplicate, not a refusal, and
// Mailgun's next delivery (a new token) is forwarded.
func TestIssue22_MailgunTokenReuseRefused(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, backend gatewayOption) {
		const secret = "key-mailgun-22"
		scope := uniqueScope("mailgun")
		g := newGateway(t, `webhook_idempotency {
			provider mailgun
			secret `+secret+`
			scope `+scope+`
			cache 0
		}`, backend)

		genuine := mailgunDelivery(t, secret, []byte(`{"event-data":{"id":"evt-genuine","event":"delivered","recipient":"a@example.com"}}`), g.clock.Now())
		requireRelayed(t, g.serve(mailgunRequest(genuine)))
		token := gjson.GetBytes(genuine, "signature.token").Str
		require.NotEmpty(t, token)
		g.requireRow(scope+"#once", token, store.StateCompleted)

		// The attacker: the genuine signature object on forged event data
		// with new IDs, 20 s later, twice.
		g.clock.Advance(20 * time.Second)
		for i, id := range []string{"evt-forged-1", "evt-forged-2"} {
			forged, err := sjson.SetBytes(genuine, "event-data", map[string]string{"id": id, "event": "unsubscribed", "recipient": "ceo@example.com"})
			require.NoError(t, err)
			requireRefused(t, g.serve(mailgunRequest(forged)), http.StatusBadRequest, "signature token already used")
			require.Equal(t, 1, g.up.count(), "upstream calls after forgery %d", i+1)
			g.requireNoRow(scope, id)
		}
		require.Equal(t, 2.0, g.outcomes(outcomeInvalidSignature))

		// The same event data with the same token, signed again with a new
		// timestamp (a resend), is no forgery: it reaches the event's claim.
		ts2 := strconv.FormatInt(g.clock.Now().Unix(), 10)
		resent, err := sjson.SetBytes(genuine, "signature.timestamp", ts2)
		require.NoError(t, err)
		resent, err = sjson.SetBytes(resent, "signature.signature", hexOf(mac256([]byte(secret), []byte(ts2), []byte(token))))
		require.NoError(t, err)
		requireDuplicate(t, g.serve(mailgunRequest(resent)))

		// The legitimate ones: the genuine delivery again is a duplicate;
		// Mailgun's next delivery carries a new token and is forwarded.
		requireDuplicate(t, g.serve(mailgunRequest(genuine)))
		next := mailgunDelivery(t, secret, []byte(`{"event-data":{"id":"evt-next","event":"opened"}}`), g.clock.Now())
		requireRelayed(t, g.serve(mailgunRequest(next)))
		require.Equal(t, 2, g.up.count(), "upstream calls")
		g.requireRow(scope, "evt-genuine", store.StateCompleted)
		g.requireRow(scope, "evt-next", store.StateCompleted)

		// Tokens are kept for twice the tolerance (and a minute): by then
		// the signed timestamp is refused on its own.
		ctx := context.Background()
		_, err = g.h.sweeper.Once(ctx, g.clock.Now().Add(5*time.Minute))
		require.NoError(t, err)
		g.requireRow(scope+"#once", token, store.StateCompleted)
		_, err = g.h.sweeper.Once(ctx, g.clock.Now().Add(12*time.Minute))
		require.NoError(t, err)
		g.requireNoRow(scope+"#once", token)
		g.clock.Advance(12 * time.Minute)
		forged, err := sjson.SetBytes(genuine, "event-data.id", "evt-forged-3")
		require.NoError(t, err)
		requireRefused(t, g.serve(mailgunRequest(forged)), http.StatusBadRequest, "timestamp outside tolerance")
		require.Equal(t, 2, g.up.count())
	})
}

// intercomDelivery signs body as Intercom does (X-Hub-Signature, HMAC-SHA1
// of the body; no timestamp).
func intercomDelivery(secret string, body []byte) *http.Request {
	return newDelivery("http://gateway.test/intercom", body,
		"Content-Type", "application/json",
		"X-Hub-Signature", "sha1="+hexOf(mac1([]byte(secret), body)))
}

// Issue 22, item 4 (b): Intercom signs no timestamp and has dedupe_body off.
// A captured delivery replayed after retention deleted its event row used to
// be forwarded again; every preset without a signed timestamp now keeps a
// replay record (the hash of the event ID and the body) for replay_window,
// so the replay is answered as a duplicate.
func TestIssue22_ReplayAfterRetentionWithoutDedupeBody(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, backend gatewayOption) {
		const secret = "intercom_22"
		scope := uniqueScope("intercom")
		g := newGateway(t, `webhook_idempotency {
			provider intercom
			secret `+secret+`
			scope `+scope+`
			retention 3d
			cache 0
		}`, backend)
		require.False(t, g.h.dedupeBody, "intercom has dedupe_body off")
		body := []byte(`{"type":"notification_event","id":"notif_22","topic":"conversation.user.created"}`)
		record := deliveryKey("notif_22", body)

		requireRelayed(t, g.serve(intercomDelivery(secret, body)))
		g.requireRow(scope+"#body", record, store.StateCompleted)
		start := time.Now()

		// Past retention the event row goes, the replay record stays.
		ctx := context.Background()
		_, err := g.h.sweeper.Once(ctx, start.Add(3*24*time.Hour+time.Hour))
		require.NoError(t, err)
		g.requireNoRow(scope, "notif_22")
		g.requireRow(scope+"#body", record, store.StateCompleted)

		// The attacker replays the captured delivery, twice.
		requireDuplicate(t, g.serve(intercomDelivery(secret, body)))
		requireDuplicate(t, g.serve(intercomDelivery(secret, body)))
		require.Equal(t, 1, g.up.count(), "upstream calls")
		require.Equal(t, 2.0, g.outcomes(outcomeBodyReplay))

		// The legitimate ones: a new event is forwarded.
		other := []byte(`{"type":"notification_event","id":"notif_23","topic":"conversation.user.created"}`)
		requireRelayed(t, g.serve(intercomDelivery(secret, other)))
		require.Equal(t, 2, g.up.count())

		// replay_window (400 days by default) ends the record.
		_, err = g.h.sweeper.Once(ctx, start.Add(401*24*time.Hour))
		require.NoError(t, err)
		g.requireNoRow(scope+"#body", record)
	})
}

// With dedupe_body off written explicitly (github), the record is the
// delivery's (event ID and body): the captured delivery replayed after
// retention is a duplicate; the same body under another ID is forwarded, as
// dedupe_body off asks.
func TestIssue22_ReplayRecordWithDedupeBodyOff(t *testing.T) {
	t.Parallel()
	const secret = "gh_22"
	scope := uniqueScope("gh")
	g := newGateway(t, `webhook_idempotency {
		provider github
		secret `+secret+`
		scope `+scope+`
		dedupe_body off
		retention 3d
		cache 0
	}`)
	body := []byte(`{"action":"opened","number":22}`)
	requireRelayed(t, g.serve(githubDelivery(secret, body, "guid-22")))
	g.requireRow(scope+"#body", deliveryKey("guid-22", body), store.StateCompleted)
	_, err := g.h.sweeper.Once(context.Background(), time.Now().Add(4*24*time.Hour))
	require.NoError(t, err)
	g.requireNoRow(scope, "guid-22")

	requireDuplicate(t, g.serve(githubDelivery(secret, body, "guid-22")))
	require.Equal(t, 1, g.up.count())
	requireRelayed(t, g.serve(githubDelivery(secret, body, "guid-23")))
	require.Equal(t, 2, g.up.count())
}

// Adyen signs each item and no timestamp, and its deliveries are split
// (batch split): each forwarded item claims its own replay record, so a
// captured delivery replayed after retention forwards none of its items.
func TestIssue22_ReplayAfterRetentionBatchSplit(t *testing.T) {
	t.Parallel()
	secret := randomHex(32)
	scope := uniqueScope("adyen")
	g := newGateway(t, `webhook_idempotency {
		provider adyen
		secret `+secret+`
		scope `+scope+`
		retention 3d
		cache 0
	}`)
	unsigned := []byte(`{"live":"false","notificationItems":[` +
		`{"NotificationRequestItem":{"additionalData":{},"amount":{"currency":"EUR","value":1000},"eventCode":"AUTHORISATION","eventDate":"2025-12-01T00:00:00+01:00","merchantAccountCode":"TestMerchant","merchantReference":"order-1","paymentMethod":"visa","pspReference":"PSP22A","reason":"","success":"true"}},` +
		`{"NotificationRequestItem":{"additionalData":{},"amount":{"currency":"EUR","value":2500},"eventCode":"AUTHORISATION","eventDate":"2025-12-01T00:00:01+01:00","merchantAccountCode":"TestMerchant","merchantReference":"order-2","paymentMethod":"mc","pspReference":"PSP22B","reason":"","success":"true"}}]}`)
	h := http.Header{}
	body, err := signature.SignDelivery("adyen", signature.Options{Secrets: []string{secret}}, unsigned, h, time.Now())
	require.NoError(t, err)
	deliver := func(body []byte) answer {
		req := newDelivery("http://gateway.test/adyen", body, "Content-Type", "application/json")
		return g.serve(req)
	}
	a := deliver(body)
	require.Equal(t, http.StatusOK, a.status, "body %s", a.body)
	require.Equal(t, 2, g.up.count())
	records := 0
	for _, e := range g.rows() {
		if e.Scope == scope+"#body" {
			records++
		}
	}
	require.Equal(t, 2, records, "one replay record per item")

	_, err = g.h.sweeper.Once(context.Background(), time.Now().Add(4*24*time.Hour))
	require.NoError(t, err)
	require.Len(t, g.rows(), 2, "the items' event rows are gone, their records stay")

	// The captured delivery, replayed twice, then with what the items'
	// HMACs do not cover changed (spacing, the live flag, an unsigned
	// member): no item is forwarded again.
	respaced := bytes.Replace(body, []byte(`"live":`), []byte(`"live" : `), 1)
	reworded, err := sjson.SetBytes(body, "notificationItems.1.NotificationRequestItem.reason", "changed")
	require.NoError(t, err)
	for _, replay := range [][]byte{body, body, respaced, reworded} {
		a = deliver(replay)
		require.Equal(t, http.StatusOK, a.status, "body %s", a.body)
	}
	require.Equal(t, 2, g.up.count(), "upstream calls")
}

// Schemes that sign less than the body's bytes (Preset.Covered): a captured
// delivery re-encoded so that the same signature still verifies, sent under
// a fresh, unsigned delivery ID, is a replay, not a new event. Keyed on the
// raw bytes, each was forwarded a second time. The Twilio variant is the
// input the signature fuzzer found (parameters split at other boundaries).
func TestReplayRecordKeysOnWhatTheSignatureCovers(t *testing.T) {
	t.Parallel()
	const hookURL = "https://hooks.example.test/hook"
	const form = "application/x-www-form-urlencoded"
	twilio := "AccountSid=AC_RT&Body=Hello+caf%C3%A9&From=%2B15550000001&MessageSid=SM_RT_0001&To=%2B15550000002"
	giteaJSON := `{"ref":"refs/heads/main","after":"c0ffee","repository":{"full_name":"o/r"}}`
	btPayload := base64.StdEncoding.EncodeToString([]byte("<notification><kind>check</kind></notification>")) + "\n"
	for _, tc := range []struct {
		name, provider, secret, config string
		idHeader                       string // the unsigned delivery ID
		body                           string // as the provider sends it
		contentType                    string
		variants                       []string // the same signature verifies each
	}{
		{
			name: "twilio", provider: "twilio", secret: "tw_token", config: "url " + hookURL,
			idHeader: "I-Twilio-Idempotency-Token", body: twilio, contentType: form,
			variants: []string{
				"To=%2B15550000002&MessageSid=SM_RT_0001&From=%2B15550000001&Body=Hello%20caf%C3%A9&AccountSid=AC_RT",
				"AccountSidAC_RTBodyHello+caf%C3%A9From%2B15550000001MessageSidSM_RT_0001To%2B15550000002",
				"AccountSid=AC_RTBodyHello+caf%C3%A9From%2B15550000001&MessageSid=SM_RT_0001&To=%2B15550000002",
			},
		},
		{
			name: "mandrill", provider: "mandrill", secret: "md_key", config: "url " + hookURL + "\nevent_id header X-Delivery",
			idHeader: "X-Delivery", body: "mandrill_events=%5B%7B%22event%22%3A%22send%22%7D%5D", contentType: form,
			variants: []string{"mandrill_events=[{\"event\":\"send\"}]", "mandrill_e=vents[{\"event\":\"send\"}]"},
		},
		{
			name: "plivo", provider: "plivo", secret: "pl_token", config: "url " + hookURL + "\nevent_id header X-Delivery",
			idHeader: "X-Delivery", body: "CallUUID=c-1&From=15550000001&To=15550000002", contentType: form,
			variants: []string{"To=15550000002&From=15550000001&CallUUID=c-1", "CallUUID=c-1From15550000001To15550000002"},
		},
		{
			name: "gitea", provider: "gitea", secret: "gitea_s",
			idHeader: "X-Gitea-Delivery", body: "payload=" + url.QueryEscape(giteaJSON), contentType: form,
			variants: []string{"payload=" + strings.ReplaceAll(url.QueryEscape(giteaJSON), "%22", `"`), "z=1&payload=" + url.QueryEscape(giteaJSON)},
		},
		{
			// An ID read from a form signed by its parameters: a re-split
			// is another ID, so under dedupe_body off too the record is of
			// the signed content alone (an adversarial trial: 5 runs).
			name: "mandrill, form ID, dedupe_body off", provider: "mandrill", secret: "md_key",
			config: "url " + hookURL + "\nevent_id form_sha256 mandrill_events\ndedupe_body off",
			body:   "mandrill_events=%5B%7B%22event%22%3A%22send%22%7D%5D", contentType: form,
			variants: []string{"mandrill_events=%5B%7B%22event%22%3A%22send%22&%7D%5D=", "mandrill_events=%5B%7B%22event%22%3A%22&send%22%7D%5D="},
		},
		{
			name: "braintree, dedupe_body off", provider: "braintree", secret: "pub_k:priv_k",
			config: "dedupe_body off", contentType: form,
		},
		{
			// The event ID is the hash of bt_payload, and the signature
			// verifies it without its trailing newline: a second ID.
			name: "braintree", provider: "braintree", secret: "pub_k:priv_k",
			contentType: form, // the variant is built from the signed form below
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eachBackend(t, func(t *testing.T, backend gatewayOption) {
				scope := uniqueScope(tc.provider)
				g := newGateway(t, "webhook_idempotency {\n provider "+tc.provider+"\n secret "+tc.secret+"\n scope "+scope+"\n "+tc.config+"\n}", backend)
				require.Equal(t, !strings.Contains(tc.config, "dedupe_body off"), g.h.dedupeBody)
				opts := signature.Options{Secrets: []string{tc.secret}, URL: hookURL}
				h := http.Header{}
				h.Set("Content-Type", tc.contentType)
				signed := []byte(tc.body)
				variants := tc.variants
				if tc.provider == "braintree" {
					var err error
					signed, err = signature.SignDelivery("braintree", opts, []byte("bt_payload="+url.QueryEscape(btPayload)), h, time.Now())
					require.NoError(t, err)
					vals, err := url.ParseQuery(string(signed))
					require.NoError(t, err)
					vals.Set("bt_payload", strings.TrimSuffix(btPayload, "\n"))
					variants = []string{vals.Encode()}
				} else {
					toSign := signed
					if tc.provider == "gitea" {
						toSign = []byte(giteaJSON)
					}
					require.NoError(t, signature.Sign(tc.provider, opts, toSign, h, time.Now()))
				}
				deliver := func(body string, id int) answer {
					var hs []string
					for name, vs := range h {
						hs = append(hs, name, vs[0])
					}
					if tc.idHeader != "" {
						hs = append(hs, tc.idHeader, fmt.Sprintf("delivery-%d", id))
					}
					return g.serve(newDelivery("http://gateway.test/hook", []byte(body), hs...))
				}
				first := deliver(string(signed), 0)
				require.Equal(t, http.StatusOK, first.status, "body %s", first.body)
				require.Empty(t, first.header.Get("Idempotent-Replayed"))
				for i, v := range variants {
					a := deliver(v, i+1)
					require.Equal(t, http.StatusOK, a.status, "variant %d: %s", i+1, a.body)
					require.Equal(t, "true", a.header.Get("Idempotent-Replayed"), "variant %d", i+1)
				}
				require.Equal(t, 1, g.up.count(), "upstream executions")
				require.Equal(t, float64(len(variants)), g.outcomes(outcomeBodyReplay))
			})
		})
	}
}

// A provider that signs a timestamp keeps no replay record: the event's row
// refuses a capture while its timestamp is accepted. With a tolerance of
// 100h and retention 72h, an adversarial trial's capture was forwarded
// again once its row was swept; event rows are now kept for twice the
// tolerance (and the load warns).
func TestRetentionCoversTheTolerance(t *testing.T) {
	t.Parallel()
	const secret = "whsec_keep_rows"
	scope := uniqueScope("stripe")
	g := newGateway(t, `webhook_idempotency {
		provider stripe
		secret `+secret+`
		scope `+scope+`
		tolerance 100h
		retention 72h
		cache 0
	}`)
	require.Equal(t, caddy.Duration(200*time.Hour), g.h.Retention)
	require.NoError(t, g.h.Validate(), "Caddy validates the raised config too")

	first := stripeRequest(t, "http://gateway.test/stripe", secret, stripeBody("evt_keep_rows", "x"), g.clock.Now(), "")
	body, err := io.ReadAll(first.Body)
	require.NoError(t, err)
	hdr := first.Header.Clone()
	replay := func() *http.Request {
		r := newDelivery("http://gateway.test/stripe", body)
		r.Header = hdr.Clone()
		return r
	}
	requireRelayed(t, g.serve(replay()))
	g.requireRow(scope, "evt_keep_rows", store.StateCompleted) // settled after the answer
	// 80 hours on: past the written retention, within the tolerance.
	g.clock.Advance(80 * time.Hour)                                               // the verifier's clock
	_, err = g.h.sweeper.Once(context.Background(), time.Now().Add(80*time.Hour)) // rows carry the store's
	require.NoError(t, err)
	g.requireRow(scope, "evt_keep_rows", store.StateCompleted)
	requireDuplicate(t, g.serve(replay()))
	require.Equal(t, 1, g.up.count(), "upstream executions")

	// A year's tolerance (the acceptance suite's conformance routes) loads.
	g3 := newGateway(t, "webhook_idempotency {\n provider stripe\n secret s\n tolerance 8760h\n}")
	require.Equal(t, caddy.Duration(2*8760*time.Hour), g3.h.Retention)

	// A tolerance the retention already covers changes nothing.
	g2 := newGateway(t, "webhook_idempotency {\n provider stripe\n secret s\n tolerance 30m\n retention 72h\n}")
	require.Equal(t, caddy.Duration(72*time.Hour), g2.h.Retention)
}

// Adyen's item ID is read from the JSON as written, its HMAC over the
// fields as JavaScript prints them: a numeric pspReference spelled
// 8.835511210681234e15, or the signed fields re-split at a ':' inside one
// of them, verify under the same HMAC with another ID. A verification
// trial ran one captured item 9 times; the item's replay record is now of
// the signed fields alone.
func TestAdyenItemSpellingsAreOneEvent(t *testing.T) {
	t.Parallel()
	secret := randomHex(32)
	g := newGateway(t, "webhook_idempotency {\n provider adyen\n secret "+secret+"\n scope "+uniqueScope("adyen")+"\n}")
	unsigned := []byte(`{"live":"false","notificationItems":[{"NotificationRequestItem":{"pspReference":"8835511210681234","originalReference":"","merchantAccountCode":"MerchAcc","merchantReference":"shop:42","amount":{"value":1000,"currency":"EUR"},"eventCode":"AUTHORISATION","success":"true","additionalData":{}}}]}`)
	body, err := signature.SignDelivery("adyen", signature.Options{Secrets: []string{secret}}, unsigned, http.Header{}, time.Now())
	require.NoError(t, err)
	deliver := func(b string) answer {
		return g.serve(newDelivery("http://gateway.test/adyen", []byte(b), "Content-Type", "application/json"))
	}
	a := deliver(string(body))
	require.Equal(t, http.StatusOK, a.status, "body %s", a.body)
	require.Equal(t, 1, g.up.count())
	for _, respelled := range []string{"8.835511210681234e15", "8835511210681234.0", "8835511210681234E0"} {
		a = deliver(strings.Replace(string(body), `"8835511210681234"`, respelled, 1))
		require.Equal(t, http.StatusOK, a.status, "%s: %s", respelled, a.body)
	}
	// The 8 signed fields joined by ':', one field's ':' moved: the same
	// signed text, another pspReference, eventCode and success.
	shifted := strings.NewReplacer(
		`"pspReference":"8835511210681234"`, `"pspReference":"8835511210681234:"`,
		`"originalReference":""`, `"originalReference":"MerchAcc"`,
		`"merchantAccountCode":"MerchAcc"`, `"merchantAccountCode":"shop"`,
		`"merchantReference":"shop:42"`, `"merchantReference":"42"`,
	).Replace(string(body))
	a = deliver(shifted)
	require.Equal(t, http.StatusOK, a.status, "shifted: %s", a.body)
	require.Equal(t, 1, g.up.count(), "upstream executions")
}

// One set of parameters posted to two URLs is two signed requests (Twilio
// signs the URL): a caller pressing 1 at two menus of one number, two
// routes of the scope twilio. Keyed on the parameters alone, the second
// was answered as a duplicate (a verification trial: 1 run of 3), and the
// caller heard an application error.
func TestRecordsOfURLSignedSchemesNameTheURL(t *testing.T) {
	t.Parallel()
	route := func(u string) *gateway {
		return newGateway(t, "webhook_idempotency {\n provider twilio\n secret tw_token\n url "+u+"\n}")
	}
	menuA, menuB, again := route("https://hooks.example.test/menu-a"), route("https://hooks.example.test/menu-b"),
		route("https://hooks.example.test/menu-a")
	params := []byte("CallSid=CA77&Digits=1&msg=Gather+End")
	require.NotEqual(t, bodyKey(menuA.h.coveredOf(params, nil)), bodyKey(menuB.h.coveredOf(params, nil)), "two URLs")
	require.Equal(t, bodyKey(menuA.h.coveredOf(params, nil)), bodyKey(again.h.coveredOf(params, nil)), "one URL")
	reordered := []byte("msg=Gather%20End&Digits=1&CallSid=CA77")
	require.Equal(t, bodyKey(menuA.h.coveredOf(params, nil)), bodyKey(menuA.h.coveredOf(reordered, nil)), "the capture re-encoded")
}
