package signature

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/keyfetch"
)

// Apple App Store Server Notifications V2: the body is {"signedPayload":
// "<JWS>"}, an ES256 JWS whose header carries its certificate chain (x5c:
// leaf, intermediate, root, base64 DER). Nothing is fetched: the chain is
// verified to Apple Root CA - G3, embedded below (the x5c root is not
// trusted, as Apple's library ignores it too): the intermediate signed by
// the root and a CA carrying Apple's intermediate marker
// (1.2.840.113635.100.6.2.1), the leaf signed by the intermediate and
// carrying the App Store receipt-signing marker (1.2.840.113635.100.6.11.1),
// each certificate valid at the payload's signedDate within 60 seconds,
// then the JWS with the leaf's key. The configured secret is the app's
// bundle ID, optionally followed by ":<environment>" (Production or
// Sandbox) and, for Production, ":<appAppleId>", which the payload's data
// (or summary, appData, externalPurchaseToken) must match. Sources: Apple,
// "App Store Server Notifications V2" and "signedPayload" (Doc,
// https://developer.apple.com/documentation/appstoreservernotifications/signedpayload);
// Apple's app-store-server-library (SignedDataVerifier) is the oracle.
//
// The notification's ID (notificationUUID) is inside the signed payload:
// the event_id source jws reads it there once the JWS is verified.
func init() {
	register(Preset{ //nolint:gosec // G101: SecretFormat describes a secret, holds none
		Name:         "appstore",
		SecretFormat: "the bundle ID, optionally `:Sandbox` or `:Production:<appAppleId>`; the key is the chain to Apple's root",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, For: 72 * time.Hour, Attempts: 6, Note: "V2: retried 5 times, at 1, 12, 24, 48 and 72 hours", Source: "https://developer.apple.com/documentation/appstoreservernotifications/responding-to-app-store-server-notifications"},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Source: Undocumented},
			Answer:  Answer{Note: "HTTP 200", Status: http.StatusOK, Source: "https://developer.apple.com/documentation/appstoreservernotifications/responding-to-app-store-server-notifications"},
			Refusal: Refusal{Note: "no status required; anything but 200 is retried", Source: "https://developer.apple.com/documentation/appstoreservernotifications/responding-to-app-store-server-notifications"},
		},
		Doc:             "https://developer.apple.com/documentation/appstoreservernotifications/app-store-server-notifications-v2",
		SignatureHeader: "none: body signedPayload = JWS (ES256) with its x5c chain to Apple Root CA - G3",
		// notificationUUID: "a unique identifier for the notification"; a
		// retry carries the same one (responseBodyV2DecodedPayload).
		EventID: ids("jws signedPayload#notificationUUID"),
		Oracle:  "@apple/app-store-server-library",
		Scheme: Scheme{
			Signed:    "the JWS signedPayload in the body, chain verified to Apple's root (no fetch)",
			Algorithm: "ecdsa-p256-sha256",
			Encoding:  "jwt",
		},
		covers: appstoreCovers,
		build:  buildAppStore,
	})
}

// appleRootG3 is Apple Root CA - G3, as Apple publishes it at
// https://www.apple.com/certificateauthority/AppleRootCA-G3.cer (SHA-256
// fingerprint 63343ABFB89A6A03EBB57E9B3F5FA7BE7C4F5C756F3017B3A8C488C3653E9179,
// checked by TestAppleRootG3). Valid until 2039-04-30.
const appleRootG3 = `-----BEGIN CERTIFICATE-----
MIICQzCCAcmgAwIBAgIILcX8iNLFS5UwCgYIKoZIzj0EAwMwZzEbMBkGA1UEAwwS
QXBwbGUgUm9vdCBDQSAtIEczMSYwJAYDVQQLDB1BcHBsZSBDZXJ0aWZpY2F0aW9u
IEF1dGhvcml0eTETMBEGA1UECgwKQXBwbGUgSW5jLjELMAkGA1UEBhMCVVMwHhcN
MTQwNDMwMTgxOTA2WhcNMzkwNDMwMTgxOTA2WjBnMRswGQYDVQQDDBJBcHBsZSBS
b290IENBIC0gRzMxJjAkBgNVBAsMHUFwcGxlIENlcnRpZmljYXRpb24gQXV0aG9y
aXR5MRMwEQYDVQQKDApBcHBsZSBJbmMuMQswCQYDVQQGEwJVUzB2MBAGByqGSM49
AgEGBSuBBAAiA2IABJjpLz1AcqTtkyJygRMc3RCV8cWjTnHcFBbZDuWmBSp3ZHtf
TjjTuxxEtX/1H7YyYl3J6YRbTzBPEVoA/VhYDKX1DyxNB0cTddqXl5dvMVztK517
IDvYuVTZXpmkOlEKMaNCMEAwHQYDVR0OBBYEFLuw3qFYM4iapIqZ3r6966/ayySr
MA8GA1UdEwEB/wQFMAMBAf8wDgYDVR0PAQH/BAQDAgEGMAoGCCqGSM49BAMDA2gA
MGUCMQCD6cHEFl4aXTQY2e3v9GwOAEZLuN+yRhHFD/3meoyhpmvOwgPUnPWTxnS4
at+qIxUCMG1mihDK1A3UT82NQz60imOlM27jbdoXt2QfyFMm+YhidDkLF1vLUagM
6BgD56KyKA==
-----END CERTIFICATE-----
`

