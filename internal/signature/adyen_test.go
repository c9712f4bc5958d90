package signature_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

const (
	adyenKey    = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056"
	adyenKeyOld = "0A1B2C3D4E5F60718293A4B5C6D7E8F90A1B2C3D4E5F60718293A4B5C6D7E8F9"
	// adyenBody is an Adyen standard webhook with two items, unsigned.
	adyenBody = `{"live":"false","notificationItems":[` +
		`{"NotificationRequestItem":{"additionalData":{"authCode":"58747"},"amount":{"currency":"EUR","value":1000},"eventCode":"AUTHORISATION","eventDate":"2025-12-01T00:00:00+01:00","merchantAccountCode":"TestMerchant","merchantReference":"order-1","paymentMethod":"visa","pspReference":"7914073381342284","reason":"58747:1111:03/2030","success":"true"}},` +
		`{"NotificationRequestItem":{"additionalData":{},"amount":{"currency":"EUR","value":2500},"eventCode":"CAPTURE","eventDate":"2025-12-01T00:00:01+01:00","merchantAccountCode":"TestMerchant","merchantReference":"order-2","originalReference":"8313842560770001","pspReference":"8825408195409505","reason":"","success":"true"}}` +
		`]}`
)

// adyenMAC is Adyen's documented formula, computed here independently of
// the preset: base64 HMAC-SHA256(hex key, the eight fields joined by ':').
func adyenMAC(t *testing.T, key string, fields ...string) string {
	t.Helper()
	k, err := hex.DecodeString(key)
	require.NoError(t, err)
	m := hmac.New(sha256.New, k)
	m.Write([]byte(strings.Join(fields, ":")))
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

func signAdyen(t testing.TB, body string, secrets ...string) (string, http.Header) {
	t.Helper()
	h := http.Header{}
	out, err := signature.SignDelivery("adyen", signature.Options{Secrets: secrets}, []byte(body), h, now)
	require.NoError(t, err)
	return string(out), h
}

func TestAdyenDocumentedFormula(t *testing.T) {
	t.Parallel()
	body, err := sjson.Set(adyenBody, "notificationItems.0.NotificationRequestItem.additionalData.hmacSignature",
		adyenMAC(t, adyenKey, "7914073381342284", "", "TestMerchant", "order-1", "1000", "EUR", "AUTHORISATION", "true"))
	require.NoError(t, err)
	body, err = sjson.Set(body, "notificationItems.1.NotificationRequestItem.additionalData.hmacSignature",
		adyenMAC(t, adyenKey, "8825408195409505", "8313842560770001", "TestMerchant", "order-2", "2500", "EUR", "CAPTURE", "true"))
	require.NoError(t, err)
	v, err := signature.New("adyen", signature.Options{Secrets: []string{adyenKey}})
	require.NoError(t, err)
	require.NoError(t, v.Verify([]byte(body), http.Header{}))
	signed, _ := signAdyen(t, adyenBody, adyenKey)
	require.JSONEq(t, body, signed, "SignDelivery writes the documented signatures")
}

// One item with a tampered amount: the whole delivery fails Verify (a
// delivery forwarded whole never carries it), VerifyDelivery passes, and
// the item verdicts single it out; SplitChecked leaves it out.
func TestAdyenItemVerdicts(t *testing.T) {
	t.Parallel()
	signed, h := signAdyen(t, adyenBody, adyenKey)
	tampered, err := sjson.Set(signed, "notificationItems.1.NotificationRequestItem.amount.value", 1)
	require.NoError(t, err)

	v, err := signature.New("adyen", signature.Options{Secrets: []string{adyenKey}})
	require.NoError(t, err)
	iv, ok := v.(signature.ItemVerifier)
	require.True(t, ok, "adyen verifies each item")
	require.NoError(t, v.Verify([]byte(signed), h))
	require.ErrorIs(t, v.Verify([]byte(tampered), h), signature.ErrNoMatchingSignature)
	require.NoError(t, iv.VerifyDelivery([]byte(tampered), h))
	items := gjson.Get(tampered, "notificationItems").Array()
	require.NoError(t, iv.VerifyItem([]byte(items[0].Raw)))
	require.ErrorIs(t, iv.VerifyItem([]byte(items[1].Raw)), signature.ErrNoMatchingSignature)

	p, _ := signature.Lookup("adyen")
	require.Equal(t, signature.BatchSplit, p.Batch.Policy)
	got, refused, err := p.Batch.SplitChecked([]byte(tampered), iv.VerifyItem)
	require.NoError(t, err)
	require.Equal(t, 1, refused)
	require.Len(t, got, 1)
	require.Equal(t, `["7914073381342284","AUTHORISATION","true"]`, got[0].ID)
	require.NoError(t, v.Verify(got[0].Body, h), "a forwarded item still carries its own signature")

	// A forged copy placed before the authentic item with its ID cannot
	// displace it: refused items are left out before duplicates are.
	forgedItem, err := sjson.Set(items[0].Raw, "NotificationRequestItem.amount.value", 7)
	require.NoError(t, err)
	forged := strings.Replace(signed, `"notificationItems":[`, `"notificationItems":[`+forgedItem+",", 1)
	got, refused, err = p.Batch.SplitChecked([]byte(forged), iv.VerifyItem)
	require.NoError(t, err)
	require.Equal(t, 1, refused)
	require.Len(t, got, 2)
	require.Equal(t, int64(1000), gjson.GetBytes(got[0].Body, "notificationItems.0.NotificationRequestItem.amount.value").Int())
}

func TestAdyenBasicAuth(t *testing.T) {
	t.Parallel()
	secrets := []string{adyenKey, "basic:adyen_ws:p@ss:word"}
	signed, h := signAdyen(t, adyenBody, secrets...)
	require.Equal(t, "Basic "+base64.StdEncoding.EncodeToString([]byte("adyen_ws:p@ss:word")), h.Get("Authorization"))
	v, err := signature.New("adyen", signature.Options{Secrets: secrets})
	require.NoError(t, err)
	require.NoError(t, v.Verify([]byte(signed), h))
	require.ErrorIs(t, v.Verify([]byte(signed), http.Header{}), signature.ErrMissingHeader)
	wrong := http.Header{"Authorization": {"Basic " + base64.StdEncoding.EncodeToString([]byte("adyen_ws:guess"))}}
	err = v.Verify([]byte(signed), wrong)
	require.ErrorIs(t, err, signature.ErrNoMatchingSignature)
	require.NotContains(t, err.Error(), "p@ss")
	// Without Basic credentials configured, none is asked for.
	v, err = signature.New("adyen", signature.Options{Secrets: []string{adyenKey}})
	require.NoError(t, err)
	require.NoError(t, v.Verify([]byte(signed), http.Header{}))
}

func TestAdyenConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		secrets []string
		want    string
	}{
		{"basic only", []string{"basic:u:p"}, "an HMAC key is required"},
		{"key not hex", []string{"not-a-hex-key"}, "is hex"},
		{"basic without password", []string{adyenKey, "basic:justuser"}, "basic:<user>:<password>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := signature.New("adyen", signature.Options{Secrets: tc.secrets})
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "justuser")
			require.NotContains(t, err.Error(), "not-a-hex-key")
		})
	}
}

