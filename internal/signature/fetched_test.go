package signature_test

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/keyfetch/keyfetchtest"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// keys is the local key server every fetched-key preset of this package's
// tests reads from (keyfetch's test override; see keyfetchtest).
var keys *keyfetchtest.Server

func TestMain(m *testing.M) {
	keys = keyfetchtest.Start()
	code := m.Run()
	keys.Close()
	os.Exit(code)
}

// signingSecret makes a signing secret for a fetched-key preset.
func signingSecret(provider, setting string) string {
	s, err := signature.NewSigningSecret(provider, setting)
	if err != nil {
		panic(err)
	}
	return s
}

const (
	paypalWebhookID = "8PT597110X687430LKGECATA"
	snsTopic        = "arn:aws:sns:us-east-1:123456789012:orders"
	pubsubEmail     = "push@project-1.iam.gserviceaccount.com"
	pubsubURL       = "https://hooks.example.test/pubsub"
	plaidCreds      = "sandbox:client-a:secret-a"
	appBundle       = "com.example.app"
	appstoreBody    = `{"notificationType":"DID_RENEW","notificationUUID":"002e14d5-51f5-4503-b5a8-c3a1af68eb20","data":{"bundleId":"com.example.app","environment":"Sandbox","signedTransactionInfo":"(signed by Apple)"},"version":"2.0"}`
	plaidBody       = `{"environment":"sandbox","error":null,"item_id":"wz666MBjYWTp2PDzzggYhM6oWWmBb","new_transactions":19,"webhook_code":"DEFAULT_UPDATE","webhook_type":"TRANSACTIONS"}`
)

// Fetched-key presets in the round-trip fixtures (sns signs in the body:
// bodySigned).
func init() {
	fixtures = append(fixtures,
		fixture{
			provider: "paypal", body: jsonBody,
			secrets: [2]string{signingSecret("paypal", paypalWebhookID), signingSecret("paypal", "5GP028458E2496506")},
		},
		fixture{
			provider: "wise", body: jsonBody,
			secrets: [2]string{signingSecret("wise", "test"), signingSecret("wise", "test")},
		},
		fixture{
			provider: "plaid", body: plaidBody,
			secrets: [2]string{signingSecret("plaid", plaidCreds), signingSecret("plaid", "sandbox:client-b:secret-b")},
		},
		fixture{
			provider: "pubsub", body: pubsubBody, url: pubsubURL,
			secrets: [2]string{signingSecret("pubsub", pubsubEmail), signingSecret("pubsub", "other@project-2.iam.gserviceaccount.com")},
		},
	)
	bodySigned = append(bodySigned, "sns", "appstore")
	unsignedBody["pubsub"] = true
}

// unsignedBody are presets whose token covers no byte of the body but has
// a format of its own (a JWT), unlike tokenLike.
var unsignedBody = map[string]bool{}

const pubsubBody = `{"message":{"attributes":{"k":"v"},"data":"eyJ2ZXJzaW9uIjoiMS4wIn0=","messageId":"2070443601311540","publishTime":"2025-12-01T00:00:00.000Z"},"subscription":"projects/p/subscriptions/s"}`

const snsBody = `{"TopicArn":"arn:aws:sns:us-east-1:123456789012:orders","Type":"Notification","MessageId":"22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324","Subject":"order","Message":"{\"order\":1000}","Timestamp":"2025-12-01T00:00:00.000Z","UnsubscribeURL":"https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe"}`

func verifyWith(t *testing.T, provider string, o signature.Options, body []byte, h http.Header) error {
	t.Helper()
	if o.Now == nil {
		o.Now = clock(now)
	}
	v, err := signature.New(provider, o)
	require.NoError(t, err)
	err = v.Verify(body, h)
	if err != nil {
		requireOneSentinel(t, err)
	}
	return err
}

