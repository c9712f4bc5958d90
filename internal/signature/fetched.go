package signature

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"time"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/keyfetch"
)

// Schemes verified with the provider's public keys rather than a shared
// secret: PayPal and AWS SNS (a certificate at a URL the delivery names),
// Google Pub/Sub and Plaid (keys by ID from the provider's key endpoint),
// Apple App Store (a certificate chain in the delivery, verified to
// Apple's root) and Wise (published keys, embedded). Keys are fetched by
// internal/keyfetch under each preset's host allowlist; a key that cannot be
// fetched is ErrKeyUnavailable, never an accepted delivery.
//
// What these presets are configured with (Options.Secrets) is not a key but
// what the provider's signature must also match: PayPal's webhook ID, SNS's
// topic ARN, Pub/Sub's service-account email, Plaid's API credentials, the
// App Store bundle ID, Wise's environment. Sign (tests, the CLI) takes that
// setting followed by "|" and a base64 DER PKCS#8 private key
// (NewSigningSecret makes one); PublicSecret drops the key. A key Sign uses
// is handed to the local key server of tests (keyfetch.Publish) and goes
// nowhere otherwise.

// ErrKeyUnavailable: the provider's key or certificate could not be fetched
// (network, timeout, status, size). It is not a verdict on the delivery:
// the gateway answers 503 so the provider retries, and records nothing.
var ErrKeyUnavailable = errors.New("provider key unavailable")

// fetchErr maps a keyfetch failure to this package's sentinels: a URL
// outside the allowlist is the delivery's fault (refused), anything else is
// the provider's key being unavailable (retried).
func fetchErr(what string, err error) error {
	if errors.Is(err, keyfetch.ErrNotAllowed) {
		return fmt.Errorf("%s: %s: %w", what, strings.TrimSuffix(err.Error(), ": "+keyfetch.ErrNotAllowed.Error()), ErrMalformedHeader)
	}
	return fmt.Errorf("%s: %s: %w", what, strings.TrimSuffix(err.Error(), ": "+keyfetch.ErrUnavailable.Error()), ErrKeyUnavailable)
}

// splitSigning splits a configured secret into its setting and, for Sign,
// its private key (nil when the secret is a setting alone).
func splitSigning(s string) (string, crypto.Signer, error) {
	setting, enc, ok := strings.Cut(s, "|")
	if !ok {
		return s, nil, nil
	}
	der, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return "", nil, errors.New("the signing key after | is not base64 DER PKCS#8")
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return "", nil, errors.New("the signing key after | is not base64 DER PKCS#8")
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return "", nil, errors.New("the signing key after | cannot sign")
	}
	return setting, signer, nil
}

// settings returns the settings of o.Secrets and the private key of the
// first one (nil when it has none).
func settings(o Options) ([]string, crypto.Signer, error) {
	out := make([]string, len(o.Secrets))
	var first crypto.Signer
	for i, s := range o.Secrets {
		set, k, err := splitSigning(s)
		if err != nil {
			return nil, nil, fmt.Errorf("secret %d: %w", i+1, err)
		}
		if set == "" {
			return nil, nil, fmt.Errorf("secret %d is empty", i+1)
		}
		if i == 0 {
			first = k
		}
		out[i] = set
	}
	return out, first, nil
}

// fetchedKeyAlg is the key type each fetched-key preset signs with.
var fetchedKeyAlg = map[string]string{
	"paypal": "rsa", "sns": "rsa", "pubsub": "rsa", "wise": "rsa",
	"plaid": "ec", "appstore": "ec",
}

// NewSigningSecret returns a signing secret for a preset verified with the
// provider's public keys: setting, "|", and a new base64 DER PKCS#8 private
// key of the provider's key type. It is meant for tests and the CLI; a
// delivery signed with it verifies only against a local key server.
func NewSigningSecret(provider, setting string) (string, error) {
	var (
		k   crypto.Signer
		err error
	)
	switch fetchedKeyAlg[provider] {
	case "rsa":
		k, err = rsa.GenerateKey(rand.Reader, 2048)
	case "ec":
		k, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	default:
		return "", fmt.Errorf("provider %s is not verified with fetched or published keys", provider)
	}
	if err != nil {
		return "", err
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return "", err
	}
	return setting + "|" + base64.StdEncoding.EncodeToString(der), nil
}

// keyID is a short, stable name for a public key (its SPKI digest).
func keyID(pub crypto.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "invalid"
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:8])
}

// selfSigned returns a PEM certificate for k named cn, valid around at,
// as a test signer's stand-in for the provider's certificate.
func selfSigned(k crypto.Signer, cn string, at time.Time) ([]byte, error) {
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(at.UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    at.Add(-24 * time.Hour),
		NotAfter:     at.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.Public(), k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// parseCertPEM reads the first certificate of a PEM answer and checks it is
// valid at now.
func parseCertPEM(b []byte, now time.Time) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("the provider's answer is not a PEM certificate")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, errors.New("the provider's certificate does not parse")
	}
	if now.Before(c.NotBefore) || now.After(c.NotAfter) {
		return nil, errors.New("the provider's certificate is not valid now")
	}
	return c, nil
}

// fetchedPublicSecret maps a fetched-key preset's signing secret to what
// the gateway is configured with: the setting (wise: the public key).
func fetchedPublicSecret(provider, s string) (string, error) {
	setting, k, err := splitSigning(s)
	if err != nil {
		return "", fmt.Errorf("%s signing secret: %w", provider, err)
	}
	if provider == "wise" && k != nil {
		der, err := x509.MarshalPKIXPublicKey(k.Public())
		if err != nil {
			return "", err
		}
		return base64.StdEncoding.EncodeToString(der), nil
	}
	return setting, nil
}
