package signature

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Discord signs interactions with Ed25519, a public-key scheme the HMAC
// engine cannot express: X-Signature-Ed25519 is the hex signature of
// X-Signature-Timestamp followed by the raw body, verified with the
// application's public key (hex, from the developer portal) as the secret.
// The timestamp is signed, so a tolerance applies; the interaction ID is in
// the signed body. PING interactions (type 1) are the endpoint handshake and
// pass through without a claim.
//
// Sign (tests, the CLI) takes the 32-byte private seed in hex as the secret
// instead; PublicSecret turns such a seed into the public key the gateway is
// configured with.
func init() {
	register(Preset{
		Name:         "discord",
		SecretFormat: "the application's public key (hex Ed25519)",
		Delivery: Delivery{
			// The interactions documents say nothing of a redelivery (an
			// unanswered interaction fails for the user); Discord's webhook
			// events, sent to a separate URL, are retried for up to 10
			// minutes (docs/events/webhook-events#responding-to-events).
			Retry:   Retry{Source: Undocumented},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{Duration: 3 * time.Second, Note: "the interaction fails for the user after it", Source: "https://discord.com/developers/docs/interactions/receiving-and-responding#responding-to-an-interaction"},
			Answer:  Answer{Note: "an interaction response (a PING gets {\"type\":1})", Source: "https://discord.com/developers/docs/interactions/receiving-and-responding#responding-to-an-interaction"},
			Refusal: Refusal{Status: 401, Note: "Discord sends deliberately bad signatures and removes the endpoint unless it answers 401", Source: "https://discord.com/developers/docs/interactions/overview#setting-up-an-endpoint-validating-security-request-headers"},
		},
		Doc:              "https://discord.com/developers/docs/interactions/overview#setting-up-an-endpoint-validating-security-request-headers",
		SignatureHeader:  "X-Signature-Ed25519: <hex> (with X-Signature-Timestamp)",
		DefaultTolerance: 5 * time.Minute,
		EventID:          ids(jsonID("id")),
		ReplayResponse:   true, // the answer is the interaction response
		// Discord's docs (Doc) require 401 for an invalid signature and
		// check it with deliberately bad ones, removing the endpoint's URL
		// when it answers anything else.
		RefuseStatus: http.StatusUnauthorized,
		Oracle:       "discord-interactions",
		Challenges: []Challenge{{
			Name: "PING", Method: http.MethodPost, BodyField: "type", BodyValue: "1",
			Auth: AuthSignature, Answer: AnswerFixed, Body: `{"type":1}`,
		}},
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Signature-Ed25519", Timestamp: "X-Signature-Timestamp"}},
			Signed:    "{timestamp}{body}",
			Algorithm: "ed25519",
			Encoding:  "hex",
		},
		build: buildDiscord,
	})
}

type discord struct {
	sigHeader, tsHeader string
	keys                []ed25519.PublicKey
	seed                []byte // first secret read as a private seed, for sign
	tolerance           time.Duration
	now                 func() time.Time
}

func buildDiscord(p Preset, o Options) (signer, error) {
	d := &discord{
		sigHeader: p.Headers[0].Signature,
		tsHeader:  p.Headers[0].Timestamp,
	}
	d.tolerance, d.now = clock(p, o)
	for i, s := range o.Secrets {
		k, err := hex.DecodeString(s)
		if err != nil || len(k) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("secret %d is not a hex Ed25519 public key (64 hex digits)", i+1)
		}
		d.keys = append(d.keys, ed25519.PublicKey(k))
	}
	d.seed, _ = hex.DecodeString(o.Secrets[0])
	return d, nil
}

func (d *discord) Verify(body []byte, h http.Header) error {
	sigText, ts, err := signedAt(h, d.sigHeader, d.tsHeader)
	if err != nil {
		return err
	}
	sig, err := hex.DecodeString(sigText)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return fmt.Errorf("header %s is not a hex Ed25519 signature: %w", d.sigHeader, ErrMalformedHeader)
	}
	if err := checkTimestamp(ts, time.Second, d.tolerance, d.now()); err != nil {
		return err
	}
	msg := make([]byte, 0, len(ts)+len(body))
	msg = append(append(msg, ts...), body...)
	for _, k := range d.keys {
		if ed25519.Verify(k, msg, sig) {
			return nil
		}
	}
	return fmt.Errorf("signature matches none of %d public key(s): %w", len(d.keys), ErrNoMatchingSignature)
}

func (d *discord) sign(body []byte, h http.Header, ts time.Time) error {
	if len(d.seed) != ed25519.SeedSize {
		return errors.New("signing needs the private seed (hex) as the first secret")
	}
	priv := ed25519.NewKeyFromSeed(d.seed)
	tsText := strconv.FormatInt(ts.Unix(), 10)
	sig := ed25519.Sign(priv, append([]byte(tsText), body...))
	h.Set(d.tsHeader, tsText)
	h.Set(d.sigHeader, hex.EncodeToString(sig))
	return nil
}

// PublicSecret returns the secret a gateway verifies with when signingSecret
// is what Sign signs with. For HMAC and token schemes they are the same; for
// discord (Ed25519) signingSecret is the private seed in hex and the result
// is the matching public key in hex; for sendgrid (ECDSA) and telnyx
// (Ed25519) see pubkey.go.
func PublicSecret(provider, signingSecret string) (string, error) {
	if pub, ok, err := publicKeySecret(provider, signingSecret); ok {
		return pub, err
	}
	if provider != "discord" {
		return signingSecret, nil
	}
	seed, err := hex.DecodeString(signingSecret)
	if err != nil || len(seed) != ed25519.SeedSize {
		return "", errors.New("discord signing secret must be a 32-byte private seed in hex")
	}
	pub := ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)
	return hex.EncodeToString(bytes.Clone(pub)), nil
}