func TestPayPal(t *testing.T) {
	t.Parallel()
	secret := signingSecret("paypal", paypalWebhookID)
	signed := func(t *testing.T) http.Header {
		h := http.Header{}
		require.NoError(t, signature.Sign("paypal", signature.Options{Secrets: []string{secret}}, []byte(jsonBody), h, now))
		return h
	}
	cfg := signature.Options{Secrets: []string{paypalWebhookID}}
	t.Run("signed string is PayPal's", func(t *testing.T) {
		t.Parallel()
		h := signed(t)
		require.NoError(t, verifyWith(t, "paypal", cfg, []byte(jsonBody), h))
		require.Contains(t, h.Get("Paypal-Cert-Url"), "https://api.sandbox.paypal.com/v1/notifications/certs/CERT-")
	})
	for _, tc := range []struct {
		name   string
		mutate func(h http.Header, body *string, o *signature.Options)
		want   error
	}{
		{"wrong webhook ID", func(_ http.Header, _ *string, o *signature.Options) { o.Secrets = []string{"WH0THER"} }, signature.ErrNoMatchingSignature},
		{"tampered body", func(_ http.Header, b *string, _ *signature.Options) { *b = strings.Replace(*b, "1000", "9000", 1) }, signature.ErrNoMatchingSignature},
		{"other transmission ID", func(h http.Header, _ *string, _ *signature.Options) { h.Set("Paypal-Transmission-Id", "tx-other") }, signature.ErrNoMatchingSignature},
		{"other transmission time", func(h http.Header, _ *string, _ *signature.Options) {
			h.Set("Paypal-Transmission-Time", now.Add(time.Second).UTC().Format(time.RFC3339))
		}, signature.ErrNoMatchingSignature},
		{"certificate host not PayPal's", func(h http.Header, _ *string, _ *signature.Options) {
			h.Set("Paypal-Cert-Url", strings.Replace(h.Get("Paypal-Cert-Url"), "api.sandbox.paypal.com", "api.sandbox.paypal.com.evil.example", 1))
		}, signature.ErrMalformedHeader},
		{"certificate over http", func(h http.Header, _ *string, _ *signature.Options) {
			h.Set("Paypal-Cert-Url", strings.Replace(h.Get("Paypal-Cert-Url"), "https:", "http:", 1))
		}, signature.ErrMalformedHeader},
		{"certificate outside the certs path", func(h http.Header, _ *string, _ *signature.Options) {
			h.Set("Paypal-Cert-Url", "https://api.paypal.com/v1/oauth2/token")
		}, signature.ErrMalformedHeader},
		{"certificate not found: unavailable", func(h http.Header, _ *string, _ *signature.Options) {
			h.Set("Paypal-Cert-Url", "https://api.paypal.com/v1/notifications/certs/CERT-unknown")
		}, signature.ErrKeyUnavailable},
		{"other algorithm", func(h http.Header, _ *string, _ *signature.Options) { h.Set("Paypal-Auth-Algo", "SHA1withRSA") }, signature.ErrMalformedHeader},
		{"missing certificate URL", func(h http.Header, _ *string, _ *signature.Options) { h.Del("Paypal-Cert-Url") }, signature.ErrMissingHeader},
		{"stale with a configured tolerance", func(_ http.Header, _ *string, o *signature.Options) {
			o.Tolerance, o.Now = time.Minute, clock(now.Add(61*time.Second))
		}, signature.ErrTimestampOutOfTolerance},
		{"fresh with a configured tolerance", func(_ http.Header, _ *string, o *signature.Options) {
			o.Tolerance, o.Now = time.Minute, clock(now.Add(60*time.Second))
		}, nil},
		{"days later without a tolerance (PayPal retries for 3 days)", func(_ http.Header, _ *string, o *signature.Options) {
			o.Now = clock(now.Add(72 * time.Hour))
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, body, o := signed(t), jsonBody, cfg
			tc.mutate(h, &body, &o)
			err := verifyWith(t, "paypal", o, []byte(body), h)
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
		})
	}
	t.Run("certificate refused before any fetch", func(t *testing.T) {
		t.Parallel()
		h := signed(t)
		u := "https://api.paypal.com.evil.example/v1/notifications/certs/CERT-x"
		keys.Put(u, []byte("not fetched"), "")
		h.Set("Paypal-Cert-Url", u)
		require.ErrorIs(t, verifyWith(t, "paypal", cfg, []byte(jsonBody), h), signature.ErrMalformedHeader)
		require.Zero(t, keys.Hits(u))
	})
	t.Run("expired certificate", func(t *testing.T) {
		t.Parallel()
		o := cfg
		o.Now = clock(now.Add(400 * 24 * time.Hour))
		require.ErrorIs(t, verifyWith(t, "paypal", o, []byte(jsonBody), signed(t)), signature.ErrKeyUnavailable)
	})
}

