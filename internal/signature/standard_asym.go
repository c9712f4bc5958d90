package signature

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Standard Webhooks' asymmetric signatures ("v1a,<base64 Ed25519>" entries,
// keys whpk_<base64 public key> to verify and whsk_<base64 private key> to
// sign) are public-key signatures the HMAC engine cannot express, so this
// file handles them. A route may mix whsec_ and whpk_ secrets while a sender
// moves from one to the other: the HMAC engine checks the v1 entries with the
// whsec_ secrets, this code the v1a entries with the whpk_ keys, and one
// match of either passes. An entry of a kind no configured secret can check
// is never "nothing to check, pass": a header with no verifiable entry fails.
// See https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md#asymmetric-signatures

func hasAsymmetric(secrets []string) bool {
	for _, s := range secrets {
		if strings.HasPrefix(s, "whpk_") || strings.HasPrefix(s, "whsk_") {
			return true
		}
	}
	return false
}

type standardAsym struct {
	hmac      signer // nil when no whsec_ secret is configured
	headers   []HeaderSet
	pubs      []ed25519.PublicKey
	priv      ed25519.PrivateKey // first whsk_ secret, for sign
	tolerance time.Duration
	now       func() time.Time
}

func buildStandardAsymmetric(p Preset, o Options) (signer, error) {
	a := &standardAsym{headers: p.Headers}
	a.tolerance, a.now = clock(p, o)
	var sym []string
	for i, s := range o.Secrets {
		switch {
		case strings.HasPrefix(s, "whpk_"):
			k, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "whpk_"))
			if err != nil || len(k) != ed25519.PublicKeySize {
				return nil, fmt.Errorf("secret %d is not a whpk_ base64 Ed25519 public key", i+1)
			}
			a.pubs = append(a.pubs, ed25519.PublicKey(k))
		case strings.HasPrefix(s, "whsk_"):
			k, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "whsk_"))
			if err != nil || (len(k) != ed25519.PrivateKeySize && len(k) != ed25519.SeedSize) {
				return nil, fmt.Errorf("secret %d is not a whsk_ base64 Ed25519 private key", i+1)
			}
			if len(k) == ed25519.SeedSize {
				k = ed25519.NewKeyFromSeed(k)
			}
			priv := ed25519.PrivateKey(k)
			if a.priv == nil {
				a.priv = priv
			}
			// A signing key also verifies: tests and the CLI sign and verify
			// with one configured secret.
			a.pubs = append(a.pubs, priv.Public().(ed25519.PublicKey))
		default:
			sym = append(sym, s)
		}
	}
	if len(sym) > 0 {
		so := o
		so.Secrets = sym
		e, err := newEngine(p, p.Scheme, so)
		if err != nil {
			return nil, err
		}
		a.hmac = e
	}
	return a, nil
}

func (a *standardAsym) pick(h http.Header) (HeaderSet, error) {
	for _, hs := range a.headers {
		if present(h, hs.Signature) || present(h, hs.Timestamp) || present(h, hs.ID) {
			return hs, nil
		}
	}
	return HeaderSet{}, fmt.Errorf("header %s: %w", a.headers[0].Signature, ErrMissingHeader)
}

func (a *standardAsym) Verify(body []byte, h http.Header) error {
	var hmacErr error
	if a.hmac != nil {
		hmacErr = a.hmac.Verify(body, h)
		if hmacErr == nil || !(errors.Is(hmacErr, ErrNoMatchingSignature) || errors.Is(hmacErr, ErrMalformedHeader)) {
			return hmacErr // valid, or refused for a reason v1a cannot fix (headers, timestamp)
		}
	}
	hs, err := a.pick(h)
	if err != nil {
		return err
	}
	raw, ts, err := signedAt(h, hs.Signature, hs.Timestamp)
	if err != nil {
		return err
	}
	id, err := oneValue(h, hs.ID)
	if err != nil {
		return err
	}
	if err := checkTimestamp(ts, time.Second, a.tolerance, a.now()); err != nil {
		return err
	}
	msg := make([]byte, 0, len(id)+len(ts)+len(body)+2)
	msg = append(append(append(append(append(msg, id...), '.'), ts...), '.'), body...)
	checked := 0
	for entry := range strings.SplitSeq(raw, " ") {
		key, val, ok := strings.Cut(strings.TrimSpace(entry), ",")
		if !ok || key != "v1a" {
			continue
		}
		sig, err := base64.StdEncoding.DecodeString(val)
		if err != nil || len(sig) != ed25519.SignatureSize {
			continue
		}
		checked++
		for _, pub := range a.pubs {
			if ed25519.Verify(pub, msg, sig) {
				return nil
			}
		}
	}
	if checked == 0 && hmacErr != nil {
		return hmacErr
	}
	return fmt.Errorf("%s: %d v1a signature(s) checked against %d public key(s): %w",
		hs.Signature, checked, len(a.pubs), ErrNoMatchingSignature)
}

func (a *standardAsym) sign(body []byte, h http.Header, ts time.Time) error {
	if a.priv == nil {
		if a.hmac != nil {
			return a.hmac.sign(body, h, ts)
		}
		return errors.New("signing needs a whsk_ private key or a whsec_ secret first")
	}
	hs := a.headers[0]
	id := h.Get(hs.ID)
	if id == "" {
		return fmt.Errorf("signing needs header %s", hs.ID)
	}
	tsText := strconv.FormatInt(ts.Unix(), 10)
	sig := ed25519.Sign(a.priv, []byte(id+"."+tsText+"."+string(body)))
	h.Set(hs.Timestamp, tsText)
	h.Set(hs.Signature, "v1a,"+base64.StdEncoding.EncodeToString(sig))
	return nil
}
