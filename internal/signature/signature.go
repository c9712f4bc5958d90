// Package signature verifies webhook signatures over the raw request body
// before a delivery is deduplicated or forwarded.
//
// Every provider is a Preset. Most presets are plain data: a Scheme that the
// one generic HMAC engine (engine.go) reads to find the signature header(s),
// parse them, rebuild the signed bytes, and compare. A new plain-HMAC
// provider is one Preset value plus its conformance vectors. Only schemes the
// engine cannot express have code of their own (twilio.go, gitlab.go,
// discord.go, pubkey.go for ECDSA and Ed25519 keys, bodysig.go for
// signatures inside the body, and the user-configured hmac.go), and say so.
//
// A preset also describes, as data, what surrounds its signature: its
// endpoint handshakes (Challenge, MatchHandshake), its batches of events
// (Batch) and whether its default event ID survives retries (Stability).
//
// Every configured secret is tried (rotation), every signature in a header is
// tried, comparisons are constant-time, and timestamps are checked against the
// tolerance in both directions. Errors wrap exactly one of the Err* sentinels
// and never contain a secret, a signature or a body.
package signature

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"
)

// Reasons a delivery fails verification. Every error returned by a Verifier
// wraps exactly one of them; branch with errors.Is.
var (
	// ErrMissingHeader: the signature header (or the timestamp or ID header
	// the scheme signs) is absent.
	ErrMissingHeader = errors.New("missing signature header")
	// ErrMalformedHeader: a header is present but cannot be parsed: empty,
	// garbage, a wrong prefix, a signature that does not decode to a digest,
	// a timestamp that is not a number, a header repeated on several lines,
	// or a Stripe header with two t= fields.
	ErrMalformedHeader = errors.New("malformed signature header")
	// ErrNoMatchingSignature: the header parsed, but no signature in it
	// matches the request under any configured secret.
	ErrNoMatchingSignature = errors.New("no matching signature")
	// ErrTimestampOutOfTolerance: the signed timestamp is further in the past
	// or the future than the tolerance allows.
	ErrTimestampOutOfTolerance = errors.New("timestamp outside tolerance")
	// ErrBodyNotJSON: the signature matches, but the body is not the JSON
	// object the provider always sends (schemes with Scheme.JSONBody, as
	// stripe-go refuses it). Only a correctly signed body gets it, so it
	// says nothing about the secrets.
	ErrBodyNotJSON = errors.New("body is not JSON")
	// ErrBodyNotForm: a form-signed scheme (twilio) cannot rebuild the
	// signed text because the body is not application/x-www-form-urlencoded.
	// Decided from the body alone, before any secret is used.
	ErrBodyNotForm = errors.New("body is not a form")
)

// Verifier checks one delivery. body is the raw request body, byte for byte
// (decoded when the provider signs the uncompressed body); h is the request
// header as net/http delivers it. A nil error means the delivery is
// authentic. Verifiers are safe for concurrent use.
type Verifier interface {
	Verify(body []byte, h http.Header) error
}

// HMACOptions describes the custom scheme of provider "hmac": an HMAC of the
// raw body carried in one header, with no timestamp.
type HMACOptions struct {
	// Header is the name of the signature header, e.g. X-Webhook-Signature.
	// Required.
	Header string
	// Algorithm is sha1, sha256 or sha512. Defaults to sha256.
	Algorithm string
	// Encoding is hex or base64 (standard, padded). Defaults to hex.
	Encoding string
	// Prefix is text that precedes the encoded signature, e.g. "sha256=".
	// Defaults to none.
	Prefix string
}

// Options configures a Verifier. The zero value of every field except
// Secrets means "the preset's default".
type Options struct {
	// Secrets are the provider's signing secrets, as the provider displays
	// them (Stripe's whsec_..., Standard Webhooks' whsec_<base64>, ...), or
	// its public keys for public-key schemes (discord: hex Ed25519; telnyx:
	// base64 Ed25519; sendgrid: base64 DER ECDSA P-256).
	// Every one is tried, so a rotation can list the new and the old secret.
	// At least one is required.
	Secrets []string
	// Tolerance is how far a signed timestamp may be from the clock, in
	// either direction. 0 means the preset's default. Ignored by schemes
	// without a timestamp.
	Tolerance time.Duration
	// URL is the public URL the provider delivers to, exactly as configured
	// at the provider, for schemes that sign it (square, twilio, hubspot).
	// The request's Host and X-Forwarded-* headers are never used.
	URL string
	// AllowSHA1 lets provider github accept the legacy X-Hub-Signature
	// (HMAC-SHA1) header, and only when X-Hub-Signature-256 is absent: a bad
	// SHA-256 signature is never overridden by a SHA-1 one.
	AllowSHA1 bool
	// HMAC is the custom scheme of provider "hmac" (Header required). For a
	// preset run by the generic engine its non-empty fields override the
	// preset's signature header, algorithm, encoding and prefix; presets with
	// bespoke code (twilio, gitlab, ...) refuse it, except that a preset with
	// HeaderConfigurable (okta) takes Header alone.
	HMAC HMACOptions
	// Now is the clock used for timestamp checks. nil means time.Now.
	Now func() time.Time
}

// signer is what every Verifier built by New also does: set the headers a
// real provider would send for body at ts, signed with the first secret.
type signer interface {
	Verifier
	sign(body []byte, h http.Header, ts time.Time) error
}

