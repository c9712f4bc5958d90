package signature

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/asn1"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"

	"github.com/tidwall/gjson"
)

// The compact JWS/JWT handling the token-signed presets share (pubsub,
// plaid, appstore). Only the algorithms a preset names are accepted; "none"
// and HMAC algorithms never are, so a token cannot choose a weaker check.

// jws is a parsed compact JWS: its header, its payload and the bytes the
// signature covers.
type jws struct {
	header, payload gjson.Result
	payloadRaw      []byte
	signed          []byte
	sig             []byte
}

var b64url = base64.RawURLEncoding

// parseJWS splits and decodes a compact JWS whose header's alg is alg.
// Every failure is ErrMalformedHeader.
func parseJWS(token, alg string, maxLen int) (*jws, error) {
	if len(token) > maxLen {
		return nil, fmt.Errorf("token longer than %d bytes: %w", maxLen, ErrMalformedHeader)
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil, fmt.Errorf("token is not a compact JWS: %w", ErrMalformedHeader)
	}
	hdr, err1 := b64url.DecodeString(parts[0])
	payload, err2 := b64url.DecodeString(parts[1])
	sig, err3 := b64url.DecodeString(parts[2])
	if err1 != nil || err2 != nil || err3 != nil || !isJSONObject(hdr) || !isJSONObject(payload) {
		return nil, fmt.Errorf("token is not base64url JSON: %w", ErrMalformedHeader)
	}
	j := &jws{header: gjson.ParseBytes(hdr), payload: gjson.ParseBytes(payload), payloadRaw: payload,
		signed: []byte(parts[0] + "." + parts[1]), sig: sig}
	if a := j.header.Get("alg"); a.Type != gjson.String || a.Str != alg {
		return nil, fmt.Errorf("token alg is not %s: %w", alg, ErrMalformedHeader)
	}
	if crit := j.header.Get("crit"); crit.Exists() {
		return nil, fmt.Errorf("token has critical extensions: %w", ErrMalformedHeader)
	}
	return j, nil
}

// verifyRS256 and verifyES256 check j's signature with pub.
func (j *jws) verifyRS256(pub *rsa.PublicKey) bool {
	d := sha256.Sum256(j.signed)
	return rsa.VerifyPKCS1v15(pub, crypto.SHA256, d[:], j.sig) == nil
}

func (j *jws) verifyES256(pub *ecdsa.PublicKey) bool {
	if len(j.sig) != 64 || pub.Curve != elliptic.P256() {
		return false
	}
	d := sha256.Sum256(j.signed)
	r, s := new(big.Int).SetBytes(j.sig[:32]), new(big.Int).SetBytes(j.sig[32:])
	return ecdsa.Verify(pub, d[:], r, s)
}

// signJWS makes a compact JWS of header and claims with k (RS256 for RSA,
// ES256 for P-256), for the test signers.
func signJWS(k crypto.Signer, header, claims map[string]any) (string, error) {
	hb, err := json.Marshal(header)
	if err != nil {
		return "", err
	}
	cb, err := json.Marshal(claims)
	if err != nil {
		return "", err
	}
	signed := b64url.EncodeToString(hb) + "." + b64url.EncodeToString(cb)
	d := sha256.Sum256([]byte(signed))
	sig, err := k.Sign(rand.Reader, d[:], crypto.SHA256)
	if err != nil {
		return "", err
	}
	if _, ok := k.Public().(*ecdsa.PublicKey); ok {
		// ASN.1 to JOSE's fixed r||s.
		var esig struct{ R, S *big.Int }
		if _, err := asn1Unmarshal(sig, &esig); err != nil {
			return "", err
		}
		raw := make([]byte, 64)
		esig.R.FillBytes(raw[:32])
		esig.S.FillBytes(raw[32:])
		sig = raw
	}
	return signed + "." + b64url.EncodeToString(sig), nil
}

// jwk is the subset of a JSON Web Key the presets read.
type jwk struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Alg string `json:"alg,omitempty"`
	Use string `json:"use,omitempty"`
	N   string `json:"n,omitempty"`
	E   string `json:"e,omitempty"`
	Crv string `json:"crv,omitempty"`
	X   string `json:"x,omitempty"`
	Y   string `json:"y,omitempty"`
	// Plaid's key endpoint adds the key's lifetime.
	ExpiredAt *int64 `json:"expired_at,omitempty"`
}

func (k jwk) rsa() (*rsa.PublicKey, error) {
	if k.Kty != "RSA" {
		return nil, errors.New("not an RSA key")
	}
	n, err1 := b64url.DecodeString(k.N)
	e, err2 := b64url.DecodeString(k.E)
	if err1 != nil || err2 != nil || len(n) < 256 || len(e) == 0 || len(e) > 4 {
		return nil, errors.New("not an RSA key of 2048 bits or more")
	}
	return &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}, nil
}

func (k jwk) ec() (*ecdsa.PublicKey, error) {
	if k.Kty != "EC" || k.Crv != "P-256" {
		return nil, errors.New("not a P-256 key")
	}
	x, err1 := b64url.DecodeString(k.X)
	y, err2 := b64url.DecodeString(k.Y)
	if err1 != nil || err2 != nil || len(x) != 32 || len(y) != 32 {
		return nil, errors.New("not a P-256 key")
	}
	raw := append(append([]byte{4}, x...), y...)
	pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), raw)
	if err != nil {
		return nil, errors.New("not a point on P-256")
	}
	return pub, nil
}

// jwkOf describes pub as a JWK named kid.
func jwkOf(pub crypto.PublicKey, kid string) jwk {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		return jwk{Kty: "RSA", Kid: kid, Alg: "RS256", Use: "sig", N: b64url.EncodeToString(k.N.Bytes()),
			E: b64url.EncodeToString(big.NewInt(int64(k.E)).Bytes())}
	case *ecdsa.PublicKey:
		raw, _ := k.Bytes()
		return jwk{Kty: "EC", Kid: kid, Alg: "ES256", Use: "sig", Crv: "P-256",
			X: b64url.EncodeToString(raw[1:33]), Y: b64url.EncodeToString(raw[33:])}
	}
	return jwk{}
}

func asn1Unmarshal(b []byte, v any) ([]byte, error) { return asn1.Unmarshal(b, v) }
