package signature

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Wise (formerly TransferWise) signs each webhook request with RSA
// (SHA256withRSA) over the raw body; X-Signature-SHA256 carries the
// signature in base64. The keys are Wise's published ones, embedded below:
// the configured secret is "production" or "sandbox" (or, should Wise
// publish another key, that key as base64 DER SPKI or PEM). Source: Wise,
// "Event Handling", Signature header X-Signature-SHA256 (Doc); the keys as
// published in Wise's API documentation
// (https://api-docs.transferwise.com/#webhook-events-event-http-requests,
// source github.com/transferwise/api-docs, and the sandbox key again in
// github.com/transferwise/digital-signatures-examples). Wise retries for two
// weeks and sends no event ID nor signed timestamp (X-Delivery-Id is per
// notification, not documented across retries), so the route configures
// event_id and the preset dedupes bodies. Wise publishes no Node library
// that verifies: documentation only, with Wise's own signed example as a
// vector (TestWiseDocumentedVector).
func init() {
	register(Preset{
		Name:         "wise",
		SecretFormat: "`production` or `sandbox` (Wise's published key), or another RSA public key in base64 DER",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, For: 14 * 24 * time.Hour, Attempts: 25, Note: "increasing intervals over two weeks, at most 25 times", Source: "https://docs.wise.com/guides/developer/webhooks/event-handling"},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 5 * time.Second, Source: "https://docs.wise.com/guides/developer/webhooks/event-handling"},
			Answer:  Answer{Note: "2xx within 5 seconds; store the event and process it apart", Source: "https://docs.wise.com/guides/developer/webhooks/event-handling"},
			Refusal: Refusal{Note: "no status required; anything but 2xx is a failed attempt, retried", Source: "https://docs.wise.com/guides/developer/webhooks/event-handling"},
		},
		Doc:             "https://docs.wise.com/guides/developer/webhooks/event-handling",
		SignatureHeader: "X-Signature-SHA256: <base64 RSA>",
		DedupeBody:      true,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Signature-SHA256"}},
			Signed:    "{body}",
			Algorithm: "rsa-sha256",
			Encoding:  "base64",
		},
		build: buildWise,
	})
}

// wiseKeys are Wise's published webhook signing keys (base64 DER SPKI).
var wiseKeys = map[string]string{
	"production": "MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAvO8vXV+JksBzZAY6GhSO" +
		"XdoTCfhXaaiZ+qAbtaDBiu2AGkGVpmEygFmWP4Li9m5+Ni85BhVvZOodM9epgW3F" +
		"bA5Q1SexvAF1PPjX4JpMstak/QhAgl1qMSqEevL8cmUeTgcMuVWCJmlge9h7B1CS" +
		"D4rtlimGZozG39rUBDg6Qt2K+P4wBfLblL0k4C4YUdLnpGYEDIth+i8XsRpFlogx" +
		"CAFyH9+knYsDbR43UJ9shtc42Ybd40Afihj8KnYKXzchyQ42aC8aZ/h5hyZ28yVy" +
		"Oj3Vos0VdBIs/gAyJ/4yyQFCXYte64I7ssrlbGRaco4nKF3HmaNhxwyKyJafz19e" +
		"HwIDAQAB",
	"sandbox": "MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAwpb91cEYuyJNQepZAVfP" +
		"ZIlPZfNUefH+n6w9SW3fykqKu938cR7WadQv87oF2VuT+fDt7kqeRziTmPSUhqPU" +
		"ys/V2Q1rlfJuXbE+Gga37t7zwd0egQ+KyOEHQOpcTwKmtZ81ieGHynAQzsn1We3j" +
		"wt760MsCPJ7GMT141ByQM+yW1Bx+4SG3IGjXWyqOWrcXsxAvIXkpUD/jK/L958Cg" +
		"nZEgz0BSEh0QxYLITnW1lLokSx/dTianWPFEhMC9BgijempgNXHNfcVirg1lPSyg" +
		"z7KqoKUN0oHqWLr2U1A+7kqrl6O2nx3CKs1bj1hToT1+p4kcMoHXA7kA+VBLUpEs" +
		"VwIDAQAB",
}

type wise struct {
	keys []*rsa.PublicKey
	priv crypto.Signer // for sign
}

func buildWise(_ Preset, o Options) (signer, error) {
	v := &wise{}
	for i, s := range o.Secrets {
		setting, k, err := splitSigning(s)
		if err != nil {
			return nil, fmt.Errorf("secret %d: %w", i+1, err)
		}
		if k != nil {
			pub, ok := k.Public().(*rsa.PublicKey)
			if !ok {
				return nil, fmt.Errorf("secret %d: the signing key is not RSA", i+1)
			}
			if i == 0 {
				v.priv = k
			}
			v.keys = append(v.keys, pub)
			continue
		}
		if published, ok := wiseKeys[setting]; ok {
			setting = published
		}
		der, err := base64.StdEncoding.DecodeString(stripPEM(setting))
		if err != nil {
			return nil, fmt.Errorf("secret %d is not production, sandbox or a base64 RSA public key", i+1)
		}
		pub, err := x509.ParsePKIXPublicKey(der)
		rk, ok := pub.(*rsa.PublicKey)
		if err != nil || !ok {
			return nil, fmt.Errorf("secret %d is not production, sandbox or a base64 RSA public key", i+1)
		}
		v.keys = append(v.keys, rk)
	}
	return v, nil
}

func (v *wise) Verify(body []byte, h http.Header) error {
	text, err := oneValue(h, "X-Signature-SHA256")
	if err != nil {
		return err
	}
	sig, err := base64.StdEncoding.DecodeString(text)
	if err != nil || len(sig) < 128 || len(sig) > 1024 {
		return fmt.Errorf("header X-Signature-SHA256 is not a base64 RSA signature: %w", ErrMalformedHeader)
	}
	digest := sha256.Sum256(body)
	for _, k := range v.keys {
		if rsa.VerifyPKCS1v15(k, crypto.SHA256, digest[:], sig) == nil {
			return nil
		}
	}
	return fmt.Errorf("signature matches none of %d key(s): %w", len(v.keys), ErrNoMatchingSignature)
}

func (v *wise) sign(body []byte, h http.Header, _ time.Time) error {
	if v.priv == nil {
		return errors.New("signing needs a private key: secret <label>|<base64 PKCS#8 RSA key> (NewSigningSecret)")
	}
	digest := sha256.Sum256(body)
	sig, err := v.priv.Sign(rand.Reader, digest[:], crypto.SHA256)
	if err != nil {
		return err
	}
	h.Set("X-Signature-SHA256", base64.StdEncoding.EncodeToString(sig))
	return nil
}
