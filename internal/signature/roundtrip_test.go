package signature_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// now is the fixed clock of the round-trip tests.
var now = time.Unix(1_764_547_200, 0)

func clock(t time.Time) func() time.Time { return func() time.Time { return t } }

// fixture is what signing a delivery for one provider needs.
type fixture struct {
	provider string
	secrets  [2]string // the signing secret and another well-formed one
	body     string
	url      string
	hmac     signature.HMACOptions
	prep     map[string]string // headers set before signing (IDs, Content-Type)
}

// linearBody carries Linear's signed webhookTimestamp (ms) at now.
const linearBody = `{"action":"create","type":"Issue","webhookTimestamp":1764547200000,"data":{"id":"i1"}}`

// bodySigned are the presets whose signature lives in the body (SignBody);
// TestBodySigned covers them instead of the header round trips.
var bodySigned = []string{"mailgun", "msgraph", "adyen", "midtrans", "braintree"}

// tokenLike are the presets whose secret covers no byte of the body.
var tokenLike = map[string]bool{
	"gitlab": true, "okta": true, "flutterwave": true, "xendit": true, "chargebee": true, "postmark": true,
	"mercadopago": true, // signs data.id, x-request-id and ts, not the body
}

// formatted are the tokenLike presets whose header still has a format
// (Basic credentials, Mercado Pago's ts=,v1=).
var formatted = map[string]bool{"chargebee": true, "mercadopago": true, "postmark": true}

// multiLine are the presets that accept their signature header on several
// lines (Mollie sends one per secret during a rotation).
var multiLine = map[string]bool{"mollie": true}

const jsonBody = `{"id":"evt_RT_0001","event_id":"ev_RT_0001","type":"invoice.paid","data":{"amount":1000}}`