func snsSigned(t *testing.T, secret, body string) string {
	t.Helper()
	out, err := signature.SignBody("sns", signature.Options{Secrets: []string{secret}}, []byte(body), now)
	require.NoError(t, err)
	return string(out)
}

func TestSNS(t *testing.T) {
	t.Parallel()
	secret := signingSecret("sns", snsTopic)
	cfg := signature.Options{Secrets: []string{snsTopic}}
	for _, version := range []string{"1", "2"} {
		t.Run("SignatureVersion "+version, func(t *testing.T) {
			t.Parallel()
			body, err := sjson.Set(snsBody, "SignatureVersion", version)
			require.NoError(t, err)
			signed := snsSigned(t, secret, body)
			require.NoError(t, verifyWith(t, "sns", cfg, []byte(signed), http.Header{}))
			other := strings.Replace(signed, `"SignatureVersion":"`+version, `"SignatureVersion":"`+map[string]string{"1": "2", "2": "1"}[version], 1)
			require.ErrorIs(t, verifyWith(t, "sns", cfg, []byte(other), http.Header{}), signature.ErrNoMatchingSignature)
		})
	}
	signed := snsSigned(t, secret, snsBody)
	for _, tc := range []struct {
		name   string
		mutate func(body string) string
		h      http.Header
		cfg    []string
		want   error
	}{
		{"valid", nil, nil, nil, nil},
		{"message type header agrees", nil, http.Header{"X-Amz-Sns-Message-Type": {"Notification"}}, nil, nil},
		{"message type header disagrees", nil, http.Header{"X-Amz-Sns-Message-Type": {"SubscriptionConfirmation"}}, nil, signature.ErrMalformedHeader},
		{"tampered message", func(b string) string { return strings.Replace(b, "1000", "9000", 1) }, nil, nil, signature.ErrNoMatchingSignature},
		{"topic not configured", nil, nil, []string{"arn:aws:sns:us-east-1:123456789012:other"}, signature.ErrNoMatchingSignature},
		{"certificate host not SNS", func(b string) string {
			u := gjson.Get(b, "SigningCertURL").Str
			return mustSet(b, "SigningCertURL", strings.Replace(u, "sns.us-east-1.amazonaws.com", "sns.us-east-1.amazonaws.com.evil.example", 1))
		}, nil, nil, signature.ErrMalformedHeader},
		{"certificate host one label deeper", func(b string) string {
			return mustSet(b, "SigningCertURL", "https://sns.x.evil.amazonaws.com/SimpleNotificationService-1.pem")
		}, nil, nil, signature.ErrMalformedHeader},
		{"certificate over http", func(b string) string {
			return mustSet(b, "SigningCertURL", strings.Replace(gjson.Get(b, "SigningCertURL").Str, "https:", "http:", 1))
		}, nil, nil, signature.ErrMalformedHeader},
		{"certificate not a .pem", func(b string) string {
			return mustSet(b, "SigningCertURL", "https://sns.us-east-1.amazonaws.com/cert")
		}, nil, nil, signature.ErrMalformedHeader},
		{"certificate unavailable", func(b string) string {
			return mustSet(b, "SigningCertURL", "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-gone.pem")
		}, nil, nil, signature.ErrKeyUnavailable},
		{"unknown signature version", func(b string) string { return mustSet(b, "SignatureVersion", "3") }, nil, nil, signature.ErrMalformedHeader},
		{"Signature twice", func(b string) string { return strings.Replace(b, `{`, `{"Signature":"AAAA",`, 1) }, nil, nil, signature.ErrMalformedHeader},
		{"no Signature", func(b string) string { return mustDelete(b, "Signature") }, nil, nil, signature.ErrMissingHeader},
		{"unknown Type", func(b string) string { return mustSet(b, "Type", "Other") }, nil, nil, signature.ErrMalformedHeader},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			body := signed
			if tc.mutate != nil {
				body = tc.mutate(body)
			}
			o := cfg
			if tc.cfg != nil {
				o.Secrets = tc.cfg
			}
			h := tc.h
			if h == nil {
				h = http.Header{}
			}
			err := verifyWith(t, "sns", o, []byte(body), h)
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
		})
	}
	t.Run("topic checked before any fetch", func(t *testing.T) {
		t.Parallel()
		u := "https://sns.ap-south-1.amazonaws.com/SimpleNotificationService-topic-first.pem"
		body := mustSet(signed, "SigningCertURL", u)
		err := verifyWith(t, "sns", signature.Options{Secrets: []string{"arn:aws:sns:us-east-1:123456789012:other"}}, []byte(body), http.Header{})
		require.ErrorIs(t, err, signature.ErrNoMatchingSignature)
		require.Zero(t, keys.Hits(u))
	})
}

