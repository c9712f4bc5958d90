package signature

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Public-key schemes with configured keys, beyond Discord's (discord.go) and
// Standard Webhooks' v1a (standard_asym.go): the configured "secrets" are
// public keys, so a leaked gateway configuration cannot forge deliveries.
// Sign (tests, the CLI) takes the matching private key instead, and
// PublicSecret maps one to the other.

// sigKeyAlg is the public-key algorithm of a pubkeyVerifier.
type sigKeyAlg int

const (
	algECDSAP256 sigKeyAlg = iota // SendGrid: base64 DER ECDSA over SHA-256
	algEd25519                    // Telnyx: base64 Ed25519
)

// pubkeyVerifier checks "<timestamp><sep><body>" signed with a private key,
// the signature in one header (base64) and the Unix timestamp in another.
type pubkeyVerifier struct {
	alg                 sigKeyAlg
	sigHeader, tsHeader string
	sep                 string
	ecKeys              []*ecdsa.PublicKey
	edKeys              []ed25519.PublicKey
	ecPriv              *ecdsa.PrivateKey  // for sign
	edPriv              ed25519.PrivateKey // for sign
	tolerance           time.Duration
	now                 func() time.Time
}

func buildPubkey(alg sigKeyAlg, sep string) func(p Preset, o Options) (signer, error) {
	return func(p Preset, o Options) (signer, error) {
		v := &pubkeyVerifier{
			alg: alg, sep: sep,
			sigHeader: p.Headers[0].Signature, tsHeader: p.Headers[0].Timestamp,
		}
		v.tolerance, v.now = clock(p, o)
		for i, s := range o.Secrets {
			if err := v.addKey(s); err != nil {
				return nil, fmt.Errorf("secret %d: %w", i+1, err)
			}
		}
		return v, nil
	}
}

// addKey reads a configured key: for ECDSA a base64 DER public key (SPKI,
// as SendGrid displays its verification key, optionally PEM-wrapped) or, to
// sign, a base64 DER PKCS#8 private key; for Ed25519 a base64 32-byte public
// key (as Telnyx displays it) or, to sign, a base64 32-byte seed prefixed
// "seed:".
func (v *pubkeyVerifier) addKey(s string) error {
	switch v.alg {
	case algECDSAP256:
		der, err := base64.StdEncoding.DecodeString(stripPEM(s))
		if err != nil {
			return errors.New("not a base64 DER ECDSA key")
		}
		if pub, err := x509.ParsePKIXPublicKey(der); err == nil {
			k, ok := pub.(*ecdsa.PublicKey)
			if !ok {
				return errors.New("not an ECDSA public key")
			}
			v.ecKeys = append(v.ecKeys, k)
			return nil
		}
		priv, err := x509.ParsePKCS8PrivateKey(der)
		if err != nil {
			return errors.New("not a base64 DER ECDSA public (SPKI) or private (PKCS#8) key")
		}
		k, ok := priv.(*ecdsa.PrivateKey)
		if !ok {
			return errors.New("not an ECDSA private key")
		}
		if v.ecPriv == nil {
			v.ecPriv = k
		}
		v.ecKeys = append(v.ecKeys, &k.PublicKey)
	case algEd25519:
		seed, isSeed := strings.CutPrefix(s, "seed:")
		b, err := base64.StdEncoding.DecodeString(seed)
		switch {
		case err != nil:
			return errors.New("not a base64 Ed25519 key")
		case isSeed && len(b) == ed25519.SeedSize:
			priv := ed25519.NewKeyFromSeed(b)
			if v.edPriv == nil {
				v.edPriv = priv
			}
			v.edKeys = append(v.edKeys, priv.Public().(ed25519.PublicKey))
		case !isSeed && len(b) == ed25519.PublicKeySize:
			v.edKeys = append(v.edKeys, ed25519.PublicKey(b))
		default:
			return errors.New("not a base64 32-byte Ed25519 public key")
		}
	}
	return nil
}

