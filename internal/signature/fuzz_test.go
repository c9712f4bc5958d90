package signature_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// fuzzHeaders fuzzes the named headers of a delivery signed for fx. Seeds
// are the genuine values plus the given malformed ones. Properties: Verify
// never panics, every error wraps exactly one sentinel, and a success only
// ever happens for a body whose signed content is the signed body's
// (Preset.Covered: the bytes, or Twilio's sorted parameters; GitLab's
// plain token binds no body at all).
func fuzzHeaders(f *testing.F, fx fixture, o func(*signature.Options), names []string, bad ...[]string) {
	f.Helper()
	signed := fx.signed(f, fx.secrets[0], fx.body, now)
	opts := fx.options(now, fx.secrets[0])
	if o != nil {
		o(&opts)
	}
	v, err := signature.New(fx.provider, opts)
	require.NoError(f, err)
	preset, ok := signature.Lookup(fx.provider)
	require.True(f, ok)

	seed := func(vals []string, body string) {
		args := []any{body}
		for _, v := range vals {
			args = append(args, v)
		}
		f.Add(args...)
	}
	genuine := make([]string, len(names))
	for i, n := range names {
		genuine[i] = signed.Get(n)
	}
	seed(genuine, fx.body)
	seed(genuine, fx.body+" ")
	for _, b := range bad {
		seed(b, fx.body)
	}

	check := func(t *testing.T, body string, vals []string) {
		h := signed.Clone()
		for i, n := range names {
			h.Set(n, vals[i])
		}
		err := v.Verify([]byte(body), h)
		if err != nil {
			requireOneSentinel(t, err)
			requireNoLeak(t, err, fx.secrets[:1], http.Header{})
			return
		}
		if fx.provider == "gitlab" { // a plain token binds no body: only the token counts
			require.Equal(t, fx.secrets[0], strings.TrimSpace(vals[0]))
			return
		}
		// What the signature covers is the same as for the signed body:
		// the body itself, or (twilio) the sorted parameters, which a body
		// split at other boundaries shares (Preset.Covered).
		require.True(t, bytes.Equal(preset.Covered([]byte(body), h), preset.Covered([]byte(fx.body), signed)),
			"verified a body whose signed content differs: %q", body)
	}
	switch len(names) {
	case 1:
		f.Fuzz(func(t *testing.T, body, a string) { check(t, body, []string{a}) })
	case 2:
		f.Fuzz(func(t *testing.T, body, a, b string) { check(t, body, []string{a, b}) })
	case 3:
		f.Fuzz(func(t *testing.T, body, a, b, c string) { check(t, body, []string{a, b, c}) })
	default:
		f.Fatalf("fuzzHeaders takes 1 to 3 headers")
	}
}

func fixtureFor(tb testing.TB, provider string) fixture {
	for _, f := range fixtures {
		if f.provider == provider {
			return f
		}
	}
	tb.Fatalf("no fixture for %s", provider)
	return fixture{}
}

func FuzzStripeHeader(f *testing.F) {
	fuzzHeaders(f, fixtureFor(f, "stripe"), nil, []string{"Stripe-Signature"},
		[]string{""}, []string{"t=,v1="}, []string{"t=1764547200,t=1764547200,v1=00"},
		[]string{"t=1764547200,v1=zz,v0=00"}, []string{",,,"}, []string{"t=99999999999999999999,v1=00"})
}

func FuzzPaddleHeader(f *testing.F) {
	fuzzHeaders(f, fixtureFor(f, "paddle"), nil, []string{"Paddle-Signature"},
		[]string{"ts=1764547200;h1="}, []string{"h1=00;ts=1764547200"}, []string{"ts=1764547200x;h1=00"}, []string{";;"})
}

func FuzzStandardHeaders(f *testing.F) {
	fuzzHeaders(f, fixtureFor(f, "standard"), nil, []string{"webhook-id", "webhook-timestamp", "webhook-signature"},
		[]string{"msg", "1764547200", "v1a,AAAA v1,"}, []string{"msg", "1764547200.5", "v1,AAAA"}, []string{"", "", "   "})
}

func FuzzSvixHeaders(f *testing.F) {
	fuzzHeaders(f, fixtureFor(f, "svix"), nil, []string{"svix-id", "svix-timestamp", "svix-signature"},
		[]string{"msg", "1764547200000", "v1,AAAA v2,BBBB"})
}

func FuzzGitHubHeaders(f *testing.F) {
	fuzzHeaders(f, fixtureFor(f, "github"), func(o *signature.Options) { o.AllowSHA1 = true },
		[]string{"X-Hub-Signature-256", "X-Hub-Signature"},
		[]string{"sha1=00", "sha256=00"}, []string{"sha256=", "sha1="}, []string{"SHA256=00", ""})
}

func FuzzSlackHeaders(f *testing.F) {
	fuzzHeaders(f, fixtureFor(f, "slack"), nil, []string{"X-Slack-Signature", "X-Slack-Request-Timestamp"},
		[]string{"v0=", "1764547200"}, []string{"v1=00", "+1764547200"}, []string{"v0=zz", "-5"})
}

