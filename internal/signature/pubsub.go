package signature

import (
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/keyfetch"
)

// Google Cloud Pub/Sub authenticated push (and so Google Play Real-time
// developer notifications, which arrive as Pub/Sub pushes): the request
// carries "Authorization: Bearer <OIDC ID token>", an RS256 JWT signed by
// Google for the subscription's service account. It is checked against
// Google's published keys (by kid, from www.googleapis.com/oauth2/v3/certs),
// the issuer (accounts.google.com), the audience (the configured url: the
// push endpoint, Pub/Sub's default audience; configure the same value if
// the subscription sets another), its expiry with the tolerance as clock
// skew (5 minutes, as Google's auth library allows), and the service
// account: the configured secrets are the service-account emails allowed
// to push here, with email_verified. Anyone can obtain a Google ID token
// for their own service account with any audience, so the email is what
// makes the check mean "my subscription".
//
// The token covers no byte of the body (the body's integrity rests on TLS);
// its expiry bounds how long a captured token can be replayed. Sources: "Authentication for push subscriptions" (Doc)
// and Google Play's "Real-time developer notifications reference"
// (https://developer.android.com/google/play/billing/rtdn-reference).
// google-auth-library (OAuth2Client.verifySignedJwtWithCertsAsync) is the
// oracle.
func init() {
	register(Preset{ //nolint:gosec // G101: SecretFormat describes a secret, holds none
		Name:         "pubsub",
		SecretFormat: "the push subscription's service-account email; the audience is `url`; the keys are Google's",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, For: 7 * 24 * time.Hour, Note: "redelivered with exponential backoff until acknowledged or the message retention (7 days by default) ends", Source: "https://cloud.google.com/pubsub/docs/push#receive_push"},
			MaxBody: MaxBody{Bytes: 10 << 20, Body: 16 << 20, Note: "a message's data, base64 in the push body (13.3 MiB), with at most 100 attributes of 256-byte keys and 1,024-byte values around it", Source: "https://cloud.google.com/pubsub/quotas#resource_limits"},
			Timeout: Timeout{Duration: 10 * time.Second, Note: "the subscription's acknowledgment deadline, 10 s by default, up to 600 s", Source: "https://cloud.google.com/pubsub/docs/push#receive_push"},
			Answer:  Answer{Note: "102, 200, 201, 202 or 204 acknowledges the message", Source: "https://cloud.google.com/pubsub/docs/push#receive_push"},
			Refusal: Refusal{Note: "any other status is a negative acknowledgment: redelivered", Source: "https://cloud.google.com/pubsub/docs/push#receive_push"},
		},
		Doc:              "https://cloud.google.com/pubsub/docs/authenticate-push-subscriptions",
		SignatureHeader:  "Authorization: Bearer <Google OIDC token, RS256>",
		DefaultTolerance: 5 * time.Minute,
		EventID:          ids(jsonID("message.messageId")),
		IDStability:      StabilityStable,
		NeedsURL:         true,
		Oracle:           "google-auth-library",
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "Authorization"}},
			Signed:    "JWT claims iss, aud = url, email, exp (no body bytes)",
			Algorithm: "rsa-sha256",
			Encoding:  "jwt",
		},
		build: buildPubSub,
	})
}

// googleCertsURL is where Google publishes the keys of its ID tokens.
const googleCertsURL = "https://www.googleapis.com/oauth2/v3/certs"

var googleCerts = keyfetch.New(keyfetch.Policy{Hosts: []string{"www.googleapis.com"}, MaxBytes: 32 << 10})

type pubsub struct {
	emails    []string
	audience  string
	key       crypto.Signer // for sign
	tolerance time.Duration
	now       func() time.Time
}

func buildPubSub(p Preset, o Options) (signer, error) {
	emails, key, err := settings(o)
	if err != nil {
		return nil, err
	}
	for i, e := range emails {
		if !strings.Contains(e, "@") || strings.ContainsAny(e, " \t") {
			return nil, fmt.Errorf("secret %d is not a service-account email", i+1)
		}
	}
	v := &pubsub{emails: emails, audience: o.URL, key: key}
	v.tolerance, v.now = clock(p, o)
	return v, nil
}

// bearer reads a "Bearer <token>" Authorization header.
func bearer(h http.Header) (string, error) {
	v, err := oneValue(h, "Authorization")
	if err != nil {
		return "", err
	}
	scheme, tok, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return "", fmt.Errorf("header Authorization is not a bearer token: %w", ErrMalformedHeader)
	}
	return strings.TrimSpace(tok), nil
}

