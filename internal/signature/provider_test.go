package signature_test

import (
	"crypto/hmac"
	"crypto/sha1" //nolint:gosec // building legacy signatures for tests
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

func hmacHex(key, msg string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(msg))
	return hex.EncodeToString(m.Sum(nil))
}

func hmacSHA1Hex(key, msg string) string {
	m := hmac.New(sha1.New, []byte(key))
	m.Write([]byte(msg))
	return hex.EncodeToString(m.Sum(nil))
}

func hmacB64(key []byte, msg string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

func verify(t *testing.T, provider string, o signature.Options, body string, h http.Header) error {
	t.Helper()
	if o.Now == nil {
		o.Now = clock(now)
	}
	v, err := signature.New(provider, o)
	require.NoError(t, err)
	err = v.Verify([]byte(body), h)
	if err != nil {
		requireOneSentinel(t, err)
		requireNoLeak(t, err, o.Secrets, h)
	}
	return err
}

func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// TestStripeHeaderParsing follows CASES.md BR-03 and BR-04.
func TestStripeHeaderParsing(t *testing.T) {
	t.Parallel()
	const (
		sOld = "whsec_old_BR03"
		sNew = "whsec_new_BR03"
	)
	body := `{"id":"evt_BR03_1","object":"event","type":"invoice.paid"}`
	ts := strconv.FormatInt(now.Unix(), 10)
	old := strconv.FormatInt(now.Add(-time.Hour).Unix(), 10)
	sig := func(secret, ts string) string { return hmacHex(secret, ts+"."+body) }
	cases := []struct {
		name    string
		secrets []string
		value   []string
		body    string
		want    error
	}{
		{"a: old then new, new configured", []string{sNew}, []string{"t=" + ts + ",v1=" + sig(sOld, ts) + ",v1=" + sig(sNew, ts)}, body, nil},
		{"b: new then old", []string{sNew}, []string{"t=" + ts + ",v1=" + sig(sNew, ts) + ",v1=" + sig(sOld, ts)}, body, nil},
		{"c: rotation, new signature only", []string{sOld, sNew}, []string{"t=" + ts + ",v1=" + sig(sNew, ts)}, body, nil},
		{"d: only v0 is valid", []string{sNew}, []string{"t=" + ts + ",v0=" + sig(sNew, ts) + ",v1=" + strings.Repeat("0", 64)}, body, signature.ErrNoMatchingSignature},
		{"e: two t, fresh first", []string{sNew}, []string{"t=" + ts + ",t=" + old + ",v1=" + sig(sNew, old)}, body, signature.ErrMalformedHeader},
		{"e: two t, stale first", []string{sNew}, []string{"t=" + old + ",t=" + ts + ",v1=" + sig(sNew, old)}, body, signature.ErrMalformedHeader},
		{"f: two header lines", []string{sNew}, []string{"t=" + ts + ",v1=" + sig(sNew, ts), "garbage"}, body, signature.ErrMalformedHeader},
		{"spaces after commas", []string{sNew}, []string{"t=" + ts + ", v1=" + sig(sNew, ts)}, body, nil},
		{"upper-case hex", []string{sNew}, []string{"t=" + ts + ",v1=" + strings.ToUpper(sig(sNew, ts))}, body, nil},
		{"undecodable v1 skipped", []string{sNew}, []string{"t=" + ts + ",v1=zz,v1=" + sig(sNew, ts)}, body, nil},
		{"only undecodable v1", []string{sNew}, []string{"t=" + ts + ",v1=zz"}, body, signature.ErrMalformedHeader},
		{"no v1 at all", []string{sNew}, []string{"t=" + ts}, body, signature.ErrMalformedHeader},
		{"BR-04 e: t=abc", []string{sNew}, []string{"t=abc,v1=" + sig(sNew, "abc")}, body, signature.ErrMalformedHeader},
		{"negative t", []string{sNew}, []string{"t=-1,v1=" + sig(sNew, "-1")}, body, signature.ErrMalformedHeader},
		{"BR-04 d: milliseconds", []string{sNew}, []string{"t=" + ts + "000,v1=" + sig(sNew, ts+"000")}, body, signature.ErrTimestampOutOfTolerance},
		{"BR-04 c: 301 s ahead", []string{sNew}, []string{"t=" + strconv.FormatInt(now.Unix()+301, 10) + ",v1=" + sig(sNew, strconv.FormatInt(now.Unix()+301, 10))}, body, signature.ErrTimestampOutOfTolerance},
		{"secret without whsec_ is another key", []string{strings.TrimPrefix(sNew, "whsec_")}, []string{"t=" + ts + ",v1=" + sig(sNew, ts)}, body, signature.ErrNoMatchingSignature},
		{"signed body that is not JSON", []string{sNew}, []string{"t=" + ts + ",v1=" + hmacHex(sNew, ts+".not json")}, "not json", signature.ErrBodyNotJSON},
		{"signed empty body", []string{sNew}, []string{"t=" + ts + ",v1=" + hmacHex(sNew, ts+".")}, "", signature.ErrBodyNotJSON},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			for _, v := range tc.value {
				h.Add("stripe-signature", v)
			}
			err := verify(t, "stripe", signature.Options{Secrets: tc.secrets}, tc.body, h)
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
		})
	}
}