// New returns the Verifier of provider (see Providers) configured by o.
func New(provider string, o Options) (Verifier, error) {
	return build(provider, o)
}

// Sign sets on h the signature headers provider would send for body at time
// ts, signed with o.Secrets[0]. Headers the scheme signs but does not derive
// (Standard Webhooks' webhook-id) must already be set on h. It is meant for
// tests and the CLI.
func Sign(provider string, o Options, body []byte, h http.Header, ts time.Time) error {
	s, err := build(provider, o)
	if err != nil {
		return err
	}
	return s.sign(body, h, ts)
}

func build(provider string, o Options) (signer, error) {
	p, ok := registry[provider]
	if !ok {
		return nil, fmt.Errorf("unknown provider %q (known: %s)", provider, strings.Join(Providers(), ", "))
	}
	if err := checkOptions(p, o); err != nil {
		return nil, fmt.Errorf("provider %s: %w", provider, err)
	}
	var (
		s   signer
		err error
	)
	if p.Scheme.Secret == "whsec" && hasAsymmetric(o.Secrets) {
		s, err = buildStandardAsymmetric(p, o)
		if err != nil {
			return nil, fmt.Errorf("provider %s: %w", provider, err)
		}
		return s, nil
	}
	switch {
	case p.build != nil:
		s, err = p.build(p, o)
	case o.HMAC != (HMACOptions{}):
		var sc Scheme
		if sc, err = overrideScheme(p, o.HMAC); err == nil {
			s, err = newEngine(p, sc, o)
		}
	default:
		s, err = newEngine(p, p.Scheme, o)
	}
	if err != nil {
		return nil, fmt.Errorf("provider %s: %w", provider, err)
	}
	return s, nil
}

// overrideScheme applies the Caddyfile's `provider <name> { header ...
// algorithm ... encoding ... prefix ... }` overrides to a preset's scheme:
// Header replaces the signature header of the first header family (its
// timestamp and ID headers stay), the others replace the scheme's fields.
func overrideScheme(p Preset, c HMACOptions) (Scheme, error) {
	s := p.clone().Scheme
	if c.Header != "" {
		if !validHeaderName(c.Header) {
			return Scheme{}, fmt.Errorf("header %q is not a valid header name", c.Header)
		}
		first := s.Headers[0]
		first.Signature = c.Header
		s.Headers = []HeaderSet{first}
	}
	if c.Prefix != "" {
		s.Format.Prefix = c.Prefix
	}
	if c.Algorithm != "" {
		s.Algorithm = strings.ToLower(c.Algorithm)
	}
	if c.Encoding != "" {
		s.Encoding = strings.ToLower(c.Encoding)
	}
	if err := s.validate(p); err != nil {
		return Scheme{}, err
	}
	return s, nil
}

// checkOptions validates what every provider shares. Messages name the
// offending field and never echo a secret or the URL (it may carry
// credentials).
func checkOptions(p Preset, o Options) error {
	if len(o.Secrets) == 0 {
		return errors.New("at least one secret is required")
	}
	for i, s := range o.Secrets {
		if s == "" {
			return fmt.Errorf("secret %d is empty", i+1)
		}
		// A space, a line break or quotes around a secret are a copy-paste
		// slip (an env file that keeps quotes) no provider's secret has;
		// kept, every delivery would fail.
		if strings.TrimSpace(s) != s {
			return fmt.Errorf("secret %d has whitespace before or after it: remove it from the secret's value (in the Caddyfile, or the variable or file it is read from)", i+1)
		}
		if len(s) >= 2 && (s[0] == '"' || s[0] == '\'') && s[len(s)-1] == s[0] {
			return fmt.Errorf("secret %d is in quotes: remove them from the secret's value (an env file passed to docker run --env-file keeps them)", i+1)
		}
		for _, w := range p.WrongSecrets {
			if strings.HasPrefix(s, w.Prefix) {
				return fmt.Errorf("secret %d is %s (%s…), not the signing secret: %s", i+1, w.What, w.Prefix, p.SecretFormat)
			}
		}
	}
	if o.Tolerance < 0 {
		return errors.New("tolerance must not be negative")
	}
	if o.AllowSHA1 && p.Legacy == nil {
		return errors.New("allow_sha1 applies only to provider github")
	}
	if o.HMAC != (HMACOptions{}) && p.build != nil && p.Name != "hmac" && !p.overridable {
		if !p.HeaderConfigurable || o.HMAC != (HMACOptions{Header: o.HMAC.Header}) {
			return errors.New("header, algorithm, encoding and prefix cannot be overridden for this provider's scheme")
		}
		if !validHeaderName(o.HMAC.Header) {
			return fmt.Errorf("header %q is not a valid header name", o.HMAC.Header)
		}
	}
	if p.NeedsURL {
		if o.URL == "" {
			return errors.New("url is required: the provider signs the public URL it delivers to")
		}
		u, err := url.Parse(o.URL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return errors.New("url must be an absolute http or https URL")
		}
	}
	return nil
}

// Lookup returns the preset named name.
func Lookup(name string) (Preset, bool) {
	p, ok := registry[name]
	if !ok {
		return Preset{}, false
	}
	return p.clone(), true
}

// Providers returns the names of every preset, sorted.
func Providers() []string {
	names := make([]string, 0, len(registry))
	for name := range registry {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}