func stripPEM(s string) string {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "-----BEGIN") {
		return s
	}
	var b strings.Builder
	for line := range strings.SplitSeq(s, "\n") {
		if line = strings.TrimSpace(line); !strings.HasPrefix(line, "-----") {
			b.WriteString(line)
		}
	}
	return b.String()
}

func (v *pubkeyVerifier) Verify(body []byte, h http.Header) error {
	sigText, ts, err := signedAt(h, v.sigHeader, v.tsHeader)
	if err != nil {
		return err
	}
	sig, err := base64.StdEncoding.DecodeString(sigText)
	if err != nil || len(sig) == 0 || len(sig) > 80 {
		return fmt.Errorf("header %s is not a base64 signature: %w", v.sigHeader, ErrMalformedHeader)
	}
	if v.alg == algEd25519 && len(sig) != ed25519.SignatureSize {
		return fmt.Errorf("header %s is not a base64 Ed25519 signature: %w", v.sigHeader, ErrMalformedHeader)
	}
	if err := checkTimestamp(ts, time.Second, v.tolerance, v.now()); err != nil {
		return err
	}
	msg := make([]byte, 0, len(ts)+len(v.sep)+len(body))
	msg = append(append(append(msg, ts...), v.sep...), body...)
	switch v.alg {
	case algECDSAP256:
		digest := sha256.Sum256(msg)
		for _, k := range v.ecKeys {
			if ecdsa.VerifyASN1(k, digest[:], sig) {
				return nil
			}
		}
		return fmt.Errorf("signature matches none of %d public key(s): %w", len(v.ecKeys), ErrNoMatchingSignature)
	default:
		for _, k := range v.edKeys {
			if ed25519.Verify(k, msg, sig) {
				return nil
			}
		}
		return fmt.Errorf("signature matches none of %d public key(s): %w", len(v.edKeys), ErrNoMatchingSignature)
	}
}

func (v *pubkeyVerifier) sign(body []byte, h http.Header, ts time.Time) error {
	tsText := strconv.FormatInt(ts.Unix(), 10)
	msg := append(append([]byte(tsText), v.sep...), body...)
	var sig []byte
	switch {
	case v.alg == algECDSAP256 && v.ecPriv != nil:
		digest := sha256.Sum256(msg)
		var err error
		if sig, err = ecdsa.SignASN1(rand.Reader, v.ecPriv, digest[:]); err != nil {
			return fmt.Errorf("signing: %w", err)
		}
	case v.alg == algEd25519 && v.edPriv != nil:
		sig = ed25519.Sign(v.edPriv, msg)
	default:
		return errors.New("signing needs the private key as the first secret")
	}
	h.Set(v.tsHeader, tsText)
	h.Set(v.sigHeader, base64.StdEncoding.EncodeToString(sig))
	return nil
}

// publicKeySecret maps a private signing key of a pubkeyVerifier preset to
// the public key the gateway is configured with.
func publicKeySecret(provider, s string) (string, bool, error) {
	if _, ok := fetchedKeyAlg[provider]; ok {
		pub, err := fetchedPublicSecret(provider, s)
		return pub, true, err
	}
	switch provider {
	case "sendgrid":
		der, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return "", true, errors.New("sendgrid signing secret must be a base64 DER PKCS#8 ECDSA key")
		}
		priv, err := x509.ParsePKCS8PrivateKey(der)
		k, ok := priv.(*ecdsa.PrivateKey)
		if err != nil || !ok {
			return "", true, errors.New("sendgrid signing secret must be a base64 DER PKCS#8 ECDSA key")
		}
		pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
		if err != nil {
			return "", true, err
		}
		return base64.StdEncoding.EncodeToString(pub), true, nil
	case "telnyx":
		seed, ok := strings.CutPrefix(s, "seed:")
		b, err := base64.StdEncoding.DecodeString(seed)
		if !ok || err != nil || len(b) != ed25519.SeedSize {
			return "", true, errors.New("telnyx signing secret must be seed:<base64 32-byte seed>")
		}
		pub := ed25519.NewKeyFromSeed(b).Public().(ed25519.PublicKey)
		return base64.StdEncoding.EncodeToString(pub), true, nil
	}
	return "", false, nil
}