// TestGitHubSHA1 follows CASES.md BR-09: the SHA-1 header never overrides
// the SHA-256 one and counts only with AllowSHA1.
func TestGitHubSHA1(t *testing.T) {
	t.Parallel()
	const secret = "gh_BR09"
	body := `{"zen":"Keep it logically awesome.","hook_id":9}`
	good256 := "sha256=" + hmacHex(secret, body)
	good1 := "sha1=" + hmacSHA1Hex(secret, body)
	bad256 := "sha256=" + strings.Repeat("ab", 32)
	bad1 := "sha1=" + strings.Repeat("ab", 20)
	cases := []struct {
		name  string
		h     http.Header
		allow bool
		want  error
	}{
		{"a: both valid", header("X-Hub-Signature-256", good256, "X-Hub-Signature", good1), false, nil},
		{"b: valid 256, garbage sha1", header("X-Hub-Signature-256", good256, "X-Hub-Signature", bad1), false, nil},
		{"c: garbage 256, valid sha1", header("X-Hub-Signature-256", bad256, "X-Hub-Signature", good1), false, signature.ErrNoMatchingSignature},
		{"c: garbage 256, valid sha1, allow_sha1", header("X-Hub-Signature-256", bad256, "X-Hub-Signature", good1), true, signature.ErrNoMatchingSignature},
		{"d: only sha1, default", header("X-Hub-Signature", good1), false, signature.ErrMissingHeader},
		{"e: only sha1, allow_sha1", header("X-Hub-Signature", good1), true, nil},
		{"e: only bad sha1, allow_sha1", header("X-Hub-Signature", bad1), true, signature.ErrNoMatchingSignature},
		{"only sha1 repeated, allow_sha1", header("X-Hub-Signature", good1, "X-Hub-Signature", good1), true, signature.ErrMalformedHeader},
		{"sha256 header holding a sha1 signature", header("X-Hub-Signature-256", good1), true, signature.ErrMalformedHeader},
		{"f: no signature header", header("X-GitHub-Delivery", "d1"), true, signature.ErrMissingHeader},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := verify(t, "github", signature.Options{Secrets: []string{secret}, AllowSHA1: tc.allow}, body, tc.h)
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
		})
	}
}

