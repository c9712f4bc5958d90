package signature

import (
	"fmt"
	"time"
)

// SignBody returns body as provider would send it at ts, signed with
// o.Secrets[0], for schemes whose signature lives in the body (mailgun,
// msgraph). Tests only; the CLI uses SignDelivery.
func SignBody(provider string, o Options, body []byte, ts time.Time) ([]byte, error) {
	s, err := build(provider, o)
	if err != nil {
		return nil, err
	}
	bs, ok := s.(bodySigner)
	if !ok {
		return nil, fmt.Errorf("provider %s signs in headers: use Sign", provider)
	}
	return bs.signBody(body, ts)
}

// AppleRootG3 is the embedded Apple root, for its fingerprint test.
const AppleRootG3 = appleRootG3

// UntrustedAppleChain returns x5c (base64 DER leaf, intermediate, root)
// with Apple's markers under a root of another key, never published as
// trusted, and that key as a signing secret for bundle.
func UntrustedAppleChain(bundle string, at time.Time) ([]string, string, error) {
	secret, err := NewSigningSecret("appstore", bundle)
	if err != nil {
		return nil, "", err
	}
	_, k, err := splitSigning(secret)
	if err != nil {
		return nil, "", err
	}
	c, err := appleChain(k, at, false)
	if err != nil {
		return nil, "", err
	}
	return []string{b64std(c[0]), b64std(c[1]), b64std(c[2])}, secret, err
}

// ResignJWS signs header and claims with the signing secret's key.
func ResignJWS(secret string, header, claims map[string]any) (string, error) {
	_, k, err := splitSigning(secret)
	if err != nil {
		return "", err
	}
	return signJWS(k, header, claims)
}
