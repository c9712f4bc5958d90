package signature

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/crc32"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/keyfetch"
)

// PayPal signs each transmission with RSA (SHA256withRSA) over
//
//	<PAYPAL-TRANSMISSION-ID>|<PAYPAL-TRANSMISSION-TIME>|<webhook ID>|<crc32(body)>
//
// where crc32 is the decimal IEEE CRC32 of the raw body, and the webhook ID
// is the listener's ID in the PayPal developer portal (the configured
// secret; several may be listed). The signature (PAYPAL-TRANSMISSION-SIG,
// base64) is checked with the certificate at PAYPAL-CERT-URL, fetched only
// from PayPal's API hosts (paypalCerts) and only under
// /v1/notifications/certs/. Source: PayPal, "Integrate webhooks", section
// "Verify event notifications" (Doc) and the verify-webhook-signature API
// (https://developer.paypal.com/api/webhooks/v1/#verify-webhook-signature).
//
// Known limit of the scheme: the body is covered only by a CRC32, which is
// not a cryptographic digest; the body's integrity against someone who
// holds a genuine delivery rests on TLS. PayPal documents no tolerance for
// PAYPAL-TRANSMISSION-TIME and retries for 3 days, so none is applied unless
// one is configured. PayPal's official Node SDK verifies by posting to
// PayPal's API (a call per delivery), so the preset rests on the
// documentation.
func init() {
	register(Preset{ //nolint:gosec // G101: SecretFormat describes a secret, holds none
		Name:         "paypal",
		SecretFormat: "the webhook ID of the listener (PayPal developer portal); the key is PayPal's certificate at PAYPAL-CERT-URL",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, For: 3 * 24 * time.Hour, Note: "up to 25 retries when the answer is not 2xx, there is none, or PayPal cannot connect", Source: "https://developer.paypal.com/api/rest/webhooks/rest/#link-subscribingalistenerurl"},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Source: Undocumented},
			Answer:  Answer{Note: "HTTP 2xx every time one is posted", Source: "https://developer.paypal.com/api/rest/webhooks/rest/#link-subscribingalistenerurl"},
			Refusal: Refusal{Note: "no status required; any non-2xx is retried like a failure", Source: "https://developer.paypal.com/api/rest/webhooks/rest/#link-subscribingalistenerurl"},
		},
		Doc:             "https://developer.paypal.com/api/rest/webhooks/rest/#link-verifyeventnotifications",
		SignatureHeader: "PAYPAL-TRANSMISSION-SIG: <base64 RSA> (with PAYPAL-TRANSMISSION-ID, -TIME, PAYPAL-CERT-URL, PAYPAL-AUTH-ALGO)",
		EventID:         ids(jsonID("id")),
		IDStability:     StabilityStable,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "Paypal-Transmission-Sig", Timestamp: "Paypal-Transmission-Time", ID: "Paypal-Transmission-Id"}},
			Signed:    "transmission_id|transmission_time|webhook_id|crc32(body), certificate from PAYPAL-CERT-URL",
			Algorithm: "rsa-sha256",
			Encoding:  "base64",
		},
		build: buildPayPal,
	})
}

// paypalCerts fetches PayPal's signing certificates: live and sandbox API
// hosts, as PAYPAL-CERT-URL names them.
var paypalCerts = keyfetch.New(keyfetch.Policy{
	Hosts:    []string{"api.paypal.com", "api-m.paypal.com", "api.sandbox.paypal.com", "api-m.sandbox.paypal.com"},
	MaxBytes: 16 << 10,
})

const paypalCertPath = "/v1/notifications/certs/"

type paypal struct {
	webhookIDs []string
	key        crypto.Signer // for sign
	tolerance  time.Duration // 0: none
	now        func() time.Time
}

func buildPayPal(_ Preset, o Options) (signer, error) {
	ids, key, err := settings(o)
	if err != nil {
		return nil, err
	}
	for i, id := range ids {
		if strings.ContainsAny(id, "| \t") {
			return nil, fmt.Errorf("secret %d is not a PayPal webhook ID", i+1)
		}
	}
	v := &paypal{webhookIDs: ids, key: key, tolerance: o.Tolerance, now: o.Now}
	if v.now == nil {
		v.now = time.Now
	}
	return v, nil
}