// TestStandardWebhooks follows CASES.md BR-12.
func TestStandardWebhooks(t *testing.T) {
	t.Parallel()
	rawKey := []byte("BR12-test-key-0123456789abcdef!!")
	secret := "whsec_" + base64.StdEncoding.EncodeToString(rawKey)
	body := `{"type":"user.created","data":{"id":"user_BR12"}}`
	ts := strconv.FormatInt(now.Unix(), 10)
	good := "v1," + hmacB64(rawKey, "msg_BR12_1."+ts+"."+body)
	random64 := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("r", 64)))
	zeros := base64.StdEncoding.EncodeToString(make([]byte, 32))
	withNames := func(prefix, sig string) http.Header {
		return header(prefix+"-id", "msg_BR12_1", prefix+"-timestamp", ts, prefix+"-signature", sig)
	}
	cases := []struct {
		name     string
		provider string
		secret   string
		h        http.Header
		want     error
	}{
		{"a: valid", "standard", secret, withNames("webhook", good), nil},
		{"b: v1a and a zero v1 skipped", "standard", secret, withNames("webhook", "v1a,"+random64+" v1,"+zeros+" "+good), nil},
		{"c: only v1a fails closed", "standard", secret, withNames("webhook", "v1a,"+random64), signature.ErrMalformedHeader},
		{"d: key was the whole whsec_ string", "standard", secret, withNames("webhook", "v1,"+hmacB64([]byte(secret), "msg_BR12_1."+ts+"."+body)), signature.ErrNoMatchingSignature},
		{"e: svix names on standard", "standard", secret, withNames("svix", good), nil},
		{"e: webhook names on svix", "svix", secret, withNames("webhook", good), nil},
		{"f: id changed", "standard", secret, header("webhook-id", "msg_BR12_other", "webhook-timestamp", ts, "webhook-signature", good), signature.ErrNoMatchingSignature},
		{"secret without whsec_ prefix", "standard", strings.TrimPrefix(secret, "whsec_"), withNames("webhook", good), nil},
		{"junk entries skipped", "standard", secret, withNames("webhook", "junk  "+good+" v2,abc"), nil},
		{"missing id", "standard", secret, header("webhook-timestamp", ts, "webhook-signature", good), signature.ErrMissingHeader},
		{"id on two lines", "standard", secret, header("webhook-id", "msg_BR12_1", "webhook-id", "msg_BR12_1", "webhook-timestamp", ts, "webhook-signature", good), signature.ErrMalformedHeader},
		{"mixed families take the preferred one", "standard", secret, header("webhook-id", "msg_BR12_1", "svix-timestamp", ts, "svix-signature", good), signature.ErrMissingHeader},
		{"g: 301 s old", "standard", secret, header("webhook-id", "msg_BR12_1", "webhook-timestamp", strconv.FormatInt(now.Unix()-301, 10),
			"webhook-signature", "v1,"+hmacB64(rawKey, "msg_BR12_1."+strconv.FormatInt(now.Unix()-301, 10)+"."+body)), signature.ErrTimestampOutOfTolerance},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := verify(t, tc.provider, signature.Options{Secrets: []string{tc.secret}}, body, tc.h)
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
		})
	}
}

// TestSlackFormBody follows CASES.md BR-13: the form body is hashed raw; a
// re-encoded body fails.
func TestSlackFormBody(t *testing.T) {
	t.Parallel()
	const secret = "slack_BR13"
	body := "team_id=T0BR13&command=%2Fdeploy&text=%2Abold%2A+caf%C3%A9+a%26b&trigger_id=BR13.trigger.0001"
	ts := strconv.FormatInt(now.Unix(), 10)
	h := header("X-Slack-Request-Timestamp", ts, "X-Slack-Signature", "v0="+hmacHex(secret, "v0:"+ts+":"+body))
	require.NoError(t, verify(t, "slack", signature.Options{Secrets: []string{secret}}, body, h))
	rebuilt := strings.Replace(body, "%2Abold%2A", "*bold*", 1)
	require.ErrorIs(t, verify(t, "slack", signature.Options{Secrets: []string{secret}}, rebuilt, h), signature.ErrNoMatchingSignature)
}

// TestPaddle covers several h1 entries (BR-03 h) and field order.
func TestPaddle(t *testing.T) {
	t.Parallel()
	const secret = "pdl_ntfset_01BR03"
	body := `{"event_id":"evt_01BR03","event_type":"transaction.paid"}`
	ts := strconv.FormatInt(now.Unix(), 10)
	good := hmacHex(secret, ts+":"+body)
	bad := strings.Repeat("0", 64)
	for _, tc := range []struct {
		name, value string
		want        error
	}{
		{"h: bad then good h1", "ts=" + ts + ";h1=" + bad + ";h1=" + good, nil},
		{"fields reordered", "h1=" + good + ";ts=" + ts, nil},
		{"two ts", "ts=" + ts + ";ts=" + ts + ";h1=" + good, signature.ErrMalformedHeader},
		{"no ts", "h1=" + good, signature.ErrMalformedHeader},
		{"comma separated", "ts=" + ts + ",h1=" + good, signature.ErrMalformedHeader},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := verify(t, "paddle", signature.Options{Secrets: []string{secret}}, body, header("Paddle-Signature", tc.value))
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
		})
	}
}