func TestAdyenRefusals(t *testing.T) {
	t.Parallel()
	signed, h := signAdyen(t, adyenBody, adyenKey)
	v, err := signature.New("adyen", signature.Options{Secrets: []string{adyenKeyOld, adyenKey}})
	require.NoError(t, err)
	require.NoError(t, v.Verify([]byte(signed), h), "every key is tried")
	set := func(path string, val any) string {
		out, err := sjson.Set(signed, path, val)
		require.NoError(t, err)
		return out
	}
	item := "notificationItems.0.NotificationRequestItem."
	for _, tc := range []struct {
		name string
		body string
		want error
	}{
		{"tampered pspReference", set(item+"pspReference", "7914073381342285"), signature.ErrNoMatchingSignature},
		{"tampered success", set(item+"success", "false"), signature.ErrNoMatchingSignature},
		{"tampered currency", set(item+"amount.currency", "USD"), signature.ErrNoMatchingSignature},
		{"signature not base64", set(item+"additionalData.hmacSignature", "%%%"), signature.ErrMalformedHeader},
		{"signature not a string", set(item+"additionalData.hmacSignature", 12), signature.ErrMalformedHeader},
		{"no amount", strings.Replace(signed, `"amount":{"currency":"EUR","value":1000},`, "", 1), signature.ErrMalformedHeader},
		{"signed field twice", strings.Replace(signed, `"eventCode":"AUTHORISATION",`, `"eventCode":"AUTHORISATION","eventCode":"CAPTURE",`, 1), signature.ErrMalformedHeader},
		{"no items", `{"live":"false","notificationItems":[]}`, signature.ErrMissingHeader},
		{"not JSON", "[accepted]", signature.ErrMissingHeader},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := v.Verify([]byte(tc.body), h)
			require.ErrorIs(t, err, tc.want)
			requireOneSentinel(t, err)
		})
	}
	// Unsigned fields may change: only the documented eight are signed.
	require.NoError(t, v.Verify([]byte(set(item+"reason", "changed")), h))
	require.NoError(t, v.Verify([]byte(set("live", "true")), h))
}