func (v *paypal) Verify(body []byte, h http.Header) error {
	var vals [5]string
	for i, name := range []string{"Paypal-Transmission-Sig", "Paypal-Transmission-Id", "Paypal-Transmission-Time", "Paypal-Cert-Url", "Paypal-Auth-Algo"} {
		val, err := oneValue(h, name)
		if err != nil {
			return err
		}
		vals[i] = val
	}
	sigText, id, ts, certURL, algo := vals[0], vals[1], vals[2], vals[3], vals[4]
	if algo != "SHA256withRSA" {
		return fmt.Errorf("header Paypal-Auth-Algo %q is not SHA256withRSA: %w", algo, ErrMalformedHeader)
	}
	sig, err := base64.StdEncoding.DecodeString(sigText)
	if err != nil || len(sig) < 128 || len(sig) > 1024 {
		return fmt.Errorf("header Paypal-Transmission-Sig is not a base64 RSA signature: %w", ErrMalformedHeader)
	}
	if strings.Contains(id, "|") || strings.Contains(ts, "|") {
		return fmt.Errorf("transmission ID or time contains |: %w", ErrMalformedHeader)
	}
	at, err := time.Parse(time.RFC3339, ts)
	if err != nil {
		return fmt.Errorf("header Paypal-Transmission-Time is not an RFC 3339 time: %w", ErrMalformedHeader)
	}
	if v.tolerance > 0 {
		if d := v.now().Sub(at); d > v.tolerance || -d > v.tolerance {
			return fmt.Errorf("transmission time outside the %s tolerance: %w", v.tolerance, ErrTimestampOutOfTolerance)
		}
	}
	if u, err := url.Parse(certURL); err != nil || !strings.HasPrefix(u.EscapedPath(), paypalCertPath) || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("header Paypal-Cert-Url is not under %s: %w", paypalCertPath, ErrMalformedHeader)
	}
	raw, err := paypalCerts.Get(certURL)
	if err != nil {
		return fetchErr("PayPal certificate", err)
	}
	cert, err := parseCertPEM(raw, v.now())
	if err != nil {
		return fmt.Errorf("PayPal certificate: %s: %w", err, ErrKeyUnavailable)
	}
	pub, ok := cert.PublicKey.(*rsa.PublicKey)
	if !ok {
		return fmt.Errorf("PayPal certificate: not an RSA key: %w", ErrKeyUnavailable)
	}
	crc := strconv.FormatUint(uint64(crc32.ChecksumIEEE(body)), 10)
	for _, wid := range v.webhookIDs {
		digest := sha256.Sum256([]byte(id + "|" + ts + "|" + wid + "|" + crc))
		if rsa.VerifyPKCS1v15(pub, crypto.SHA256, digest[:], sig) == nil {
			return nil
		}
	}
	return fmt.Errorf("no configured webhook ID (%d tried) matches the transmission signature: %w", len(v.webhookIDs), ErrNoMatchingSignature)
}

// sign sets PayPal's headers; the certificate of the signing key is
// published at a PAYPAL-CERT-URL named after the key (keyfetch.Publish).
// A Paypal-Transmission-Id already on h is kept.
func (v *paypal) sign(body []byte, h http.Header, ts time.Time) error {
	if v.key == nil {
		return errors.New("signing needs a private key: secret <webhook ID>|<base64 PKCS#8 key> (NewSigningSecret)")
	}
	certPEM, err := selfSigned(v.key, "messageverificationcerts.paypal.com", ts)
	if err != nil {
		return err
	}
	certURL := "https://api.sandbox.paypal.com" + paypalCertPath + "CERT-" + keyID(v.key.Public())
	keyfetch.Publish(certURL, certPEM)
	id := h.Get("Paypal-Transmission-Id")
	if id == "" {
		id = "tx-" + strconv.FormatInt(ts.UnixNano(), 36)
	}
	t := ts.UTC().Format(time.RFC3339)
	crc := strconv.FormatUint(uint64(crc32.ChecksumIEEE(body)), 10)
	digest := sha256.Sum256([]byte(id + "|" + t + "|" + v.webhookIDs[0] + "|" + crc))
	sig, err := v.key.Sign(rand.Reader, digest[:], crypto.SHA256)
	if err != nil {
		return err
	}
	h.Set("Paypal-Transmission-Id", id)
	h.Set("Paypal-Transmission-Time", t)
	h.Set("Paypal-Transmission-Sig", base64.StdEncoding.EncodeToString(sig))
	h.Set("Paypal-Cert-Url", certURL)
	h.Set("Paypal-Auth-Algo", "SHA256withRSA")
	return nil
}