// TestURLSigned follows CASES.md BR-15: only the configured URL counts.
func TestURLSigned(t *testing.T) {
	t.Parallel()
	const (
		twToken  = "tw_BR15"
		twURL    = "https://hooks.example.test/twilio/sms?tenant=a"
		twBody   = "AccountSid=AC_BR15&Body=Hello&From=%2B15550000001&MessageSid=SM_BR15_0001&To=%2B15550000002"
		sqKey    = "sq_sig_BR15"
		sqURL    = "https://hooks.example.test/square/webhook"
		sqBody   = `{"merchant_id":"M_BR15","type":"payment.updated","event_id":"6a8f5f28-0000-4000-8000-0000000015aa"}`
		twParams = "AccountSidAC_BR15BodyHelloFrom+15550000001MessageSidSM_BR15_0001To+15550000002"
	)
	twSig := func(u, params string) string {
		m := hmac.New(sha1.New, []byte(twToken))
		m.Write([]byte(u + params))
		return base64.StdEncoding.EncodeToString(m.Sum(nil))
	}
	form := "application/x-www-form-urlencoded"
	cases := []struct {
		name, provider, url, body string
		secret                    string
		h                         http.Header
		want                      error
	}{
		{"a: twilio as configured", "twilio", twURL, twBody, twToken, header("X-Twilio-Signature", twSig(twURL, twParams), "Content-Type", form, "Host", "10.0.0.5:8080"), nil},
		{"b: twilio signed with :443", "twilio", twURL, twBody, twToken, header("X-Twilio-Signature", twSig("https://hooks.example.test:443/twilio/sms?tenant=a", twParams), "Content-Type", form), nil},
		{"b: configured with :443, signed without", "twilio", "https://hooks.example.test:443/twilio/sms?tenant=a", twBody, twToken, header("X-Twilio-Signature", twSig(twURL, twParams), "Content-Type", form), nil},
		{"c: twilio signed for a forwarded host", "twilio", twURL, twBody, twToken, header("X-Twilio-Signature", twSig("https://evil.example/twilio/sms?tenant=a", twParams), "X-Forwarded-Host", "evil.example", "Content-Type", form), signature.ErrNoMatchingSignature},
		{"twilio other port is another URL", "twilio", twURL, twBody, twToken, header("X-Twilio-Signature", twSig("https://hooks.example.test:8443/twilio/sms?tenant=a", twParams), "Content-Type", form), signature.ErrNoMatchingSignature},
		{"twilio form reordered", "twilio", twURL, "To=%2B15550000002&" + strings.TrimSuffix(twBody, "&To=%2B15550000002"), twToken, header("X-Twilio-Signature", twSig(twURL, twParams), "Content-Type", form), nil},
		{"twilio extra repeated value", "twilio", twURL, twBody + "&Body=Injected", twToken, header("X-Twilio-Signature", twSig(twURL, twParams), "Content-Type", form), signature.ErrNoMatchingSignature},
		{
			"twilio JSON body gets bodySHA256 appended", "twilio", twURL, sqBody, twToken,
			header("X-Twilio-Signature", twSig(twURL+"&bodySHA256="+sha256Hex(sqBody), ""), "Content-Type", "application/json"), nil,
		},
		{
			"twilio JSON body tampered", "twilio", twURL, sqBody + " ", twToken,
			header("X-Twilio-Signature", twSig(twURL+"&bodySHA256="+sha256Hex(sqBody), ""), "Content-Type", "application/json"), signature.ErrNoMatchingSignature,
		},
		{"d: square as configured", "square", sqURL, sqBody, sqKey, header("x-square-hmacsha256-signature", hmacB64([]byte(sqKey), sqURL+sqBody)), nil},
		{"e: square configured with a trailing slash", "square", sqURL + "/", sqBody, sqKey, header("x-square-hmacsha256-signature", hmacB64([]byte(sqKey), sqURL+sqBody)), signature.ErrNoMatchingSignature},
		{"square forwarded host ignored", "square", sqURL, sqBody, sqKey, header("x-square-hmacsha256-signature", hmacB64([]byte(sqKey), "https://evil.example/square/webhook"+sqBody), "X-Forwarded-Host", "evil.example"), signature.ErrNoMatchingSignature},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := verify(t, tc.provider, signature.Options{Secrets: []string{tc.secret}, URL: tc.url}, tc.body, tc.h)
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
		})
	}
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestHMACOptions covers the user-described scheme.
func TestHMACOptions(t *testing.T) {
	t.Parallel()
	const secret = "gen_BR16"
	body := `{"type":"message.new","message":{"id":"m_BR16_0001"}}`
	cases := []struct {
		name  string
		hmac  signature.HMACOptions
		value string
	}{
		{"defaults: sha256 hex", signature.HMACOptions{Header: "X-Signature"}, hmacHex(secret, body)},
		{"prefix", signature.HMACOptions{Header: "X-Signature", Prefix: "sha256="}, "sha256=" + hmacHex(secret, body)},
		{"base64", signature.HMACOptions{Header: "X-Signature", Encoding: "base64"}, hmacB64([]byte(secret), body)},
		{"sha1", signature.HMACOptions{Header: "X-Signature", Algorithm: "sha1"}, hmacSHA1Hex(secret, body)},
		{"upper-case option values", signature.HMACOptions{Header: "x-signature", Algorithm: "SHA256", Encoding: "HEX"}, hmacHex(secret, body)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := signature.Options{Secrets: []string{secret}, HMAC: tc.hmac}
			require.NoError(t, verify(t, "hmac", o, body, header(tc.hmac.Header, tc.value)))
			require.ErrorIs(t, verify(t, "hmac", o, body+"\n", header(tc.hmac.Header, tc.value)), signature.ErrNoMatchingSignature)
		})
	}
	t.Run("sha512 round trip", func(t *testing.T) {
		t.Parallel()
		o := signature.Options{Secrets: []string{secret}, HMAC: signature.HMACOptions{Header: "X-Sig", Algorithm: "sha512", Encoding: "base64", Prefix: "v1="}}
		h := http.Header{}
		require.NoError(t, signature.Sign("hmac", o, []byte(body), h, now))
		require.True(t, strings.HasPrefix(h.Get("X-Sig"), "v1="))
		require.NoError(t, verify(t, "hmac", o, body, h))
	})
	t.Run("missing prefix", func(t *testing.T) {
		t.Parallel()
		o := signature.Options{Secrets: []string{secret}, HMAC: signature.HMACOptions{Header: "X-Sig", Prefix: "sha256="}}
		require.ErrorIs(t, verify(t, "hmac", o, body, header("X-Sig", hmacHex(secret, body))), signature.ErrMalformedHeader)
	})
}