// appleRootAnchor names the root for keyfetch.Anchor (tests replace it).
const appleRootAnchor = "apple-root-ca-g3"

var (
	oidAppleIntermediate = asn1.ObjectIdentifier{1, 2, 840, 113635, 100, 6, 2, 1}
	oidAppleReceiptLeaf  = asn1.ObjectIdentifier{1, 2, 840, 113635, 100, 6, 11, 1}
)

const appleSkew = 60 * time.Second

type appIdentity struct {
	bundleID, environment, appAppleID string
}

type appstore struct {
	apps []appIdentity
	key  crypto.Signer // for signBody
}

func buildAppStore(_ Preset, o Options) (signer, error) {
	set, key, err := settings(o)
	if err != nil {
		return nil, err
	}
	v := &appstore{key: key}
	for i, s := range set {
		parts := strings.Split(s, ":")
		a := appIdentity{bundleID: parts[0]}
		if len(parts) > 1 {
			a.environment = parts[1]
		}
		if len(parts) > 2 {
			a.appAppleID = parts[2]
		}
		switch {
		case len(parts) > 3 || a.bundleID == "" || strings.ContainsAny(a.bundleID, " \t"):
			return nil, fmt.Errorf("secret %d: want <bundle ID>[:Production:<appAppleId>|:Sandbox]", i+1)
		case len(parts) > 1 && a.environment != "Production" && a.environment != "Sandbox":
			return nil, fmt.Errorf("secret %d: environment must be Production or Sandbox", i+1)
		case a.environment == "Sandbox" && len(parts) > 2:
			return nil, fmt.Errorf("secret %d: an appAppleId applies to Production only", i+1)
		}
		v.apps = append(v.apps, a)
	}
	return v, nil
}

// appleRoots reads the trusted roots (the embedded one, or a test's).
func appleRoots() []*x509.Certificate {
	var roots []*x509.Certificate
	rest := keyfetch.Anchor(appleRootAnchor, []byte(appleRootG3))
	for {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			return roots
		}
		if c, err := x509.ParseCertificate(blk.Bytes); err == nil {
			roots = append(roots, c)
		}
	}
}

func hasExtension(c *x509.Certificate, oid asn1.ObjectIdentifier) bool {
	for _, e := range c.Extensions {
		if e.Id.Equal(oid) {
			return true
		}
	}
	return false
}

func validAt(c *x509.Certificate, at time.Time) bool {
	return !c.NotBefore.After(at.Add(appleSkew)) && !c.NotAfter.Before(at.Add(-appleSkew))
}