// TestSNSSubscription: SubscriptionConfirmation and UnsubscribeConfirmation
// are handshakes, signed over their own field list (with Token and
// SubscribeURL), forwarded without a claim; a SubscribeURL outside SNS is
// refused even when signed.
func TestSNSSubscription(t *testing.T) {
	t.Parallel()
	secret := signingSecret("sns", snsTopic)
	p, ok := signature.Lookup("sns")
	require.True(t, ok)
	for _, typ := range []string{"SubscriptionConfirmation", "UnsubscribeConfirmation"} {
		t.Run(typ, func(t *testing.T) {
			t.Parallel()
			body := `{"Type":"` + typ + `","MessageId":"165545c9-2a5c-472c-8df2-7ff2be2b3b1b","Token":"2336412f37fb687f5d51e6e2425","TopicArn":"` + snsTopic +
				`","Message":"You have chosen to subscribe to the topic.","SubscribeURL":"https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&TopicArn=arn:aws:sns:us-east-1:123456789012:orders&Token=2336412f37fb687f5d51e6e2425","Timestamp":"2025-12-01T00:00:00.000Z"}`
			signed := snsSigned(t, secret, body)
			require.NoError(t, verifyWith(t, "sns", signature.Options{Secrets: []string{snsTopic}}, []byte(signed), http.Header{}))
			r := httptest.NewRequest(http.MethodPost, "/sns", strings.NewReader(signed))
			a, ok := p.MatchHandshake(r, []byte(signed), "")
			require.True(t, ok)
			require.True(t, a.Forward)
			require.Equal(t, signature.AuthSignature, a.Challenge.Auth)

			tampered := strings.Replace(signed, "2336412f37fb687f5d51e6e2425", "2336412f37fb687f5d51e6e2426", 1)
			require.ErrorIs(t, verifyWith(t, "sns", signature.Options{Secrets: []string{snsTopic}}, []byte(tampered), http.Header{}), signature.ErrNoMatchingSignature, "Token is signed")

			elsewhere := snsSigned(t, secret, mustSet(body, "SubscribeURL", "https://evil.example/?Action=ConfirmSubscription"))
			require.ErrorIs(t, verifyWith(t, "sns", signature.Options{Secrets: []string{snsTopic}}, []byte(elsewhere), http.Header{}), signature.ErrMalformedHeader)
		})
	}
	notification := snsSigned(t, secret, snsBody)
	_, ok = p.MatchHandshake(httptest.NewRequest(http.MethodPost, "/sns", strings.NewReader(notification)), []byte(notification), "")
	require.False(t, ok, "a Notification is a delivery")
}

func mustSet(body, path, value string) string {
	out, err := sjson.Set(body, path, value)
	if err != nil {
		panic(err)
	}
	return out
}

func mustDelete(body, path string) string {
	out, err := sjson.Delete(body, path)
	if err != nil {
		panic(err)
	}
	return out
}