// TestGitLabToken covers the plain-token scheme.
func TestGitLabToken(t *testing.T) {
	t.Parallel()
	o := signature.Options{Secrets: []string{"gl-old", "gl-new"}}
	require.NoError(t, verify(t, "gitlab", o, "{}", header("X-Gitlab-Token", "gl-new")))
	require.NoError(t, verify(t, "gitlab", o, "{}", header("X-Gitlab-Token", "gl-old")))
	require.ErrorIs(t, verify(t, "gitlab", o, "{}", header("X-Gitlab-Token", "gl-ne")), signature.ErrNoMatchingSignature)
	require.ErrorIs(t, verify(t, "gitlab", o, "{}", header("X-Gitlab-Token", "gl-new", "X-Gitlab-Token", "gl-new")), signature.ErrMalformedHeader)
	require.ErrorIs(t, verify(t, "gitlab", o, "{}", header()), signature.ErrMissingHeader)
}

func TestNewErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		provider string
		o        signature.Options
		want     string
	}{
		{"unknown provider", "nope", signature.Options{Secrets: []string{"s"}}, `unknown provider "nope" (known: `},
		{"no secret", "stripe", signature.Options{}, "at least one secret is required"},
		{"empty secret", "stripe", signature.Options{Secrets: []string{"a", ""}}, "secret 2 is empty"},
		{"negative tolerance", "stripe", signature.Options{Secrets: []string{"s"}, Tolerance: -time.Second}, "tolerance must not be negative"},
		{"square without url", "square", signature.Options{Secrets: []string{"s"}}, "url is required"},
		{"twilio with a relative url", "twilio", signature.Options{Secrets: []string{"s"}, URL: "/twilio"}, "url must be an absolute http or https URL"},
		{"allow_sha1 elsewhere", "stripe", signature.Options{Secrets: []string{"s"}, AllowSHA1: true}, "allow_sha1 applies only to provider github"},
		{"scheme overrides on a bespoke scheme", "gitlab", signature.Options{Secrets: []string{"s"}, HMAC: signature.HMACOptions{Header: "X"}}, "cannot be overridden"},
		{"hmac without header", "hmac", signature.Options{Secrets: []string{"s"}}, "hmac header is required"},
		{"hmac bad header", "hmac", signature.Options{Secrets: []string{"s"}, HMAC: signature.HMACOptions{Header: "X Sig:"}}, "is not a valid header name"},
		{"hmac unknown algorithm", "hmac", signature.Options{Secrets: []string{"s"}, HMAC: signature.HMACOptions{Header: "X", Algorithm: "md5"}}, `unknown algorithm "md5"`},
		{"hmac unknown encoding", "hmac", signature.Options{Secrets: []string{"s"}, HMAC: signature.HMACOptions{Header: "X", Encoding: "base32"}}, `unknown encoding "base32"`},
		{"whsec secret not base64", "standard", signature.Options{Secrets: []string{"whsec_not*base64!"}}, "secret 1 is not base64"},
		{"whsec secret empty key", "svix", signature.Options{Secrets: []string{"whsec_"}}, "secret 1 decodes to an empty key"},
		{"stripe secret API key", "stripe", signature.Options{Secrets: []string{"whsec_current", "sk_live_51Habcdef"}},
			"secret 2 is a secret API key (sk_…), not the signing secret: the webhook endpoint's signing secret, `whsec_…`"},
		{"stripe restricted key", "stripe", signature.Options{Secrets: []string{"rk_test_51Habcdef"}}, "secret 1 is a restricted API key (rk_…)"},
		{"stripe publishable key", "stripe", signature.Options{Secrets: []string{"pk_test_51Habcdef"}}, "secret 1 is a publishable API key (pk_…)"},
		{"github personal access token", "github", signature.Options{Secrets: []string{"ghp_16C7e42F292c6912E7710c838347Ae178B4a"}},
			"secret 1 is a personal access token (ghp_…), not the signing secret: the webhook's secret as typed in its settings"},
		{"github fine-grained token", "github", signature.Options{Secrets: []string{"ok", "github_pat_11ABCDEFG0123456789_abcdef"}},
			"secret 2 is a fine-grained personal access token (github_pat_…)"},
		{"secret with a trailing space", "stripe", signature.Options{Secrets: []string{"whsec_pasted "}}, "secret 1 has whitespace before or after it"},
		{"secret with a line break", "github", signature.Options{Secrets: []string{"gh-secret\n"}}, "secret 1 has whitespace before or after it"},
		{"secret in double quotes", "stripe", signature.Options{Secrets: []string{`"whsec_quoted"`}}, "secret 1 is in quotes: remove them"},
		{"secret in single quotes", "github", signature.Options{Secrets: []string{"ok", `'gh-quoted'`}}, "secret 2 is in quotes: remove them"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := signature.New(tc.provider, tc.o)
			require.ErrorContains(t, err, tc.want)
			for _, s := range tc.o.Secrets {
				if len(s) > 2 {
					require.NotContains(t, err.Error(), s)
				}
			}
			require.Error(t, signature.Sign(tc.provider, tc.o, nil, http.Header{}, now))
		})
	}
}