// verifyAppleChain checks leaf and intermediate up to a trusted root at
// the effective time, and returns the leaf's key.
func verifyAppleChain(leaf, inter *x509.Certificate, at time.Time) (*ecdsa.PublicKey, error) {
	var root *x509.Certificate
	for _, r := range appleRoots() {
		if bytes.Equal(inter.RawIssuer, r.RawSubject) && inter.CheckSignatureFrom(r) == nil {
			root = r
		}
	}
	switch {
	case root == nil:
		return nil, errors.New("the intermediate is not signed by Apple Root CA - G3")
	case !bytes.Equal(leaf.RawIssuer, inter.RawSubject) || leaf.CheckSignatureFrom(inter) != nil:
		return nil, errors.New("the leaf is not signed by the intermediate")
	case !inter.BasicConstraintsValid || !inter.IsCA:
		return nil, errors.New("the intermediate is not a CA")
	case !hasExtension(inter, oidAppleIntermediate) || !hasExtension(leaf, oidAppleReceiptLeaf):
		return nil, errors.New("the chain lacks Apple's App Store markers")
	case !validAt(leaf, at) || !validAt(inter, at) || !validAt(root, at):
		return nil, errors.New("a certificate of the chain is not valid at signedDate")
	}
	pub, ok := leaf.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return nil, errors.New("the leaf key is not ECDSA")
	}
	return pub, nil
}

// appstoreCovers is Preset.Covered of the App Store: the signing input of
// the JWS signedPayload (header.payload), not the JSON around it nor the
// signature, which anyone can spell again without the key: ECDSA's
// (r, N−s) verifies as (r, s) does, and the last base64url character of
// a 64-byte signature has four bits no decoder reads.
func appstoreCovers(body []byte, _ http.Header) []byte {
	if sp, ok := topMember(body, "signedPayload"); ok && sp.Type == gjson.String {
		if i := strings.LastIndexByte(sp.Str, '.'); i >= 0 {
			return []byte("jws:" + sp.Str[:i])
		}
		return []byte("jws:" + sp.Str)
	}
	return body
}

func (v *appstore) Verify(body []byte, _ http.Header) error {
	if !isJSONObject(body) {
		return fmt.Errorf("body is not a JSON object: %w", ErrMissingHeader)
	}
	sp, ok := topMember(body, "signedPayload")
	switch {
	case !ok && gjson.GetBytes(body, "signedPayload").Exists():
		return fmt.Errorf("signedPayload given twice: %w", ErrMalformedHeader)
	case !ok:
		return fmt.Errorf("body has no signedPayload: %w", ErrMissingHeader)
	case sp.Type != gjson.String:
		return fmt.Errorf("signedPayload is not a string: %w", ErrMalformedHeader)
	}
	j, err := parseJWS(sp.Str, "ES256", 64<<10)
	if err != nil {
		return err
	}
	x5c := j.header.Get("x5c").Array()
	if len(x5c) != 3 {
		return fmt.Errorf("x5c is not a chain of 3 certificates: %w", ErrMalformedHeader)
	}
	var chain [2]*x509.Certificate
	for i := range chain {
		der, err := base64.StdEncoding.DecodeString(x5c[i].Str)
		if x5c[i].Type != gjson.String || err != nil {
			return fmt.Errorf("x5c certificate %d is not base64 DER: %w", i+1, ErrMalformedHeader)
		}
		if chain[i], err = x509.ParseCertificate(der); err != nil {
			return fmt.Errorf("x5c certificate %d does not parse: %w", i+1, ErrMalformedHeader)
		}
	}
	signed := j.payload.Get("signedDate")
	if signed.Type != gjson.Number {
		return fmt.Errorf("payload has no signedDate: %w", ErrMalformedHeader)
	}
	pub, err := verifyAppleChain(chain[0], chain[1], time.UnixMilli(signed.Int()))
	if err != nil {
		return fmt.Errorf("certificate chain: %s: %w", err, ErrNoMatchingSignature)
	}
	if !j.verifyES256(pub) {
		return fmt.Errorf("signedPayload signature does not verify with its leaf: %w", ErrNoMatchingSignature)
	}
	app := j.payload.Get("data")
	for _, alt := range []string{"summary", "appData", "externalPurchaseToken"} {
		if !app.Exists() {
			app = j.payload.Get(alt)
		}
	}
	env := app.Get("environment").Str
	if ept := app.Get("externalPurchaseId"); ept.Exists() && !app.Get("environment").Exists() {
		env = "Production"
		if strings.HasPrefix(ept.Str, "SANDBOX") {
			env = "Sandbox"
		}
	}
	for _, a := range v.apps {
		if app.Get("bundleId").Str != a.bundleID || (a.environment != "" && env != a.environment) {
			continue
		}
		if a.appAppleID != "" && app.Get("appAppleId").Raw != a.appAppleID {
			continue
		}
		return nil
	}
	return fmt.Errorf("the notification is not for a configured app (%d configured): %w", len(v.apps), ErrNoMatchingSignature)
}

