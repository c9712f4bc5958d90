package signature_test

import (
	"crypto/hmac"
	"crypto/sha1" //nolint:gosec // Braintree's documented scheme
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"hash"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tidwall/sjson"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

const (
	// midtransBody is a Midtrans notification without its signature_key.
	midtransBody = `{"transaction_time":"2025-12-01 07:00:00","transaction_status":"settlement","transaction_id":"513f1f01-c9da-474c-9fc9-d5c64364b709","status_code":"200","payment_type":"credit_card","order_id":"order-RT-1","gross_amount":"10000.00","currency":"IDR"}`
	// braintreeXML is a Braintree notification before base64.
	braintreeXML = `<notification><timestamp type="datetime">2025-12-01T00:00:00Z</timestamp><kind>subscription_charged_successfully</kind><subject><subscription><id>sub_RT_1</id></subscription></subject></notification>`
)

func newVerifier(t *testing.T, provider string, o signature.Options) signature.Verifier {
	t.Helper()
	v, err := signature.New(provider, o)
	require.NoError(t, err)
	return v
}

func macHex(alg func() hash.Hash, key, msg string) string {
	m := hmac.New(alg, []byte(key))
	m.Write([]byte(msg))
	return hex.EncodeToString(m.Sum(nil))
}

// Recurly lists several signatures after the timestamp; any may match.
func TestRecurlySignatureList(t *testing.T) {
	t.Parallel()
	body := `{"id":"rec_1","object_type":"account","event_type":"created"}`
	ts := strconv.FormatInt(now.UnixMilli(), 10)
	good := macHex(sha256.New, "recurly_key", ts+"."+body)
	other := macHex(sha256.New, "other_key", ts+"."+body)
	v := newVerifier(t, "recurly", signature.Options{Secrets: []string{"recurly_key"}, Now: clock(now)})
	h := func(val string) http.Header { return http.Header{"Recurly-Signature": {val}} }
	require.NoError(t, v.Verify([]byte(body), h(ts+","+other+","+good)))
	require.ErrorIs(t, v.Verify([]byte(body), h(ts+","+other)), signature.ErrNoMatchingSignature)
	require.ErrorIs(t, v.Verify([]byte(body), h(ts)), signature.ErrMalformedHeader)
	stale := strconv.FormatInt(now.Add(-301*time.Second).UnixMilli(), 10)
	require.ErrorIs(t, v.Verify([]byte(body), h(stale+","+macHex(sha256.New, "recurly_key", stale+"."+body))), signature.ErrTimestampOutOfTolerance)
}

// Mollie sends one X-Mollie-Signature per secret during a rotation.
func TestMollieTwoSignatureLines(t *testing.T) {
	t.Parallel()
	body := `{"resource":"event","id":"event_1","type":"payment-link.paid"}`
	v := newVerifier(t, "mollie", signature.Options{Secrets: []string{"new_secret"}})
	h := http.Header{"X-Mollie-Signature": {"sha256=" + macHex(sha256.New, "old_secret", body), "sha256=" + macHex(sha256.New, "new_secret", body)}}
	require.NoError(t, v.Verify([]byte(body), h))
	h = http.Header{"X-Mollie-Signature": {"sha256=" + macHex(sha256.New, "old_secret", body), "sha256=" + macHex(sha256.New, "older_secret", body)}}
	require.ErrorIs(t, v.Verify([]byte(body), h), signature.ErrNoMatchingSignature)
}

// Authorize.Net writes the digest in upper case.
func TestAuthorizeNetUpperCaseHex(t *testing.T) {
	t.Parallel()
	body := `{"notificationId":"n1","eventType":"net.authorize.payment.authcapture.created","payload":{"authAmount":45.00}}`
	sig := strings.ToUpper(macHex(sha512.New, "ANET_KEY", body))
	v := newVerifier(t, "authorizenet", signature.Options{Secrets: []string{"ANET_KEY"}})
	require.NoError(t, v.Verify([]byte(body), http.Header{"X-Anet-Signature": {"sha512=" + sig}}))
	require.ErrorIs(t, v.Verify([]byte(strings.Replace(body, "45.00", "4.50", 1)), http.Header{"X-Anet-Signature": {"sha512=" + sig}}), signature.ErrNoMatchingSignature)
}

// Mercado Pago leaves an absent x-request-id or data.id out of the
// manifest, and lower-cases an alphanumeric data.id.
func TestMercadoPagoManifest(t *testing.T) {
	t.Parallel()
	v := newVerifier(t, "mercadopago", signature.Options{Secrets: []string{"mp"}, Now: clock(now)})
	ts := strconv.FormatInt(now.Unix(), 10)
	body := `{"id":1,"type":"merchant_order","data":{"id":"ABC123"}}`
	sig := "ts=" + ts + ",v1=" + macHex(sha256.New, "mp", "id:abc123;ts:"+ts+";")
	require.NoError(t, v.Verify([]byte(body), http.Header{"X-Signature": {sig}}))
	require.ErrorIs(t, v.Verify([]byte(body), http.Header{"X-Signature": {sig}, "X-Request-Id": {"r1"}}), signature.ErrNoMatchingSignature,
		"a request ID the signature did not cover")
	noID := "ts=" + ts + ",v1=" + macHex(sha256.New, "mp", "request-id:r1;ts:"+ts+";")
	require.NoError(t, v.Verify([]byte(`{"type":"test"}`), http.Header{"X-Signature": {noID}, "X-Request-Id": {"r1"}}))
	require.ErrorIs(t, v.Verify([]byte(body), http.Header{"X-Signature": {"v1=" + strings.Repeat("0", 64)}}), signature.ErrMalformedHeader)
}

// Rapyd signs the configured URL: another URL does not verify.
func TestRapydSignsTheURL(t *testing.T) {
	t.Parallel()
	o := signature.Options{Secrets: []string{"rak_1:rsk_1"}, URL: "https://hooks.example.test/rapyd", Now: clock(now)}
	body := []byte(`{"id":"wh_1","type":"PAYMENT_COMPLETED"}`)
	h := http.Header{}
	require.NoError(t, signature.Sign("rapyd", o, body, h, now))
	// Rapyd's formula, computed independently: base64 of the hex HMAC.
	want := base64.StdEncoding.EncodeToString([]byte(macHex(sha256.New, "rsk_1",
		"https://hooks.example.test/rapyd"+h.Get("salt")+h.Get("timestamp")+"rak_1"+"rsk_1"+string(body))))
	require.Equal(t, want, h.Get("signature"))
	require.NoError(t, newVerifier(t, "rapyd", o).Verify(body, h))
	o.URL = "https://hooks.example.test/other"
	require.ErrorIs(t, newVerifier(t, "rapyd", o).Verify(body, h), signature.ErrNoMatchingSignature)
	_, err := signature.New("rapyd", signature.Options{Secrets: []string{"only-one-key"}, URL: o.URL})
	require.ErrorContains(t, err, "<access key>:<secret key>")
	require.NotContains(t, err.Error(), "only-one-key")
}

// Midtrans's signature_key is SHA-512 over three fields and the server
// key; the other fields are not covered.
func TestMidtransSignatureKey(t *testing.T) {
	t.Parallel()
	sum := sha512.Sum512([]byte("order-RT-1" + "200" + "10000.00" + "SB-Mid-server-1"))
	body, err := sjson.Set(midtransBody, "signature_key", hex.EncodeToString(sum[:]))
	require.NoError(t, err)
	v := newVerifier(t, "midtrans", signature.Options{Secrets: []string{"SB-Mid-server-1"}})
	require.NoError(t, v.Verify([]byte(body), nil))
	for _, field := range []string{"order_id", "status_code", "gross_amount"} {
		bad, err := sjson.Set(body, field, "9")
		require.NoError(t, err)
		require.ErrorIs(t, v.Verify([]byte(bad), nil), signature.ErrNoMatchingSignature, field)
	}
	unsigned, err := sjson.Set(body, "transaction_status", "capture")
	require.NoError(t, err)
	require.NoError(t, v.Verify([]byte(unsigned), nil), "transaction_status is not signed: configure event_id to include it")
	numeric, err := sjson.Set(body, "gross_amount", 10000)
	require.NoError(t, err)
	require.ErrorIs(t, v.Verify([]byte(numeric), nil), signature.ErrMalformedHeader)
}

// Chargebee and Braintree secrets name two values; a malformed one is
// refused without being echoed.
func TestPairedSecrets(t *testing.T) {
	t.Parallel()
	for _, provider := range []string{"chargebee", "braintree"} {
		_, err := signature.New(provider, signature.Options{Secrets: []string{"no-separator-here"}})
		require.Error(t, err, provider)
		require.NotContains(t, err.Error(), "no-separator-here")
	}
	v := newVerifier(t, "chargebee", signature.Options{Secrets: []string{"u:p:with:colons"}})
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("u:p:with:colons"))
	require.NoError(t, v.Verify(nil, http.Header{"Authorization": {auth}}))
	require.ErrorIs(t, v.Verify(nil, http.Header{"Authorization": {"Basic  " + auth[6:]}}), signature.ErrMalformedHeader)
}

// Braintree's bt_challenge answer, as the braintree library's verify()
// computes it.
func TestBraintreeChallenge(t *testing.T) {
	t.Parallel()
	p, _ := signature.Lookup("braintree")
	k := sha1.Sum([]byte("priv"))
	m := hmac.New(sha1.New, k[:])
	m.Write([]byte("20f9f8ed05f77439fe955c977e4c8a53"))
	r := httptest.NewRequest(http.MethodGet, "/bt?bt_challenge=20f9f8ed05f77439fe955c977e4c8a53", nil)
	a, ok := p.MatchHandshake(r, nil, "pub:priv")
	require.True(t, ok)
	require.Empty(t, a.Incomplete)
	require.Equal(t, "pub|"+hex.EncodeToString(m.Sum(nil)), string(a.Body))
	r = httptest.NewRequest(http.MethodGet, "/bt?bt_challenge=NOT-HEX", nil)
	a, ok = p.MatchHandshake(r, nil, "pub:priv")
	require.True(t, ok)
	require.NotEmpty(t, a.Incomplete, "the library refuses a challenge that is not hex")
}