func (v *pubsub) Verify(_ []byte, h http.Header) error {
	tok, err := bearer(h)
	if err != nil {
		return err
	}
	j, err := parseJWS(tok, "RS256", 8<<10)
	if err != nil {
		return err
	}
	kid := j.header.Get("kid")
	if kid.Type != gjson.String || kid.Str == "" {
		return fmt.Errorf("token has no kid: %w", ErrMalformedHeader)
	}
	c := j.payload
	iat, exp := c.Get("iat"), c.Get("exp")
	if iat.Type != gjson.Number || exp.Type != gjson.Number {
		return fmt.Errorf("token has no iat or exp: %w", ErrMalformedHeader)
	}
	now := v.now()
	if now.Before(time.Unix(iat.Int(), 0).Add(-v.tolerance)) || now.After(time.Unix(exp.Int(), 0).Add(v.tolerance)) ||
		exp.Int()-iat.Int() > 86400 {
		return fmt.Errorf("token expired or not yet valid: %w", ErrTimestampOutOfTolerance)
	}
	keys, err := googleKey(kid.Str, googleCerts.Get)
	if err == nil && len(keys) == 0 {
		// A kid the cached set lacks: Google may have rotated since.
		keys, err = googleKey(kid.Str, googleCerts.Refresh)
	}
	if err != nil {
		return err
	}
	verified := false
	for _, k := range keys {
		if pub, err := k.rsa(); err == nil && j.verifyRS256(pub) {
			verified = true
		}
	}
	if !verified {
		return fmt.Errorf("token signature does not verify with Google's key %q: %w", kid.Str, ErrNoMatchingSignature)
	}
	if iss := c.Get("iss").Str; iss != "accounts.google.com" && iss != "https://accounts.google.com" {
		return fmt.Errorf("token issuer is not Google: %w", ErrNoMatchingSignature)
	}
	if aud := c.Get("aud"); aud.Type != gjson.String || aud.Str != v.audience {
		return fmt.Errorf("token audience is not the configured url: %w", ErrNoMatchingSignature)
	}
	email := c.Get("email")
	if email.Type != gjson.String || c.Get("email_verified").Type != gjson.True {
		return fmt.Errorf("token has no verified email: %w", ErrNoMatchingSignature)
	}
	for _, e := range v.emails {
		if e == email.Str {
			return nil
		}
	}
	return fmt.Errorf("token's service account is not a configured one (%d configured): %w", len(v.emails), ErrNoMatchingSignature)
}

// googleKey returns the keys of Google's set named kid, read with get.
func googleKey(kid string, get func(string) ([]byte, error)) ([]jwk, error) {
	raw, err := get(googleCertsURL)
	if err != nil {
		return nil, fetchErr("Google's keys", err)
	}
	var set struct {
		Keys []jwk `json:"keys"`
	}
	if json.Unmarshal(raw, &set) != nil {
		return nil, fmt.Errorf("the Google key set does not parse: %w", ErrKeyUnavailable)
	}
	var out []jwk
	for _, k := range set.Keys {
		if k.Kid == kid {
			out = append(out, k)
		}
	}
	return out, nil
}

// sign sets a bearer token for the first email, issued at ts for an hour,
// and publishes the signing key in Google's key set (keyfetch.Publish).
func (v *pubsub) sign(_ []byte, h http.Header, ts time.Time) error {
	if v.key == nil {
		return errors.New("signing needs a private key: secret <service-account email>|<base64 PKCS#8 key> (NewSigningSecret)")
	}
	kid := keyID(v.key.Public())
	jwkJSON, err := json.Marshal(jwkOf(v.key.Public(), kid))
	if err != nil {
		return err
	}
	keyfetch.Publish("jwks:"+googleCertsURL, jwkJSON)
	tok, err := signJWS(v.key, map[string]any{"alg": "RS256", "kid": kid, "typ": "JWT"}, map[string]any{
		"iss": "https://accounts.google.com", "aud": v.audience, "azp": "1234567890",
		"email": v.emails[0], "email_verified": true, "sub": "1234567890",
		"iat": ts.Unix(), "exp": ts.Add(time.Hour).Unix(),
	})
	if err != nil {
		return err
	}
	h.Set("Authorization", "Bearer "+tok)
	return nil
}