var fixtures = []fixture{
	{provider: "stripe", secrets: [2]string{"whsec_rt_current", "whsec_rt_previous"}, body: jsonBody},
	{provider: "github", secrets: [2]string{"gh-secret-current", "gh-secret-previous"}, body: jsonBody},
	{
		provider: "standard", body: jsonBody,
		secrets: [2]string{"whsec_QlIxMi10ZXN0LWtleS0wMTIzNDU2Nzg5YWJjZGVmISE=", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
		prep:    map[string]string{"webhook-id": "msg_RT_0001"},
	},
	{
		provider: "svix", body: jsonBody,
		secrets: [2]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_QlIxMi10ZXN0LWtleS0wMTIzNDU2Nzg5YWJjZGVmISE="},
		prep:    map[string]string{"svix-id": "msg_RT_0001"},
	},
	{
		provider: "hmac", secrets: [2]string{"gen-current", "gen-previous"}, body: jsonBody,
		hmac: signature.HMACOptions{Header: "X-Webhook-Signature"},
	},
	{provider: "shopify", secrets: [2]string{"shpss_rt_current", "shpss_rt_previous"}, body: jsonBody},
	{provider: "slack", secrets: [2]string{"slack_rt_current", "slack_rt_previous"}, body: jsonBody},
	{provider: "paddle", secrets: [2]string{"pdl_ntfset_01rt_current", "pdl_ntfset_01rt_previous"}, body: jsonBody},
	{
		provider: "square", secrets: [2]string{"sq_sig_current", "sq_sig_previous"}, body: jsonBody,
		url: "https://hooks.example.test/square/webhook?tenant=a",
	},
	{
		provider: "twilio", secrets: [2]string{"tw_current_token", "tw_previous_token"},
		body: "AccountSid=AC_RT&Body=Hello+caf%C3%A9&From=%2B15550000001&MessageSid=SM_RT_0001&To=%2B15550000002",
		url:  "https://hooks.example.test/twilio/sms?tenant=a",
		prep: map[string]string{"Content-Type": "application/x-www-form-urlencoded"},
	},
	{provider: "razorpay", secrets: [2]string{"rzp_current", "rzp_previous"}, body: jsonBody},
	{provider: "gitlab", secrets: [2]string{"gl-token-current", "gl-token-previous"}, body: jsonBody},
	{provider: "bitbucket", secrets: [2]string{"bb-current", "bb-previous"}, body: jsonBody},
	{provider: "gitea", secrets: [2]string{"gitea-current", "gitea-previous"}, body: jsonBody},
	{provider: "forgejo", secrets: [2]string{"forgejo-current", "forgejo-previous"}, body: jsonBody},
	{provider: "linear", secrets: [2]string{"lin_wh_current", "lin_wh_previous"}, body: linearBody},
	{provider: "zoom", secrets: [2]string{"zm_current", "zm_previous"}, body: jsonBody},
	{provider: "typeform", secrets: [2]string{"tf_current", "tf_previous"}, body: jsonBody},
	{
		provider: "hubspot", secrets: [2]string{"hs_client_current", "hs_client_previous"}, body: `[` + jsonBody + `]`,
		url: "https://hooks.example.test/hubspot?portal=1",
	},
	{provider: "intercom", secrets: [2]string{"ic_current", "ic_previous"}, body: jsonBody},
	{provider: "pagerduty", secrets: [2]string{"pd_current", "pd_previous"}, body: jsonBody},
	{provider: "sentry", secrets: [2]string{"sentry_current", "sentry_previous"}, body: jsonBody},
	{provider: "woocommerce", secrets: [2]string{"wc_current", "wc_previous"}, body: jsonBody},
	{provider: "paystack", secrets: [2]string{"sk_test_current", "sk_test_previous"}, body: jsonBody},
	{provider: "lemonsqueezy", secrets: [2]string{"ls_current", "ls_previous"}, body: jsonBody},
	{provider: "coinbase", secrets: [2]string{"cc_current", "cc_previous"}, body: jsonBody},
	{provider: "checkout", secrets: [2]string{"cko_current", "cko_previous"}, body: jsonBody},
	{
		provider: "twitch", secrets: [2]string{"twitch_current_0123", "twitch_previous_0123"}, body: jsonBody,
		prep: map[string]string{"Twitch-Eventsub-Message-Id": "befa7b53-d79d-478f-86b9-120f112b044e"},
	},
	{provider: "meta", secrets: [2]string{"meta_app_current", "meta_app_previous"}, body: jsonBody},
	{
		// ECDSA: signs with PKCS#8 private keys, verifies with their public keys.
		provider: "sendgrid", body: `[{"sg_event_id":"sg_RT_1","event":"delivered"}]`,
		secrets: [2]string{
			"MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgboYx4Qjsne5eGO6Jo16N+Hny+GyTlMgRDQe0aFgIo66hRANCAAS8DHvFrQ4vBTVDZa20SCslXkZxwfixyeGInhWix/zjiTUBKzSXf5TQZyETV5ThZWN3Hiq2K4VpX0UmeOUNBeqN",
			"MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgs5Ioejz7VXeA93fiQmCkBHnbXF7eObV2lj7jHmC8mRyhRANCAAT69VDBn2Au4sg65XMCkWf3AzDNmABrLquK4pOSAbJ03HuKHk1rBuvUplRQ6m7R5yNRjyb4UoQIeZQsjuBEAjwa",
		},
	},
	{
		provider: "telnyx", body: `{"data":{"id":"0ccc7b54-4df3-4bca-a65a-3da1ecc777f0","event_type":"message.received"}}`,
		secrets: [2]string{"seed:nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=", "seed:TM0Imyj/ltqdtsNG7BFOD1uKMZ81q6Yk2oz27U+4pvs="},
	},
	{provider: "customerio", secrets: [2]string{"cio_current", "cio_previous"}, body: jsonBody},
	{provider: "resend", secrets: [2]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_QlIxMi10ZXN0LWtleS0wMTIzNDU2Nzg5YWJjZGVmISE="}, body: jsonBody, prep: map[string]string{"svix-id": "msg_RT_0001"}},
	{provider: "clerk", secrets: [2]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_QlIxMi10ZXN0LWtleS0wMTIzNDU2Nzg5YWJjZGVmISE="}, body: jsonBody, prep: map[string]string{"svix-id": "msg_RT_0001"}},
	{provider: "replicate", secrets: [2]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_QlIxMi10ZXN0LWtleS0wMTIzNDU2Nzg5YWJjZGVmISE="}, body: jsonBody, prep: map[string]string{"webhook-id": "msg_RT_0001"}},
	{provider: "openai", secrets: [2]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_QlIxMi10ZXN0LWtleS0wMTIzNDU2Nzg5YWJjZGVmISE="}, body: jsonBody, prep: map[string]string{"webhook-id": "msg_RT_0001"}},
	{provider: "polar", secrets: [2]string{"polar_whs_current", "polar_whs_previous"}, body: jsonBody, prep: map[string]string{"webhook-id": "msg_RT_0001"}},
	{provider: "okta", secrets: [2]string{"okta-current-secret", "okta-previous-secret"}, body: `{"eventId":"evt_RT_1","data":{"events":[{"uuid":"u1"}]}}`},
	{provider: "workos", secrets: [2]string{"workos_current", "workos_previous"}, body: jsonBody},
	{provider: "persona", secrets: [2]string{"wbhsec_current", "wbhsec_previous"}, body: `{"data":{"type":"event","id":"evt_RT_1"}}`},
	{provider: "asana", secrets: [2]string{"asana_learned_current", "asana_learned_previous"}, body: `{"events":[{"action":"changed"}]}`},
	{
		provider: "trello", secrets: [2]string{"trello_app_secret_current", "trello_app_secret_previous"}, body: `{"action":{"id":"5f0a","type":"updateCard"}}`,
		url: "https://hooks.example.test/trello?board=1",
	},
	{provider: "dropbox", secrets: [2]string{"dbx_app_current", "dbx_app_previous"}, body: `{"list_folder":{"accounts":["dbid:AAH4"]}}`},
	{provider: "notion", secrets: [2]string{"secret_notion_current", "secret_notion_previous"}, body: jsonBody},
	{provider: "box", secrets: [2]string{"box_primary_key", "box_secondary_key"}, body: jsonBody},
	{provider: "calendly", secrets: [2]string{"cal_current", "cal_previous"}, body: jsonBody},
	{provider: "calcom", secrets: [2]string{"calcom_current", "calcom_previous"}, body: jsonBody},
	{provider: "docusign", secrets: [2]string{"ds_current_key", "ds_previous_key"}, body: jsonBody},
	{provider: "webflow", secrets: [2]string{"wf_current", "wf_previous"}, body: jsonBody},
	{provider: "vercel", secrets: [2]string{"vercel_current", "vercel_previous"}, body: jsonBody},
	{provider: "heroku", secrets: [2]string{"heroku_current", "heroku_previous"}, body: jsonBody},
	{provider: "circleci", secrets: [2]string{"circle_current", "circle_previous"}, body: jsonBody},
	{provider: "buildkite", secrets: [2]string{"bk_current", "bk_previous"}, body: jsonBody},
	{provider: "alchemy", secrets: [2]string{"whsec_alchemy_current", "whsec_alchemy_previous"}, body: jsonBody},
	{provider: "mux", secrets: [2]string{"mux_current", "mux_previous"}, body: jsonBody},
	{provider: "gocardless", secrets: [2]string{"gc_current", "gc_previous"}, body: `{"events":[{"id":"EV123"}]}`},
	{provider: "easypost", secrets: [2]string{"ep_current", "ep_previous"}, body: jsonBody},
	{provider: "xero", secrets: [2]string{"xero_current", "xero_previous"}, body: jsonBody},
	{provider: "intuit", secrets: [2]string{"intuit_current", "intuit_previous"}, body: jsonBody},
	{provider: "cashfree", secrets: [2]string{"cf_client_secret_current", "cf_client_secret_previous"}, body: jsonBody},
	{provider: "cloudinary", secrets: [2]string{"cld_api_secret_current", "cld_api_secret_previous"}, body: jsonBody},
	{provider: "hygraph", secrets: [2]string{"hygraph_current", "hygraph_previous"}, body: "{\"operation\":\"update\",\"data\":{\"id\":\"ck1\",\"title\":\"<caf\u00e9> & \\\"q\\\"\\n\"}}"},
	{provider: "attio", secrets: [2]string{"attio_current", "attio_previous"}, body: jsonBody},
	{provider: "launchdarkly", secrets: [2]string{"ld_current", "ld_previous"}, body: `{"_id":"57c0a8e29969090743529965","kind":"flag","name":"checkout"}`},
	{provider: "helpscout", secrets: [2]string{"hs_secret_current", "hs_secret_previous"}, body: jsonBody},
	{provider: "orb", secrets: [2]string{"orb_whsec_current", "orb_whsec_previous"}, body: jsonBody},
	{provider: "coinify", secrets: [2]string{"coinify_current", "coinify_previous"}, body: jsonBody},
	{provider: "moonpay", secrets: [2]string{"moonpay_current", "moonpay_previous"}, body: jsonBody},
	{provider: "jira", secrets: [2]string{"jira_current", "jira_previous"}, body: jsonBody},
	{provider: "fintoc", secrets: [2]string{"fintoc_current", "fintoc_previous"}, body: jsonBody},
	{provider: "zohopayments", secrets: [2]string{"zoho_current", "zoho_previous"}, body: jsonBody},
	{provider: "zendesk", secrets: [2]string{"zd_current", "zd_previous"}, body: jsonBody},
	{provider: "segment", secrets: [2]string{"seg_current", "seg_previous"}, body: `{"messageId":"ajs-RT-1","type":"track","event":"Order Completed"}`},
	{provider: "clickup", secrets: [2]string{"cu_current", "cu_previous"}, body: jsonBody},
	{provider: "sanity", secrets: [2]string{"sanity_current", "sanity_previous"}, body: jsonBody},
	{provider: "aftership", secrets: [2]string{"as_current", "as_previous"}, body: jsonBody},
	{provider: "moderntreasury", secrets: [2]string{"mt_current", "mt_previous"}, body: jsonBody},
	{provider: "onfido", secrets: [2]string{"onfido_current", "onfido_previous"}, body: jsonBody},
	{provider: "pusher", secrets: [2]string{"pusher_current", "pusher_previous"}, body: `{"time_ms":1764547200000,"events":[{"name":"channel_occupied","channel":"test"}]}`},
	{provider: "vonage", secrets: [2]string{"vonage_signature_current", "vonage_signature_previous"}, body: jsonBody},
	{provider: "postmark", secrets: [2]string{"hook:current-password", "hook:previous-password"}, body: jsonBody},
	{provider: "liveblocks", secrets: [2]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_QlIxMi10ZXN0LWtleS0wMTIzNDU2Nzg5YWJjZGVmISE="}, body: jsonBody, prep: map[string]string{"webhook-id": "msg_RT_0001"}},
	{provider: "lithic", secrets: [2]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_QlIxMi10ZXN0LWtleS0wMTIzNDU2Nzg5YWJjZGVmISE="}, body: jsonBody, prep: map[string]string{"webhook-id": "msg_RT_0001"}},
	{provider: "finch", secrets: [2]string{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "QlIxMi10ZXN0LWtleS0wMTIzNDU2Nzg5YWJjZGVmISE="}, body: jsonBody, prep: map[string]string{"finch-event-id": "evt_RT_0001"}},
	{
		provider: "plivo", secrets: [2]string{"plivo_auth_current", "plivo_auth_previous"},
		body: "CallUUID=RT-0001&Direction=inbound&Event=StartApp&From=15550000001&To=15550000002",
		url:  "https://hooks.example.test/plivo/answer?tenant=a",
		prep: map[string]string{"Content-Type": "application/x-www-form-urlencoded"},
	},
	{
		provider: "mandrill", secrets: [2]string{"mandrill_key_current", "mandrill_key_previous"},
		body: "mandrill_events=%5B%7B%22event%22%3A%22send%22%2C%22_id%22%3A%22RT1%22%7D%5D",
		url:  "https://hooks.example.test/mandrill?tenant=a",
		prep: map[string]string{"Content-Type": "application/x-www-form-urlencoded"},
	},
	{provider: "mollie", secrets: [2]string{"mollie_whsec_current", "mollie_whsec_previous"}, body: jsonBody},
	{provider: "recurly", secrets: [2]string{"recurly_key_current", "recurly_key_previous"}, body: jsonBody},
	{provider: "revolut", secrets: [2]string{"wsk_revolut_current", "wsk_revolut_previous"}, body: `{"event":"ORDER_COMPLETED","order_id":"ord_RT_1"}`},
	{provider: "airwallex", secrets: [2]string{"awx_current", "awx_previous"}, body: jsonBody},
	{provider: "fastspring", secrets: [2]string{"fs_current", "fs_previous"}, body: `{"events":[{"id":"fs_evt_1","type":"order.completed","data":{"total":10.0}}]}`},
	{provider: "authorizenet", secrets: [2]string{"ANET_SIGNATURE_KEY_CURRENT", "ANET_SIGNATURE_KEY_PREVIOUS"}, body: `{"notificationId":"d0e8e7fe-c3e7-4add-a480-27bc5ce28a14","eventType":"net.authorize.payment.authcapture.created","payload":{"id":"60020981676","authAmount":45.00}}`},
	{provider: "flutterwave", secrets: [2]string{"flw_hash_current", "flw_hash_previous"}, body: `{"event":"charge.completed","data":{"id":285959875,"amount":100}}`},
	{provider: "xendit", secrets: [2]string{"xnd_token_current", "xnd_token_previous"}, body: jsonBody, prep: map[string]string{"webhook-id": "whk_RT_1"}},
	{provider: "chargebee", secrets: [2]string{"cb_user:cb-pass-current", "cb_user:cb-pass-previous"}, body: jsonBody},
	{
		provider: "mercadopago", secrets: [2]string{"mp_secret_current", "mp_secret_previous"},
		body: `{"id":12345,"action":"payment.updated","data":{"id":"123456789"}}`,
		prep: map[string]string{"x-request-id": "bb56a2f1-6aae-46ac-982e-9dcd3581d08e"},
	},
	{
		provider: "rapyd", secrets: [2]string{"rak_current:rsk_current", "rak_previous:rsk_previous"}, body: `{"id":"wh_RT_1","type":"PAYMENT_COMPLETED","data":{"amount":1000}}`,
		url: "https://hooks.example.test/rapyd?tenant=a",
	},
	{
		// Ed25519: the fixture signs with private seeds; verify maps them to
		// the public keys the gateway is configured with.
		provider: "discord", body: `{"type":2,"id":"1234567890","data":{"name":"pay"}}`,
		secrets: [2]string{
			"9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
			"4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
		},
	},
}

func (f fixture) preset(t testing.TB) signature.Preset {
	t.Helper()
	p, ok := signature.Lookup(f.provider)
	require.True(t, ok, f.provider)
	return p
}

// options returns Options with the given secrets and clock.
func (f fixture) options(at time.Time, secrets ...string) signature.Options {
	return signature.Options{Secrets: secrets, URL: f.url, HMAC: f.hmac, Now: clock(at)}
}

// signed returns the headers of a delivery of body signed at ts with secret.
func (f fixture) signed(t testing.TB, secret, body string, ts time.Time) http.Header {
	t.Helper()
	h := http.Header{}
	for k, v := range f.prep {
		h.Set(k, v)
	}
	require.NoError(t, signature.Sign(f.provider, f.options(now, secret), []byte(body), h, ts))
	return h
}

// sigHeader is the primary signature header's name.
func (f fixture) sigHeader(t testing.TB) string {
	if f.hmac.Header != "" {
		return f.hmac.Header
	}
	return f.preset(t).Headers[0].Signature
}

func (f fixture) verify(t testing.TB, secrets []string, at time.Time, body string, h http.Header) error {
	t.Helper()
	pub := make([]string, len(secrets))
	for i, s := range secrets {
		var err error
		pub[i], err = signature.PublicSecret(f.provider, s)
		require.NoError(t, err)
	}
	v, err := signature.New(f.provider, f.options(at, pub...))
	require.NoError(t, err)
	return v.Verify([]byte(body), h)
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	require.ElementsMatch(t, signature.Providers(), append(providersOf(fixtures), bodySigned...), "every preset needs a round-trip fixture")

	type testCase struct {
		name   string
		mutate func(t *testing.T, f fixture, body *string, h http.Header)
		secret func(f fixture) []string
		want   error
	}
	current := func(f fixture) []string { return f.secrets[:1] }
	cases := []testCase{
		{name: "valid", secret: current},
		{
			name: "tampered body",
			mutate: func(_ *testing.T, _ fixture, body *string, _ http.Header) {
				*body = strings.Replace(*body, "e", "E", 1)
			},
			secret: current, want: signature.ErrNoMatchingSignature,
		},
		{name: "wrong secret", secret: func(f fixture) []string { return f.secrets[1:] }, want: signature.ErrNoMatchingSignature},
		{name: "rotation new first", secret: func(f fixture) []string { return f.secrets[:] }},
		{name: "rotation old first", secret: func(f fixture) []string { return []string{f.secrets[1], f.secrets[0]} }},
		{
			name: "missing header",
			mutate: func(t *testing.T, f fixture, _ *string, h http.Header) {
				h.Del(f.sigHeader(t))
				if l := f.preset(t).Legacy; l != nil {
					h.Del(l.Header)
				}
			},
			secret: current, want: signature.ErrMissingHeader,
		},
		{
			name:   "empty header",
			mutate: func(t *testing.T, f fixture, _ *string, h http.Header) { h.Set(f.sigHeader(t), "") },
			secret: current, want: signature.ErrMalformedHeader,
		},
		{
			name: "header repeated on two lines",
			mutate: func(t *testing.T, f fixture, _ *string, h http.Header) {
				h.Add(f.sigHeader(t), h.Get(f.sigHeader(t)))
			},
			secret: current, want: signature.ErrMalformedHeader,
		},
	}
	for _, f := range fixtures {
		for _, tc := range cases {
			t.Run(f.provider+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				body := f.body
				h := f.signed(t, f.secrets[0], body, now)
				if tc.mutate != nil {
					tc.mutate(t, f, &body, h)
				}
				err := f.verify(t, tc.secret(f), now, body, h)
				want := tc.want
				if (tokenLike[f.provider] || unsignedBody[f.provider]) && tc.name == "tampered body" {
					want = nil // a plain token covers no byte of the body: DedupeBody's job
				}
				if multiLine[f.provider] && tc.name == "header repeated on two lines" {
					want = nil
				}
				if want == nil {
					require.NoError(t, err)
					return
				}
				require.ErrorIs(t, err, want)
				requireOneSentinel(t, err)
				requireNoLeak(t, err, f.secrets[:], h)
			})
		}
	}
}

func providersOf(fs []fixture) []string {
	names := make([]string, len(fs))
	for i, f := range fs {
		names[i] = f.provider
	}
	return names
}

func TestRoundTripGarbageHeader(t *testing.T) {
	t.Parallel()
	for _, f := range fixtures {
		t.Run(f.provider, func(t *testing.T) {
			t.Parallel()
			h := f.signed(t, f.secrets[0], f.body, now)
			h.Set(f.sigHeader(t), "garbage!!not-a-signature")
			err := f.verify(t, f.secrets[:1], now, f.body, h)
			want := signature.ErrMalformedHeader
			if tokenLike[f.provider] && !formatted[f.provider] { // a token has no format to violate
				want = signature.ErrNoMatchingSignature
			}
			require.ErrorIs(t, err, want)
		})
	}
}

// TestRoundTripTimestamps checks the tolerance boundaries both ways, with
// the default tolerance and a configured one, via the injected clock.
func TestRoundTripTimestamps(t *testing.T) {
	t.Parallel()
	for _, f := range fixtures {
		p := f.preset(t)
		if p.DefaultTolerance == 0 || f.provider == "linear" || f.provider == "pubsub" { // linear: TestLinearBodyTimestamp; pubsub: TestPubSub (iat and exp)
			continue
		}
		for _, tol := range []time.Duration{0, 30 * time.Second} {
			eff := p.DefaultTolerance
			if tol > 0 {
				eff = tol
			}
			cases := []struct {
				name   string
				signed time.Time
				want   error
			}{
				{"now", now, nil},
				{"exactly tolerance old", now.Add(-eff), nil},
				{"exactly tolerance ahead", now.Add(eff), nil},
				{"one second too old", now.Add(-eff - time.Second), signature.ErrTimestampOutOfTolerance},
				{"one second too far ahead", now.Add(eff + time.Second), signature.ErrTimestampOutOfTolerance},
				{"a day old", now.Add(-24 * time.Hour), signature.ErrTimestampOutOfTolerance},
				{"a day ahead", now.Add(24 * time.Hour), signature.ErrTimestampOutOfTolerance},
			}
			for _, tc := range cases {
				t.Run(f.provider+"/tolerance "+eff.String()+"/"+tc.name, func(t *testing.T) {
					t.Parallel()
					h := f.signed(t, f.secrets[0], f.body, tc.signed)
					pub, err := signature.PublicSecret(f.provider, f.secrets[0])
					require.NoError(t, err)
					o := f.options(now, pub)
					o.Tolerance = tol
					v, err := signature.New(f.provider, o)
					require.NoError(t, err)
					err = v.Verify([]byte(f.body), h)
					if tc.want == nil {
						require.NoError(t, err)
						return
					}
					require.ErrorIs(t, err, tc.want)
					requireOneSentinel(t, err)
				})
			}
		}
	}
}

// TestRoundTripSeveralSignatures covers list formats: one header carrying a
// signature per secret, as providers send during a rotation.
func TestRoundTripSeveralSignatures(t *testing.T) {
	t.Parallel()
	for _, f := range fixtures {
		p := f.preset(t)
		if p.Format.List == "" {
			continue
		}
		name := f.sigHeader(t)
		merged := func(t *testing.T, first, second string) http.Header {
			h := f.signed(t, first, f.body, now)
			other := f.signed(t, second, f.body, now).Get(name)
			for entry := range strings.SplitSeq(other, p.Format.List) {
				if strings.HasPrefix(entry, p.Format.SigKey+p.Format.Pair) {
					h.Set(name, h.Get(name)+p.Format.List+entry)
				}
			}
			return h
		}
		t.Run(f.provider+"/old then new", func(t *testing.T) {
			t.Parallel()
			h := merged(t, f.secrets[1], f.secrets[0])
			require.NoError(t, f.verify(t, f.secrets[:1], now, f.body, h))
		})
		t.Run(f.provider+"/none matches", func(t *testing.T) {
			t.Parallel()
			h := merged(t, f.secrets[0], f.secrets[1])
			err := f.verify(t, []string{"whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}, now, f.body, h)
			require.ErrorIs(t, err, signature.ErrNoMatchingSignature)
		})
	}
}
