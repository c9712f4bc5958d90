package signature

import (
	"fmt"
	"net/http"
	"slices"
	"time"
)

// Preset describes one provider: how it signs (the embedded Scheme) and the
// defaults the gateway uses for it. Its fields double as the data of the
// README's provider table.
type Preset struct {
	// Name is the provider name used in the Caddyfile (provider stripe).
	Name string
	// Doc is the URL of the provider's signature documentation.
	Doc string
	// SignatureHeader describes the signature header(s) for humans, e.g.
	// "Stripe-Signature: t=<ts>,v1=<hex>".
	SignatureHeader string
	// DefaultTolerance is the timestamp tolerance when Options.Tolerance is
	// 0; 0 means the scheme has no signed timestamp.
	DefaultTolerance time.Duration
	// EventID lists the default event-ID sources, tried in order, each
	// "json <gjson path>" or "header <Name>". Empty: the user must configure
	// one.
	EventID []string
	// DedupeBody is the default of dedupe_body: true when the default event
	// ID is not covered by the signature (or there is none) and the scheme
	// has no signed timestamp, so a captured body could be replayed under a
	// fresh ID.
	DedupeBody bool
	// NeedsURL: the scheme signs the public URL, so Options.URL is required.
	NeedsURL bool
	// CredentialHeaders are request headers that carry a signature or a
	// credential besides the signature headers of Scheme.Headers: read by
	// the verifier (Plivo's main-account signature, Box's secondary one,
	// Adyen's Basic credentials) or sent with the same signature under
	// another name (Gitea's and Forgejo's older headers). The log filter
	// deletes them too.
	CredentialHeaders []string
	// ReplayResponse is the default of replay: true when the provider reads
	// the answer (Twilio's TwiML, Discord's interaction response), so a
	// duplicate must get the upstream's stored answer, not the short one.
	ReplayResponse bool
	// SingleUse is the source ("json <path>", "header <Name>", as EventID's)
	// of a value the signature covers that the provider sends once, when the
	// signature does not cover the event data (Mailgun's signature.token,
	// which its documentation asks receivers to accept once). The gateway remembers it for twice the
	// tolerance and refuses it with other data (the body without the
	// object carrying it). "": none.
	SingleUse string
	// RefuseStatus is the HTTP status the provider's documentation requires
	// for a delivery that fails verification (a bad, missing or stale
	// signature). 0 when registering means 400, the status every provider
	// accepts as "not processed"; a documented Delivery.Refusal.Status
	// sets it. Lookup always returns the
	// resolved status. Only a documented requirement sets another: Discord
	// sends deliberately bad signatures to an interactions endpoint and
	// removes the endpoint unless it answers 401 (see Doc).
	RefuseStatus int
	// IDStability says whether the default event ID stays the same across
	// the provider's retries of one event, per its documentation.
	IDStability Stability
	// Challenges are the provider's endpoint handshakes and heartbeats as
	// data (see MatchHandshake), tried in order; empty: it has none.
	Challenges []Challenge
	// Batch describes deliveries that carry several events; nil: one event
	// per delivery.
	Batch *Batch
	// HeaderConfigurable: the signature (token) header's name may be set
	// per route (Options.HMAC.Header), as Okta lets each hook choose it.
	HeaderConfigurable bool
	// Oracle names the official library (npm name) whose vectors in
	// testdata/oracles.json prove this preset; "" means the preset rests on
	// the provider's documentation only. TestOracles keeps the two in step.
	Oracle string
	// SecretFormat says what a configured secret is when it is not the
	// provider's signing secret as displayed, e.g. "<access key>:<secret
	// key>"; "" for the usual case.
	SecretFormat string
	// WrongSecrets are the provider's other credentials that are mistaken
	// for its signing secret (Stripe's API keys): a configured secret
	// starting with one of their prefixes is refused at load, naming it,
	// instead of failing every delivery with "no matching signature".
	WrongSecrets []WrongSecret
	// Delivery is how the provider delivers (retries, maximum body,
	// timeout, expected answer, refusal), each fact with its source.
	Delivery Delivery

	// Scheme is how the provider signs. For presets with bespoke code it
	// only describes the scheme (Signed is then prose, not a template).
	Scheme

	// build replaces the generic engine for schemes it cannot express.
	build func(p Preset, o Options) (signer, error)
	// covers, for schemes that sign a canonical form of the body rather
	// than its bytes, returns that form (see Covered).
	covers func(body []byte, h http.Header) []byte
	// overridable: build wraps the generic engine and applies the
	// Options.HMAC overrides itself (linear, gitea, forgejo).
	overridable bool
}