func TestPubSub(t *testing.T) {
	t.Parallel()
	secret := signingSecret("pubsub", pubsubEmail)
	other := signingSecret("pubsub", pubsubEmail)
	signed := func(t *testing.T, secret, url string, at time.Time) http.Header {
		h := http.Header{}
		require.NoError(t, signature.Sign("pubsub", signature.Options{Secrets: []string{secret}, URL: url}, []byte(pubsubBody), h, at))
		return h
	}
	cfg := signature.Options{Secrets: []string{pubsubEmail}, URL: pubsubURL}
	for _, tc := range []struct {
		name string
		h    func(t *testing.T) http.Header
		o    func(o *signature.Options)
		want error
	}{
		{"valid", func(t *testing.T) http.Header { return signed(t, secret, pubsubURL, now) }, nil, nil},
		{"valid near expiry", func(t *testing.T) http.Header { return signed(t, secret, pubsubURL, now.Add(-time.Hour-4*time.Minute)) }, nil, nil},
		{"expired", func(t *testing.T) http.Header { return signed(t, secret, pubsubURL, now.Add(-time.Hour-6*time.Minute)) }, nil, signature.ErrTimestampOutOfTolerance},
		{"issued in the future", func(t *testing.T) http.Header { return signed(t, secret, pubsubURL, now.Add(6*time.Minute)) }, nil, signature.ErrTimestampOutOfTolerance},
		{"other audience", func(t *testing.T) http.Header { return signed(t, secret, "https://other.example.test/pubsub", now) }, nil, signature.ErrNoMatchingSignature},
		{"other service account", func(t *testing.T) http.Header { return signed(t, secret, pubsubURL, now) },
			func(o *signature.Options) { o.Secrets = []string{"someone@else.iam.gserviceaccount.com"} }, signature.ErrNoMatchingSignature},
		{"key not Google's", func(t *testing.T) http.Header {
			h := signed(t, secret, pubsubURL, now)
			// Same kid, signature by another key: swap the signature part.
			o := signed(t, other, pubsubURL, now)
			tok, otok := strings.TrimPrefix(h.Get("Authorization"), "Bearer "), strings.TrimPrefix(o.Get("Authorization"), "Bearer ")
			h.Set("Authorization", "Bearer "+tok[:strings.LastIndex(tok, ".")]+otok[strings.LastIndex(otok, "."):])
			return h
		}, nil, signature.ErrNoMatchingSignature},
		{"alg none", func(*testing.T) http.Header {
			return http.Header{"Authorization": {"Bearer eyJhbGciOiJub25lIn0.eyJpc3MiOiJhY2NvdW50cy5nb29nbGUuY29tIn0."}}
		}, nil, signature.ErrMalformedHeader},
		{"not bearer", func(*testing.T) http.Header { return http.Header{"Authorization": {"Basic dXNlcjpwYXNz"}} }, nil, signature.ErrMalformedHeader},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := cfg
			if tc.o != nil {
				tc.o(&o)
			}
			err := verifyWith(t, "pubsub", o, []byte(pubsubBody), tc.h(t))
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
		})
	}
}

// Wise's own signed example (github.com/transferwise/digital-signatures-
// examples, verify-webhook-signature), checked with the embedded sandbox
// key; the production key refuses it.
func TestWiseDocumentedVector(t *testing.T) {
	t.Parallel()
	body := `{"data":{"resource":{"id":49983981,"profile_id":16055450,"account_id":14124090,"type":"transfer"},"current_state":"incoming_payment_waiting","previous_state":null,"occurred_at":"2021-08-23T10:12:50Z"},"subscription_id":"90aa8e14-4ef1-4a56-861c-f3c9cde097ea","event_type":"transfers#state-change","schema_version":"2.0.0","sent_at":"2021-08-23T10:12:50Z"}`
	h := http.Header{"X-Signature-Sha256": {"wKcKCYXAzxNgiu7xmoDm943NUni7Rz33QN8JkEA9dWSGebgndonabgSj18Y4C08OrwVmueGsED2s00M7DtJVcYKOS1i3G4TMVx+mgM3aL9djMBkQtiYNBFUd6wrPI7ZUNHv/TrlKSjTMc+6JFvUvJ7owY3z85e3I4jLRLJowMFvO8kvCJ60+1pY9wDwZvtZ//WS93LrwGjk9Dvwzpmu0w+P4J75tETT5qC3Uv0y5G2yO8SEoO3yNP/tg/BOli02niHb53vEOUWUb9bly6thnfMoXoiV/osoGxgF20R58RlvkAmezyyl1Sv542TfS2DpiwVnmjjjkCyXeSUcKookYLQ=="}}
	require.NoError(t, verifyWith(t, "wise", signature.Options{Secrets: []string{"sandbox"}}, []byte(body), h))
	require.NoError(t, verifyWith(t, "wise", signature.Options{Secrets: []string{"production", "sandbox"}}, []byte(body), h))
	require.ErrorIs(t, verifyWith(t, "wise", signature.Options{Secrets: []string{"production"}}, []byte(body), h), signature.ErrNoMatchingSignature)
	tampered := strings.Replace(body, "49983981", "49983982", 1)
	require.ErrorIs(t, verifyWith(t, "wise", signature.Options{Secrets: []string{"sandbox"}}, []byte(tampered), h), signature.ErrNoMatchingSignature)
	_, err := signature.New("wise", signature.Options{Secrets: []string{"staging"}})
	require.ErrorContains(t, err, "not production, sandbox or a base64 RSA public key")
}

