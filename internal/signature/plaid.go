package signature

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/keyfetch"
)

// Plaid signs each webhook with a JWT in Plaid-Verification: ES256, its
// header naming the key (kid), its claims the issue time (iat) and the
// hex SHA-256 of the raw body (request_body_sha256). The key is fetched by
// ID from Plaid's API (POST /webhook_verification_key/get with the
// client's API credentials), only from the environment's Plaid host, after
// the body's digest matched the claim; a key Plaid reports expired
// (expired_at set) or does not know (its 400 answer) refuses the delivery. A token older than
// the tolerance (5 minutes, Plaid's) is refused, and so is one issued more
// than the tolerance ahead. Source: Plaid, "Verify webhooks" (Doc).
//
// The configured secret is "<environment>:<client_id>:<secret>" with
// environment production or sandbox: the credentials are sent to Plaid only,
// in the key request, and never logged. Plaid's webhooks carry no event ID:
// configure event_id (e.g. json webhook_code with a value the body names).
// plaid-node is an API client without webhook verification: documentation
// only.
func init() {
	register(Preset{
		Name:         "plaid",
		SecretFormat: "`<production|sandbox>:<client_id>:<secret>`, the API credentials that fetch Plaid's key",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, For: 24 * time.Hour, Note: "after a non-200 answer or none within 10 s; delays start at 30 s and grow 4x; none when over 90% of the last day's webhooks were refused", Source: "https://plaid.com/docs/api/webhooks/#webhook-retries"},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 10 * time.Second, Source: "https://plaid.com/docs/api/webhooks/#webhook-retries"},
			Answer:  Answer{Status: http.StatusOK, Note: "answer before processing", Source: "https://plaid.com/docs/api/webhooks/#webhook-retries"},
			Refusal: Refusal{Note: "no status required; a non-200 answer is retried", Source: "https://plaid.com/docs/api/webhooks/#webhook-retries"},
		},
		Doc:              "https://plaid.com/docs/api/webhooks/webhook-verification/",
		SignatureHeader:  "Plaid-Verification: <JWT, ES256, key by kid from Plaid's API>",
		DefaultTolerance: 5 * time.Minute,
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "Plaid-Verification"}},
			Signed:    "JWT claims iat and request_body_sha256 = hex SHA-256 of the body",
			Algorithm: "ecdsa-p256-sha256",
			Encoding:  "jwt",
		},
		build: buildPlaid,
	})
}

const plaidKeyPath = "/webhook_verification_key/get"

var plaidHosts = map[string]string{"production": "production.plaid.com", "sandbox": "sandbox.plaid.com"}

var plaidKeys = keyfetch.New(keyfetch.Policy{Hosts: []string{"production.plaid.com", "sandbox.plaid.com"}, MaxBytes: 8 << 10})

type plaidCreds struct {
	host, clientID, secret string
}

type plaid struct {
	creds     []plaidCreds
	key       crypto.Signer // for sign
	tolerance time.Duration
	now       func() time.Time
}

func buildPlaid(p Preset, o Options) (signer, error) {
	set, key, err := settings(o)
	if err != nil {
		return nil, err
	}
	v := &plaid{key: key}
	for i, s := range set {
		env, rest, ok1 := strings.Cut(s, ":")
		id, secret, ok2 := strings.Cut(rest, ":")
		host := plaidHosts[env]
		if !ok1 || !ok2 || host == "" || id == "" || secret == "" {
			return nil, fmt.Errorf("secret %d: want <production|sandbox>:<client_id>:<secret>", i+1)
		}
		v.creds = append(v.creds, plaidCreds{host: host, clientID: id, secret: secret})
	}
	v.tolerance, v.now = clock(p, o)
	return v, nil
}