func FuzzZoomHeaders(f *testing.F) {
	fuzzHeaders(f, fixtureFor(f, "zoom"), nil, []string{"x-zm-signature", "x-zm-request-timestamp"},
		[]string{"v0=", "1764547200"})
}

func FuzzHubSpotHeaders(f *testing.F) {
	fuzzHeaders(f, fixtureFor(f, "hubspot"), nil, []string{"X-HubSpot-Signature-v3", "X-HubSpot-Request-Timestamp"},
		[]string{"AAAA", "1764547200"}, []string{"", "1764547200000"})
}

func FuzzShopifyHeader(f *testing.F) {
	fuzzHeaders(f, fixtureFor(f, "shopify"), nil, []string{"X-Shopify-Hmac-Sha256"},
		[]string{"AAAA"}, []string{"=="}, []string{"fdd64a08bc4206b157c0f9dc4a61d921194edac70a34d134d27bd5f2f8ac7d15"})
}

func FuzzSquareHeader(f *testing.F) {
	fuzzHeaders(f, fixtureFor(f, "square"), nil, []string{"x-square-hmacsha256-signature"}, []string{"sha256=AAAA"})
}

func FuzzPagerDutyHeader(f *testing.F) {
	fuzzHeaders(f, fixtureFor(f, "pagerduty"), nil, []string{"X-PagerDuty-Signature"},
		[]string{"v1=00,v1=11"}, []string{"v1="}, []string{"v2=00"})
}

func FuzzTwilioHeader(f *testing.F) {
	fuzzHeaders(f, fixtureFor(f, "twilio"), nil, []string{"X-Twilio-Signature"},
		[]string{"sha1=AAAA"}, []string{"AAAAAAAAAAAAAAAAAAAAAAAAAAA="})
}

func FuzzHMACHeader(f *testing.F) {
	fx := fixtureFor(f, "hmac")
	fx.hmac = signature.HMACOptions{Header: "X-Signature", Prefix: "sha256=", Encoding: "base64"}
	fuzzHeaders(f, fx, nil, []string{"X-Signature"}, []string{"sha256="}, []string{"sha256=AAAA"})
}

func FuzzGitLabToken(f *testing.F) {
	fuzzHeaders(f, fixtureFor(f, "gitlab"), nil, []string{"X-Gitlab-Token"}, []string{"gl-token"})
}

func FuzzRecurlyHeader(f *testing.F) {
	fuzzHeaders(f, fixtureFor(f, "recurly"), nil, []string{"recurly-signature"},
		[]string{"1764547200000"}, []string{",,,"}, []string{"1764547200000,zz,"})
}

func FuzzRevolutHeaders(f *testing.F) {
	fuzzHeaders(f, fixtureFor(f, "revolut"), nil, []string{"Revolut-Signature", "Revolut-Request-Timestamp"},
		[]string{"v1=", "1764547200000"}, []string{"v1=00,v1=", "-1"})
}

// FuzzAdyenBody: whatever the body, a delivery Adyen's verifier accepts
// carries, for each item as encoding/json reads it (the last of a
// repeated member, as an upstream in Go or JavaScript would), exactly the
// signed fields of an item that was signed.
func FuzzAdyenBody(f *testing.F) {
	signed, _ := signAdyen(f, adyenBody, adyenKey)
	f.Add(signed)
	f.Add(strings.Replace(signed, `"value":1000`, `"value":1000.0`, 1))
	f.Add(strings.Replace(signed, `"eventCode":"CAPTURE"`, `"eventCode":"CAPTURE","eventCode":"REFUND"`, 1))
	f.Add(strings.Replace(signed, `"pspReference"`, `"pspReference":"1","pspReference"`, 1))
	v, err := signature.New("adyen", signature.Options{Secrets: []string{adyenKey}})
	require.NoError(f, err)
	fields := func(t testing.TB, body string) [][6]string {
		var d struct {
			NotificationItems []struct {
				NotificationRequestItem map[string]any
			} `json:"notificationItems"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &d), "an accepted body is JSON")
		var out [][6]string
		for _, it := range d.NotificationItems {
			n := it.NotificationRequestItem
			amount, _ := n["amount"].(map[string]any)
			out = append(out, [6]string{fmt.Sprint(n["pspReference"]), fmt.Sprint(n["merchantReference"]), fmt.Sprint(amount["value"]),
				fmt.Sprint(amount["currency"]), fmt.Sprint(n["eventCode"]), fmt.Sprint(n["success"])})
		}
		return out
	}
	want := fields(f, signed)
	f.Fuzz(func(t *testing.T, body string) {
		if err := v.Verify([]byte(body), http.Header{}); err != nil {
			requireOneSentinel(t, err)
			return
		}
		for _, got := range fields(t, body) {
			require.Contains(t, want, got, "an accepted item carries fields that were not signed together")
		}
	})
}