// Covered returns what the preset's signature covers of a delivery's body,
// in a form that is the same for every body one signature verifies: the
// body itself for schemes that sign its bytes. Twilio, Plivo and Mandrill
// sign the form's parameters sorted by name as name+value, so the same
// parameters in another order or percent-encoding, or split at other
// boundaries ("AccountSidAC1" as one name), verify under one signature;
// Gitea and Forgejo sign a form's payload field; Braintree signs bt_payload
// with or without a trailing newline; Adyen signs some fields of each item,
// SNS some members of its JSON and the App Store a JWS inside it. A replay
// record keyed on the raw bytes would take such a re-encoded capture for a
// new delivery: key it on Covered. body is the verified body; h its header.
func (p Preset) Covered(body []byte, h http.Header) []byte {
	if p.covers == nil {
		return body
	}
	return p.covers(body, h)
}

// CoversBytes reports a scheme whose Covered is the body itself.
func (p Preset) CoversBytes() bool { return p.covers == nil }

// WrongSecret is a kind of credential that is not the signing secret.
type WrongSecret struct {
	// Prefix starts every credential of the kind, e.g. "sk_".
	Prefix string
	// What it is, e.g. "a secret API key".
	What string
}

// Scheme declares how a provider signs a delivery. The generic engine reads
// it; nothing else about a plain-HMAC provider is code.
type Scheme struct {
	// Headers are the header names the scheme reads. Later sets are alias
	// families (Standard Webhooks' svix-*), used only when no header of an
	// earlier set is present.
	Headers []HeaderSet
	// Format is how the signature header's value is parsed.
	Format Format
	// Signed is the template of the signed bytes: {body}, {timestamp}, {id},
	// {url}, {method} (always POST) and literal text, e.g.
	// "{timestamp}.{body}" or "v0:{timestamp}:{body}".
	Signed string
	// Algorithm is the HMAC hash: sha1, sha256 or sha512.
	Algorithm string
	// Encoding is how signatures are written: hex, base64 (standard, padded)
	// or base64url (URL-safe, unpadded).
	Encoding string
	// Secret is how a configured secret becomes the HMAC key: "raw" (its
	// UTF-8 bytes, the default) or "whsec" (base64, after an optional whsec_
	// prefix, as Standard Webhooks does).
	Secret string
	// TimestampUnit is the unit of the signed timestamp: time.Second (the
	// default) or time.Millisecond.
	TimestampUnit time.Duration
	// TimestampLayout, when set, is the time.Parse layout of a timestamp
	// written as a date (Twitch and Box send RFC 3339); TimestampUnit is
	// then unused.
	TimestampLayout string
	// JSONBody refuses bodies that are not a JSON object even when the
	// signature matches, as the provider's official library does (stripe-go
	// parses the event and fails on anything else).
	JSONBody bool
	// Legacy is an older, weaker signature header (GitHub's X-Hub-Signature,
	// HMAC-SHA1) used only with Options.AllowSHA1 and only when no header of
	// Headers is present.
	Legacy *LegacyHeader
}

// HeaderSet names the headers of one header family.
type HeaderSet struct {
	// Signature is the header carrying the signature(s).
	Signature string
	// Timestamp is the header carrying the signed timestamp, when it is not
	// inside the signature header (Format.TimestampKey). "" = none.
	Timestamp string
	// ID is the header carrying the signed message ID ({id}). "" = none.
	ID string
}

// Format is how a signature header's value is parsed.
//
// A single value ("sha256=<hex>", "<base64>") has List == "": the value must
// start with Prefix and the rest is one signature. A list ("t=..,v1=..",
// "ts=..;h1=..", "v1,<b64> v1,<b64>") is split on List into entries, each
// split once on Pair into a key and a value: SigKey entries are signatures,
// the TimestampKey entry (at most one) is the timestamp, and other keys are
// ignored (Stripe's v0, Standard Webhooks' v1a).
type Format struct {
	Prefix       string
	List         string
	Pair         string
	SigKey       string
	TimestampKey string
	// Lenient skips list entries without a Pair separator instead of
	// refusing the header, as the Standard Webhooks libraries do.
	Lenient bool
	// TimestampFirst: the list's entries have no keys; the first is the
	// timestamp and the others are signatures (Recurly's
	// "<ts>,<hex>[,<hex>]"). Pair, SigKey and TimestampKey are unused.
	TimestampFirst bool
}

// LegacyHeader is a fallback signature header with its own prefix and hash.
type LegacyHeader struct {
	Header    string
	Prefix    string
	Algorithm string
}

func (p Preset) clone() Preset {
	p.EventID = slices.Clone(p.EventID)
	p.Headers = slices.Clone(p.Headers)
	p.Challenges = slices.Clone(p.Challenges)
	if p.Batch != nil {
		b := *p.Batch
		p.Batch = &b
	}
	if p.Legacy != nil {
		l := *p.Legacy
		p.Legacy = &l
	}
	return p
}