func (v *plaid) Verify(body []byte, h http.Header) error {
	tok, err := oneValue(h, "Plaid-Verification")
	if err != nil {
		return err
	}
	j, err := parseJWS(tok, "ES256", 4<<10)
	if err != nil {
		return err
	}
	kid := j.header.Get("kid")
	if kid.Type != gjson.String || kid.Str == "" || len(kid.Str) > 128 {
		return fmt.Errorf("token has no kid: %w", ErrMalformedHeader)
	}
	iat := j.payload.Get("iat")
	claimed := j.payload.Get("request_body_sha256")
	if iat.Type != gjson.Number || claimed.Type != gjson.String {
		return fmt.Errorf("token has no iat or request_body_sha256: %w", ErrMalformedHeader)
	}
	if d := v.now().Sub(time.Unix(iat.Int(), 0)); d > v.tolerance || -d > v.tolerance {
		return fmt.Errorf("token issued outside the %s tolerance: %w", v.tolerance, ErrTimestampOutOfTolerance)
	}
	// Checked before any key is fetched: a body that is not the one the
	// token names costs no request to Plaid.
	sum := sha256.Sum256(body)
	if subtle.ConstantTimeCompare([]byte(hex.EncodeToString(sum[:])), []byte(claimed.Str)) != 1 {
		return fmt.Errorf("request_body_sha256 is not the body's digest: %w", ErrNoMatchingSignature)
	}
	var lastErr error
	for _, c := range v.creds {
		pub, err := v.fetchKey(c, kid.Str)
		if err != nil {
			lastErr = err
			continue
		}
		if j.verifyES256(pub) {
			return nil
		}
	}
	if lastErr != nil && errors.Is(lastErr, ErrKeyUnavailable) {
		return lastErr
	}
	return fmt.Errorf("token signature does not verify with Plaid's key %q: %w", kid.Str, ErrNoMatchingSignature)
}

// fetchKey asks Plaid for the key named kid with one client's credentials.
// An unknown key ID is Plaid's 400 answer: the token names no key of this
// client, so the delivery is refused rather than retried.
func (v *plaid) fetchKey(c plaidCreds, kid string) (*ecdsa.PublicKey, error) {
	req, err := json.Marshal(map[string]string{"client_id": c.clientID, "secret": c.secret, "key_id": kid})
	if err != nil {
		return nil, err
	}
	raw, err := plaidKeys.Post("https://"+c.host+plaidKeyPath, req, "application/json")
	var se *keyfetch.StatusError
	if errors.As(err, &se) && se.Code == http.StatusBadRequest {
		return nil, fmt.Errorf("no key %q at Plaid for this client: %w", kid, ErrNoMatchingSignature)
	}
	if err != nil {
		return nil, fetchErr("Plaid's key", err)
	}
	var ans struct {
		Key jwk `json:"key"`
	}
	if json.Unmarshal(raw, &ans) != nil {
		return nil, fmt.Errorf("the answer of Plaid's key endpoint does not parse: %w", ErrKeyUnavailable)
	}
	if ans.Key.Kid != kid {
		return nil, fmt.Errorf("the key endpoint answered another key: %w", ErrKeyUnavailable)
	}
	if ans.Key.ExpiredAt != nil {
		return nil, fmt.Errorf("the Plaid key %q has expired: %w", kid, ErrNoMatchingSignature)
	}
	pub, err := ans.Key.ec()
	if err != nil {
		return nil, fmt.Errorf("the Plaid key: %s: %w", err, ErrKeyUnavailable)
	}
	return pub, nil
}

// sign sets Plaid-Verification for body at ts; the key is published where
// Plaid's key endpoint answers for its ID (keyfetch.Publish).
func (v *plaid) sign(body []byte, h http.Header, ts time.Time) error {
	if v.key == nil {
		return errors.New("signing needs a private key: secret <environment>:<client_id>:<secret>|<base64 PKCS#8 key> (NewSigningSecret)")
	}
	kid := keyID(v.key.Public())
	k := jwkOf(v.key.Public(), kid)
	created := ts.Unix()
	ans, err := json.Marshal(map[string]any{"key": map[string]any{
		"alg": k.Alg, "crv": k.Crv, "kid": k.Kid, "kty": k.Kty, "use": k.Use, "x": k.X, "y": k.Y,
		"created_at": created, "expired_at": nil,
	}, "request_id": "test-" + kid})
	if err != nil {
		return err
	}
	keyfetch.Publish("https://"+v.creds[0].host+plaidKeyPath+"#"+v.creds[0].clientID+":"+kid, ans)
	sum := sha256.Sum256(body)
	tok, err := signJWS(v.key, map[string]any{"alg": "ES256", "kid": kid, "typ": "JWT"},
		map[string]any{"iat": ts.Unix(), "request_body_sha256": hex.EncodeToString(sum[:])})
	if err != nil {
		return err
	}
	h.Set("Plaid-Verification", tok)
	return nil
}