func TestSignNeedsID(t *testing.T) {
	t.Parallel()
	o := signature.Options{Secrets: []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}
	require.ErrorContains(t, signature.Sign("standard", o, []byte("{}"), http.Header{}, now), "needs header webhook-id")
}

// TestHandshakeDiscriminator: a signed handshake is recognised by its
// discriminator member, given once in its object (after unescaping, or
// ignoring case: a repeated one is no handshake, the upstream may read the
// other value), with a value of the type the provider sends (Discord's
// type is the number 1).
func TestHandshakeDiscriminator(t *testing.T) {
	t.Parallel()
	cases := []struct {
		provider, body string
		want           bool
	}{
		{"slack", `{"token":"placeholder","challenge":"BR19challenge","type":"url_verification"}`, true},
		{"slack", `{"type":"event_callback","event_id":"Ev1"}`, false},
		{"slack", `token=x&type=url_verification`, false},
		{"zoom", `{"event":"endpoint.url_validation","payload":{"plainToken":"BR19plainTokenA"},"event_ts":1700000000000}`, true},
		{"zoom", `{"event":"meeting.started","payload":{}}`, false},
		{"zoom", `not json`, false},
		{"discord", `{"type":1,"id":"1"}`, true},
		{"discord", `{"type":2,"id":"1"}`, false},
		// A discriminator given twice is no handshake: the upstream may
		// read the other value (issue 10, item 5's kind of fault).
		{"discord", `{"type":1,"id":"1","type":2}`, false},
		{"discord", `{"type":2,"id":"1","t\u0079pe":1}`, false},
		{"discord", `{"type":1,"TYPE":2}`, false},
		{"discord", `{"type":"1"}`, false},
		{"discord", `{"type":1.0}`, false},
		{"slack", `{"type":"url_verification","challenge":"c","type":"event_callback"}`, false},
		{"slack", `{"type":"event_callback","Type":"url_verification"}`, false},
		{"slack", `{"typ\u0065":"url_verification","challenge":"c"}`, true},
		{"slack", `{"type":"url_\u0076erification","challenge":"c"}`, true},
		{"zoom", `{"event":"endpoint.url_validation","event":"meeting.started"}`, false},
		{"zoom", `{"event":"endpoint.url_validation","payload":{"plainToken":"p","event":"x","event":"y"}}`, true},
		{"xero", `{"events":[],"firstEventSequence":0}`, true},
		{"xero", `{"events":[],"events":[{"resourceId":"r"}]}`, false},
		{"xero", `{"events":[{"resourceId":"r"}]}`, false},
		{"asana", `{"events":{}}`, false},
	}
	for _, tc := range cases {
		t.Run(tc.provider+"/"+tc.body, func(t *testing.T) {
			t.Parallel()
			p, ok := signature.Lookup(tc.provider)
			require.True(t, ok)
			r := httptest.NewRequest(http.MethodPost, "/wh", strings.NewReader(tc.body))
			a, ok := p.MatchHandshake(r, []byte(tc.body), "zoom-secret")
			require.Equal(t, tc.want, ok)
			if ok {
				require.Equal(t, signature.AuthSignature, a.Challenge.Auth)
				require.Empty(t, a.Incomplete)
			}
		})
	}
}