func TestPlaid(t *testing.T) {
	t.Parallel()
	secret := signingSecret("plaid", plaidCreds)
	signed := func(t *testing.T, body string, at time.Time) http.Header {
		h := http.Header{}
		require.NoError(t, signature.Sign("plaid", signature.Options{Secrets: []string{secret}}, []byte(body), h, at))
		return h
	}
	cfg := signature.Options{Secrets: []string{plaidCreds}}
	require.NoError(t, verifyWith(t, "plaid", cfg, []byte(plaidBody), signed(t, plaidBody, now)))
	for _, tc := range []struct {
		name string
		h    func(t *testing.T) http.Header
		body string
		o    []string
		want error
	}{
		{"tampered body", func(t *testing.T) http.Header { return signed(t, plaidBody, now) }, strings.Replace(plaidBody, "19", "91", 1), nil, signature.ErrNoMatchingSignature},
		{"stale: 5 min and 1 s old", func(t *testing.T) http.Header { return signed(t, plaidBody, now.Add(-5*time.Minute-time.Second)) }, "", nil, signature.ErrTimestampOutOfTolerance},
		{"5 min old", func(t *testing.T) http.Header { return signed(t, plaidBody, now.Add(-5*time.Minute)) }, "", nil, nil},
		{"another client's credentials: Plaid knows no such key for it", func(t *testing.T) http.Header { return signed(t, plaidBody, now) }, "", []string{"sandbox:client-c:secret-c"}, signature.ErrNoMatchingSignature},
		// The local key server serves nothing at production.plaid.com: a
		// key Plaid's host cannot give is unavailable (503), not accepted.
		{"production credentials ask production.plaid.com", func(t *testing.T) http.Header { return signed(t, plaidBody, now) }, "", []string{"production:client-a:secret-a"}, signature.ErrKeyUnavailable},
		{"HS256 token", func(*testing.T) http.Header {
			return http.Header{"Plaid-Verification": {"eyJhbGciOiJIUzI1NiIsImtpZCI6ImsifQ.eyJpYXQiOjF9.c2ln"}}
		}, "", nil, signature.ErrMalformedHeader},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			body := tc.body
			if body == "" {
				body = plaidBody
			}
			o := cfg
			if tc.o != nil {
				o.Secrets = tc.o
			}
			err := verifyWith(t, "plaid", o, []byte(body), tc.h(t))
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
		})
	}
	t.Run("a body that is not the token's costs no key request", func(t *testing.T) {
		t.Parallel()
		h := signed(t, plaidBody, now)
		before := keys.Hits("https://sandbox.plaid.com/webhook_verification_key/get")
		require.ErrorIs(t, verifyWith(t, "plaid", cfg, []byte(`{"webhook_type":"OTHER"}`), h), signature.ErrNoMatchingSignature)
		require.Equal(t, before, keys.Hits("https://sandbox.plaid.com/webhook_verification_key/get"))
	})
	for _, bad := range []string{"sandbox:client-a", "staging:client-a:secret-a", "production::secret"} {
		_, err := signature.New("plaid", signature.Options{Secrets: []string{bad}})
		require.ErrorContains(t, err, "<production|sandbox>:<client_id>:<secret>")
	}
}

// TestAppleRootG3: the embedded root is Apple's, by the SHA-256
// fingerprint Apple publishes for AppleRootCA-G3.cer.
func TestAppleRootG3(t *testing.T) {
	t.Parallel()
	blk, _ := pem.Decode([]byte(signature.AppleRootG3))
	require.NotNil(t, blk)
	sum := sha256.Sum256(blk.Bytes)
	require.Equal(t, "63343abfb89a6a03ebb57e9b3f5fa7be7c4f5c756f3017b3a8c488c3653e9179", hex.EncodeToString(sum[:]))
	c, err := x509.ParseCertificate(blk.Bytes)
	require.NoError(t, err)
	require.Equal(t, "Apple Root CA - G3", c.Subject.CommonName)
}