// registry holds every preset by name; each provider file registers its own
// in init.
var registry = map[string]Preset{}

// register adds a preset, panicking on data the engine cannot run: a broken
// preset is a programming error that every test run catches.
func register(p Preset) {
	if _, dup := registry[p.Name]; dup {
		panic("signature: preset " + p.Name + " registered twice")
	}
	if p.Doc == "" || p.SignatureHeader == "" {
		panic("signature: preset " + p.Name + " lacks Doc or SignatureHeader")
	}
	if err := p.Delivery.validate(); err != nil {
		panic(fmt.Sprintf("signature: preset %s: delivery: %v", p.Name, err))
	}
	status, err := deliveryRefuseStatus(p)
	if err != nil {
		panic(fmt.Sprintf("signature: preset %s: %v", p.Name, err))
	}
	p.RefuseStatus = status
	if p.RefuseStatus < 400 || p.RefuseStatus > 499 {
		panic(fmt.Sprintf("signature: preset %s: refusal status %d is not 4xx", p.Name, p.RefuseStatus))
	}
	if p.Scheme.Secret == "" {
		p.Scheme.Secret = "raw"
	}
	if p.Scheme.TimestampUnit == 0 {
		p.Scheme.TimestampUnit = time.Second
	}
	if p.IDStability == "" {
		p.IDStability = StabilityUndocumented
		if len(p.EventID) == 0 {
			p.IDStability = StabilityNone
		}
	}
	for i := range p.Challenges {
		if err := p.Challenges[i].validate(); err != nil {
			panic(fmt.Sprintf("signature: preset %s: handshake %d: %v", p.Name, i+1, err))
		}
	}
	if p.Batch != nil {
		if err := p.Batch.validate(); err != nil {
			panic(fmt.Sprintf("signature: preset %s: batch: %v", p.Name, err))
		}
	}
	if p.build == nil {
		if err := p.Scheme.validate(p); err != nil {
			panic(fmt.Sprintf("signature: preset %s: %v", p.Name, err))
		}
	}
	registry[p.Name] = p
}

// validate checks that the scheme is self-consistent.
func (s Scheme) validate(p Preset) error {
	if len(s.Headers) == 0 {
		return fmt.Errorf("no headers")
	}
	if _, err := newHash(s.Algorithm); err != nil {
		return err
	}
	if _, err := newCodec(s.Encoding); err != nil {
		return err
	}
	parts, err := parseTemplate(s.Signed)
	if err != nil {
		return err
	}
	hasTS := s.Format.TimestampKey != "" || s.Format.TimestampFirst
	for _, hs := range s.Headers {
		if hs.Signature == "" {
			return fmt.Errorf("header set without a signature header")
		}
		if hs.Timestamp != "" && (s.Format.TimestampKey != "" || s.Format.TimestampFirst) {
			return fmt.Errorf("timestamp both in a header and in the signature header")
		}
		hasTS = hasTS || hs.Timestamp != ""
	}
	if hasTS != (p.DefaultTolerance > 0) {
		return fmt.Errorf("a timestamp needs a default tolerance and vice versa")
	}
	for _, part := range parts {
		switch part.kind {
		case partTimestamp:
			if !hasTS {
				return fmt.Errorf("{timestamp} signed but no timestamp source")
			}
		case partID:
			for _, hs := range s.Headers {
				if hs.ID == "" {
					return fmt.Errorf("{id} signed but a header set has no ID header")
				}
			}
		case partURL:
			if !p.NeedsURL {
				return fmt.Errorf("{url} signed but NeedsURL is false")
			}
		}
	}
	if s.Format.TimestampFirst && (s.Format.List == "" || s.Format.TimestampKey != "") {
		return fmt.Errorf("TimestampFirst needs List and no TimestampKey")
	}
	if s.Format.List != "" && !s.Format.TimestampFirst && (s.Format.Pair == "" || s.Format.SigKey == "") {
		return fmt.Errorf("a list format needs Pair and SigKey")
	}
	if s.Secret != "raw" && s.Secret != "whsec" {
		return fmt.Errorf("unknown secret format %q", s.Secret)
	}
	if s.TimestampUnit != time.Second && s.TimestampUnit != time.Millisecond {
		return fmt.Errorf("timestamp unit must be seconds or milliseconds")
	}
	if s.Legacy != nil {
		if _, err := newHash(s.Legacy.Algorithm); err != nil {
			return err
		}
	}
	return nil
}

// jsonID and headerID spell event-ID sources the way eventid parses them.
func jsonID(path string) string      { return "json " + path }
func headerID(name string) string    { return "header " + name }
func ids(sources ...string) []string { return sources }