// documentedTolerance are the presets whose provider (or its official
// library) sets a tolerance other than five minutes.
var documentedTolerance = map[string]time.Duration{
	"linear":   time.Minute,      // @linear/sdk LINEAR_WEBHOOK_TS_FIELD check: 60 s
	"calendly": 3 * time.Minute,  // Calendly's guide
	"workos":   3 * time.Minute,  // @workos-inc/node default 180 s
	"twitch":   10 * time.Minute, // Twitch EventSub guide
	"box":      10 * time.Minute, // Box SDKs' maximum message age
	// cloudinary verifyNotificationSignature's valid_for default: 7,200 s
	"cloudinary": 2 * time.Hour,
}

// TestPresetData checks the table the README is generated from.
func TestPresetData(t *testing.T) {
	t.Parallel()
	names := signature.Providers()
	require.IsNonDecreasing(t, names)
	for _, want := range []string{"stripe", "github", "standard", "hmac", "shopify", "slack", "paddle", "square", "svix", "twilio", "razorpay"} {
		require.Contains(t, names, want)
	}
	defaults := map[string][]string{
		"stripe":   {"json id"},
		"github":   {"header X-GitHub-Delivery"},
		"shopify":  {"header X-Shopify-Event-Id", "header X-Shopify-Webhook-Id"},
		"standard": {"header webhook-id", "header svix-id"},
		"slack":    {"json event_id"},
		"paddle":   {"json event_id"},
		"square":   {"json event_id"},
		"hmac":     nil,
		"twilio":   {"header I-Twilio-Idempotency-Token"},
		"razorpay": {"header X-Razorpay-Event-Id"},
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p, ok := signature.Lookup(name)
			require.True(t, ok)
			require.Equal(t, name, p.Name)
			require.True(t, strings.HasPrefix(p.Doc, "https://"), p.Doc)
			require.NotEmpty(t, p.SignatureHeader)
			require.NotEmpty(t, p.Signed)
			require.Contains(t, []string{"sha1", "sha256", "sha512", "ed25519", "ecdsa-p256", "rsa-sha256", "rsa-sha1|rsa-sha256", "ecdsa-p256-sha256", ""}, p.Algorithm)
			require.Contains(t, []string{"hex", "base64", "base64url", "jwt", ""}, p.Encoding)
			if want, ok := defaults[name]; ok {
				require.Equal(t, want, p.EventID)
			}
			signedID := false
			for _, src := range p.EventID {
				kind, rest, ok := strings.Cut(src, " ")
				require.True(t, ok && rest != "" && (kind == "json" || kind == "header" || kind == "form_sha256" || kind == "jws"), src)
				// The hash of a signed field, unless the signature takes the
				// field in two forms (braintree's bt_payload with or without
				// its trailing newline): two IDs for one notification.
				if kind == "jws" && p.Algorithm != "" {
					signedID = true
				}
				if kind == "json" && p.Algorithm != "" && p.Name != "mailgun" {
					signedID = true // the body is signed (not by a token or Mailgun's timestamp+token)
				}
				for _, hs := range p.Headers {
					if kind == "header" && strings.EqualFold(rest, hs.ID) {
						signedID = true
					}
				}
			}
			if p.Batch != nil && signedItemIDs[name] {
				signedID = true // each item's ID is among its signed fields
			}
			hasTS := p.DefaultTolerance > 0
			require.Equal(t, !hasTS && !signedID, p.DedupeBody, "DedupeBody rule (README \"Providers\")")
			if hasTS {
				// Five minutes unless the provider documents another bound.
				want, ok := documentedTolerance[name]
				if !ok {
					want = 5 * time.Minute
				}
				require.Equal(t, want, p.DefaultTolerance)
			}
		})
	}
}