func TestAppStore(t *testing.T) {
	t.Parallel()
	secret := signingSecret("appstore", appBundle)
	signed := func(t *testing.T, body string) string {
		t.Helper()
		out, err := signature.SignBody("appstore", signature.Options{Secrets: []string{secret}}, []byte(body), now)
		require.NoError(t, err)
		return string(out)
	}
	good := signed(t, appstoreBody)
	jws := gjson.Get(good, "signedPayload").Str
	parts := strings.Split(jws, ".")
	hdr, err := base64.RawURLEncoding.DecodeString(parts[0])
	require.NoError(t, err)
	x5c := gjson.GetBytes(hdr, "x5c").Array()
	claims := func(mut func(c map[string]any)) map[string]any {
		raw, err := base64.RawURLEncoding.DecodeString(parts[1])
		require.NoError(t, err)
		var c map[string]any
		require.NoError(t, json.Unmarshal(raw, &c))
		if mut != nil {
			mut(c)
		}
		return c
	}
	chainOf := func(certs []string) map[string]any { return map[string]any{"alg": "ES256", "x5c": certs} }
	own := []string{x5c[0].Str, x5c[1].Str, x5c[2].Str}
	resignedBy := func(t *testing.T, secret string, header, c map[string]any) string {
		tok, err := signature.ResignJWS(secret, header, c)
		require.NoError(t, err)
		return mustSet(`{}`, "signedPayload", tok)
	}
	resigned := func(t *testing.T, header, c map[string]any) string { return resignedBy(t, secret, header, c) }
	untrusted, untrustedKey, err := signature.UntrustedAppleChain(appBundle, now)
	require.NoError(t, err)
	for _, tc := range []struct {
		name, body string
		cfg        []string
		want       error
	}{
		{"valid", good, []string{appBundle}, nil},
		{"valid for its environment", good, []string{appBundle + ":Sandbox"}, nil},
		{"other environment", good, []string{appBundle + ":Production:1234"}, signature.ErrNoMatchingSignature},
		{"other app", good, []string{"com.example.other"}, signature.ErrNoMatchingSignature},
		{"tampered payload", mustSet(good, "signedPayload", parts[0]+"."+base64.RawURLEncoding.EncodeToString([]byte(`{"signedDate":1764547200000,"data":{"bundleId":"com.example.app"}}`))+"."+parts[2]), []string{appBundle}, signature.ErrNoMatchingSignature},
		{"chain to a root that is not Apple's", resignedBy(t, untrustedKey, chainOf(untrusted), claims(nil)), []string{appBundle}, signature.ErrNoMatchingSignature},
		{"trusted chain, signed by another key", resignedBy(t, untrustedKey, chainOf(own), claims(nil)), []string{appBundle}, signature.ErrNoMatchingSignature},
		{"certificates not valid at signedDate", resigned(t, chainOf(own), claims(func(c map[string]any) { c["signedDate"] = now.Add(-48 * time.Hour).UnixMilli() })), []string{appBundle}, signature.ErrNoMatchingSignature},
		{"chain of two", resigned(t, chainOf(own[:2]), claims(nil)), []string{appBundle}, signature.ErrMalformedHeader},
		{"leaf as intermediate", resigned(t, chainOf([]string{own[0], own[0], own[2]}), claims(nil)), []string{appBundle}, signature.ErrNoMatchingSignature},
		{"ES384 header", resigned(t, map[string]any{"alg": "ES384", "x5c": own}, claims(nil)), []string{appBundle}, signature.ErrMalformedHeader},
		{"signedPayload twice", strings.Replace(good, "{", `{"signedPayload":"x",`, 1), []string{appBundle}, signature.ErrMalformedHeader},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := verifyWith(t, "appstore", signature.Options{Secrets: tc.cfg}, []byte(tc.body), http.Header{})
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
		})
	}
	for _, bad := range []string{"com.example.app:Staging", "com.example.app:Sandbox:1", "a:b:c:d"} {
		_, err := signature.New("appstore", signature.Options{Secrets: []string{bad}})
		require.Error(t, err, bad)
	}
}