// appleTestChain makes a root, intermediate and leaf for k (one key for
// all three, a test signer's stand-in for Apple's) with Apple's markers,
// valid around at; it publishes the root as the trusted anchor.
func appleTestChain(k crypto.Signer, at time.Time) ([3][]byte, error) {
	return appleChain(k, at, true)
}

// appleChain is appleTestChain; publish false keeps the root untrusted.
func appleChain(k crypto.Signer, at time.Time, publish bool) ([3][]byte, error) {
	var out [3][]byte
	serial := big.NewInt(at.UnixNano())
	mk := func(cn string, ca bool, oid asn1.ObjectIdentifier) *x509.Certificate {
		c := &x509.Certificate{
			SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
			NotBefore: at.Add(-24 * time.Hour), NotAfter: at.Add(365 * 24 * time.Hour),
			BasicConstraintsValid: true, IsCA: ca, KeyUsage: x509.KeyUsageDigitalSignature,
		}
		if ca {
			c.KeyUsage |= x509.KeyUsageCertSign
		}
		if oid != nil {
			c.ExtraExtensions = []pkix.Extension{{Id: oid, Value: []byte{5, 0}}}
		}
		return c
	}
	id := keyID(k.Public())
	root := mk("Test Root "+id, true, nil)
	inter := mk("Test WWDR "+id, true, oidAppleIntermediate)
	leaf := mk("Test App Store "+id, false, oidAppleReceiptLeaf)
	var err error
	if out[2], err = x509.CreateCertificate(rand.Reader, root, root, k.Public(), k); err != nil {
		return out, err
	}
	if out[1], err = x509.CreateCertificate(rand.Reader, inter, root, k.Public(), k); err != nil {
		return out, err
	}
	if out[0], err = x509.CreateCertificate(rand.Reader, leaf, inter, k.Public(), k); err != nil {
		return out, err
	}
	if publish {
		keyfetch.Publish("anchor:"+appleRootAnchor, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: out[2]}))
	}
	return out, nil
}

// signBody writes signedPayload into body: a notification for the first
// configured app, signed at ts, whose payload is body's members plus
// notificationUUID (derived from body), signedDate and data (bundle ID,
// environment) where body lacks them.
func (v *appstore) signBody(body []byte, ts time.Time) ([]byte, error) {
	if v.key == nil {
		return nil, errors.New("signing needs a private key: secret <bundle ID>|<base64 PKCS#8 P-256 key> (NewSigningSecret)")
	}
	if !isJSONObject(body) {
		return nil, errors.New("body is not a JSON object")
	}
	chain, err := appleTestChain(v.key, ts)
	if err != nil {
		return nil, err
	}
	a := v.apps[0]
	env := a.environment
	if env == "" {
		env = "Sandbox"
	}
	payload, err := sjson.DeleteBytes(body, "signedPayload")
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(payload)
	for path, val := range map[string]any{
		"notificationType": "TEST", "notificationUUID": hex.EncodeToString(sum[:16]), "version": "2.0",
		"signedDate": ts.UnixMilli(), "data.bundleId": a.bundleID, "data.environment": env,
	} {
		if !gjson.GetBytes(payload, path).Exists() {
			if payload, err = sjson.SetBytes(payload, path, val); err != nil {
				return nil, err
			}
		}
	}
	if a.appAppleID != "" && !gjson.GetBytes(payload, "data.appAppleId").Exists() {
		if payload, err = sjson.SetRawBytes(payload, "data.appAppleId", []byte(a.appAppleID)); err != nil {
			return nil, err
		}
	}
	var claims map[string]any
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	if err := dec.Decode(&claims); err != nil {
		return nil, err
	}
	x5c := []string{b64std(chain[0]), b64std(chain[1]), b64std(chain[2])}
	tok, err := signJWS(v.key, map[string]any{"alg": "ES256", "x5c": x5c}, claims)
	if err != nil {
		return nil, err
	}
	return sjson.SetBytes(body, "signedPayload", tok)
}

// sign refers to signBody: the signature lives in the body.
func (v *appstore) sign([]byte, http.Header, time.Time) error {
	return errors.New("appstore signs inside the body: use SignDelivery")
}

func b64std(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