func TestLookupReturnsACopy(t *testing.T) {
	t.Parallel()
	p, ok := signature.Lookup("shopify")
	require.True(t, ok)
	p.EventID[0] = "header Mutated"
	p.Headers[0].Signature = "Mutated"
	q, _ := signature.Lookup("shopify")
	require.Equal(t, "header X-Shopify-Event-Id", q.EventID[0])
	require.Equal(t, "X-Shopify-Hmac-Sha256", q.Headers[0].Signature)
	_, ok = signature.Lookup("nope")
	require.False(t, ok)
}

// TestConcurrentVerify exercises one Verifier from many goroutines (run
// with -race).
func TestConcurrentVerify(t *testing.T) {
	t.Parallel()
	f := fixtures[0]
	v, err := signature.New(f.provider, f.options(now, f.secrets[:]...))
	require.NoError(t, err)
	errs := make(chan error, 16)
	for i := range 16 {
		body := fmt.Sprintf(`{"id":"evt_%d"}`, i)
		h := f.signed(t, f.secrets[i%2], body, now)
		go func() { errs <- v.Verify([]byte(body), h) }()
	}
	for range 16 {
		require.NoError(t, <-errs)
	}
}

// A preset's scheme fields can be overridden (the Caddyfile's
// `provider <name> { header ... }`), e.g. for a provider that renamed its
// header or a proxy in between that did.
func TestPresetOverride(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_764_547_200, 0)
	body := []byte(`{"id":"evt_override"}`)
	opts := signature.Options{
		Secrets: []string{"whsec_override"},
		HMAC:    signature.HMACOptions{Header: "X-Relayed-Signature"},
		Now:     func() time.Time { return now },
	}
	h := http.Header{}
	require.NoError(t, signature.Sign("stripe", opts, body, h, now))
	require.NotEmpty(t, h.Get("X-Relayed-Signature"))
	require.Empty(t, h.Get("Stripe-Signature"))
	v, err := signature.New("stripe", opts)
	require.NoError(t, err)
	require.NoError(t, v.Verify(body, h))

	// The stock header is no longer read.
	plain := http.Header{}
	require.NoError(t, signature.Sign("stripe", signature.Options{Secrets: opts.Secrets, Now: opts.Now}, body, plain, now))
	require.ErrorIs(t, v.Verify(body, plain), signature.ErrMissingHeader)

	// Encoding override: github signing base64 instead of hex.
	gopts := signature.Options{Secrets: []string{"gh"}, HMAC: signature.HMACOptions{Encoding: "base64"}}
	gh := http.Header{}
	require.NoError(t, signature.Sign("github", gopts, body, gh, now))
	gv, err := signature.New("github", gopts)
	require.NoError(t, err)
	require.NoError(t, gv.Verify(body, gh))
	stock, err := signature.New("github", signature.Options{Secrets: []string{"gh"}})
	require.NoError(t, err)
	require.Error(t, stock.Verify(body, gh))

	_, err = signature.New("twilio", signature.Options{Secrets: []string{"t"}, URL: "https://x.test/", HMAC: signature.HMACOptions{Header: "X"}})
	require.ErrorContains(t, err, "cannot be overridden")
	_, err = signature.New("stripe", signature.Options{Secrets: []string{"s"}, HMAC: signature.HMACOptions{Algorithm: "md5"}})
	require.Error(t, err)
}

// signedItemIDs are the batching presets whose item IDs are among each
// item's signed fields (Adyen signs pspReference, eventCode and success).
var signedItemIDs = map[string]bool{"adyen": true}
