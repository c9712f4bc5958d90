package caddymodule

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"
)

// The Idempotency-Key mode puts the gateway in front of a client API (no
// signature): the key is the client's Idempotency-Key header, scoped by the
// client's identity; the first request with a key is forwarded once, its
// answer stored, and later requests with the key get that answer replayed.
// Anchors: the IETF draft "The Idempotency-Key HTTP Header Field"
// (draft-ietf-httpapi-idempotency-key-header) and Stripe's API idempotency
// (https://docs.stripe.com/api/idempotent_requests).
//
// It is a provider rather than a mode: mode already says how a request is
// delivered (sync or async), and this says where the key comes from and
// that no signature is verified, which is what a provider says.
const providerIdempotencyKey = "idempotency_key"

const (
	// idemRetention is the default retention of provider idempotency_key:
	// Stripe keeps keys 24 h.
	idemRetention = 24 * time.Hour
	// maxKeyLen is the longest accepted key, in bytes.
	maxKeyLen = 255
	// outcomeKeyReused: the key came with another request fingerprint: 422
	// (in allOutcomes, metrics.go).
	outcomeKeyReused = "key_reused"
	// clientShared is IdempotencyKeyConfig.Client's value for one key
	// space shared by every caller.
	clientShared = "shared"
	// defaultClientHeader identifies the caller when nothing else is
	// configured.
	defaultClientHeader = "Authorization"
)

// fingerprintParts are what a request fingerprint may cover, in its order.
var fingerprintParts = []string{"method", "path", "query", "body"}

// IdempotencyKeyConfig configures provider idempotency_key.
type IdempotencyKeyConfig struct {
	// Header is the request header carrying the key, 1 to 255 bytes (a
	// structured-field string in quotes is unquoted). Default:
	// Idempotency-Key.
	Header string `json:"header,omitempty"`

	// ClientHeader names a request header that identifies the client. Its
	// SHA-256 scopes the key, so two clients' keys never collide and one
	// client never gets another's stored answer; the raw value is never
	// stored or logged. Exclusive with Client. Default: Authorization,
	// when Client is not set either.
	ClientHeader string `json:"client_header,omitempty"`

	// Client is a Caddy placeholder that identifies the client, e.g.
	// {http.auth.user.id} after basic_auth or forward_auth, evaluated per
	// request and hashed like ClientHeader. A request whose identity is
	// empty (no such header, an empty placeholder) is refused with 401: it
	// has no key space of its own. The value "shared" puts every caller in
	// one key space instead, so a caller can be answered with another's
	// stored answer; it is logged as a warning at load and is meant for
	// APIs whose callers are one party (an internal service).
	Client string `json:"client,omitempty"`

	// Fingerprint lists what of the request the fingerprint stored with the
	// claim covers: method, path, query, body (its SHA-256). A request
	// reusing a key with another fingerprint is refused with 422. Default:
	// all four; "none" stores no fingerprint and checks nothing.
	Fingerprint []string `json:"fingerprint,omitempty"`

	// Optional forwards requests without a key unchanged, without
	// deduplication. Default false: they get 400.
	Optional bool `json:"optional,omitempty"`

	// Store4xx stores 4xx answers and replays them, as Stripe does, except
	// the ones that invite a retry (408, 409, 425, 429), which release the
	// key like 5xx answers do. 2xx and 3xx are always stored; 5xx never
	// (the key is released, so the client's retry runs again). Default
	// true.
	Store4xx *bool `json:"store_4xx,omitempty"`

	// Store5xx stores 5xx answers (except 503, which asks for a retry) and
	// replays them, as Stripe's API does: for an API whose 5xx can follow
	// work it has committed, where running a retry again would do it
	// twice. Default false: a 5xx releases the key and the client's retry
	// runs again, since a legacy handler's 5xx usually means it failed
	// before committing anything.
	Store5xx bool `json:"store_5xx,omitempty"`
}

// idemKey is the provisioned Idempotency-Key mode.
type idemKey struct {
	header       string
	clientHeader string
	client       string
	parts        []string // of fingerprintParts; empty: no fingerprint
	optional     bool
	store4xx     bool
	store5xx     bool
}

// provisionIdempotencyKey applies the mode's defaults. It has no
// signature: secrets, url, event_id and the like are refused by Validate.
func (h *Handler) provisionIdempotencyKey() {
	cfg := h.IdempotencyKey
	if cfg == nil {
		cfg = new(IdempotencyKeyConfig)
	}
	k := &idemKey{
		header:       http.CanonicalHeaderKey(cfg.Header),
		clientHeader: http.CanonicalHeaderKey(cfg.ClientHeader),
		client:       cfg.Client,
		optional:     cfg.Optional,
		store4xx:     cfg.Store4xx == nil || *cfg.Store4xx,
		store5xx:     cfg.Store5xx,
	}
	if k.header == "" {
		k.header = "Idempotency-Key"
	}
	switch {
	case k.client == clientShared:
		k.client = ""
		h.logger.Warn("idempotency_key: client shared: every caller shares one key space, so a caller sending another's key "+
			"gets that caller's stored answer; scope keys per caller with client header <name> or client <placeholder> "+
			"(default: header Authorization)", zap.String("scope", h.Scope))
	case k.client == "" && k.clientHeader == "":
		k.clientHeader = defaultClientHeader
	}
	switch {
	case len(cfg.Fingerprint) == 0:
		k.parts = fingerprintParts
	case len(cfg.Fingerprint) == 1 && cfg.Fingerprint[0] == "none":
	default:
		for _, p := range fingerprintParts { // a fixed order, whatever the config's
			if slices.Contains(cfg.Fingerprint, p) {
				k.parts = append(k.parts, p)
			}
		}
	}
	if h.RefuseStatus == 0 {
		h.RefuseStatus = http.StatusBadRequest // unused: nothing is verified
	}
	h.idem = k
	h.trust = h.trustOf(nil)
}

// validateIdempotencyKey checks provider idempotency_key's configuration.
func (h *Handler) validateIdempotencyKey() error {
	cfg := h.IdempotencyKey
	if cfg == nil {
		cfg = new(IdempotencyKeyConfig)
	}
	switch {
	case len(h.Secrets) > 0, h.URL != "", len(h.EventID) > 0, h.HMAC != nil, h.DedupeBody != nil, h.AllowSHA1:
		return errors.New("provider idempotency_key: verifies no signature and reads the key from a header; " +
			"remove secret, url, event_id, hmac, dedupe_body and allow_sha1")
	case h.Mode == "async":
		return errors.New("provider idempotency_key: not available in async mode (the client waits for the answer)")
	case h.Replay != "response":
		return errors.New("provider idempotency_key: replay is always response")
	case cfg.Client != "" && cfg.ClientHeader != "":
		return errors.New("idempotency_key: client and client_header are exclusive")
	case cfg.Client != "" && cfg.Client != clientShared && !strings.Contains(cfg.Client, "{"):
		return fmt.Errorf("idempotency_key: client %q is not a placeholder (want e.g. {http.auth.user.id}, client_header, or shared)", cfg.Client)
	case h.Retention < h.Lease:
		return fmt.Errorf("retention: must be at least the lease (%s), got %s", time.Duration(h.Lease), time.Duration(h.Retention))
	}
	for _, p := range cfg.Fingerprint {
		if !slices.Contains(fingerprintParts, p) && !(p == "none" && len(cfg.Fingerprint) == 1) {
			return fmt.Errorf("idempotency_key: fingerprint: want method, path, query, body or none, got %q", p)
		}
	}
	return nil
}

// stores reports whether an upstream answer with status completes the
// key (stored and replayed) rather than releasing it.
func (k *idemKey) stores(status int) bool {
	switch {
	case status >= 200 && status < 400:
		return true
	case status >= 400 && status < 500:
		switch status {
		case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
			return false
		}
		return k.store4xx
	case status >= 500 && status < 600:
		return k.store5xx && status != http.StatusServiceUnavailable
	}
	return false
}

// key reads the request's Idempotency-Key: "" with no problem when it is
// absent, else the key or the reason it is refused.
func (k *idemKey) key(r *http.Request) (key, problem string) {
	vals := r.Header.Values(k.header)
	switch {
	case len(vals) == 0:
		return "", ""
	case len(vals) > 1:
		return "", k.header + " is sent on several lines"
	}
	key = strings.TrimSpace(vals[0])
	if len(key) >= 2 && key[0] == '"' && key[len(key)-1] == '"' {
		key = key[1 : len(key)-1] // a structured-field string, as the draft writes it
	}
	switch {
	case key == "":
		return "", k.header + " is empty"
	case len(key) > maxKeyLen:
		return "", k.header + " is longer than 255 bytes"
	}
	return key, ""
}

// scoped is the stored event ID of a key: the first 128 bits of the
// SHA-256 of the client's identity, in hex, then ":" and the key; the key
// alone under client shared. ok is false when the request carries no
// identity: it has no key space.
func (k *idemKey) scoped(r *http.Request, key string) (id string, ok bool) {
	var identity string
	switch {
	case k.clientHeader != "":
		identity = strings.Join(r.Header.Values(k.clientHeader), "\n")
	case k.client != "":
		if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
			identity = repl.ReplaceAll(k.client, "")
		}
	default:
		return key, true // client shared
	}
	if strings.TrimSpace(identity) == "" {
		return "", false
	}
	sum := sha256.Sum256([]byte(identity))
	return hex.EncodeToString(sum[:16]) + ":" + key, true
}

// identityName names what identifies a caller, for the 401's detail.
func (k *idemKey) identityName() string {
	if k.clientHeader != "" {
		return "an " + k.clientHeader + " header"
	}
	return "an authenticated identity"
}

// fingerprint is the SHA-256 of the configured parts of the request, each
// length-prefixed, as "sha256:<hex>"; "" when fingerprints are off.
func (k *idemKey) fingerprint(r *http.Request, body []byte) string {
	if len(k.parts) == 0 {
		return ""
	}
	hash := sha256.New()
	for _, p := range k.parts {
		var v string
		switch p {
		case "method":
			v = r.Method
		case "path":
			v = r.URL.EscapedPath()
		case "query":
			v = r.URL.RawQuery
		case "body":
			sum := sha256.Sum256(body)
			v = string(sum[:])
		}
		fmt.Fprintf(hash, "%s:%d:", p, len(v))
		_, _ = io.WriteString(hash, v)
	}
	return "sha256:" + hex.EncodeToString(hash.Sum(nil))
}

// safeMethod: requests of these methods are idempotent by definition and
// pass through without a key.
// QUERY is safe and idempotent by its definition (draft-ietf-httpbis-safe-method-w-body).
func safeMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, "QUERY":
		return true
	}
	return false
}

// unmarshalIdempotencyKey parses the idempotency_key { } block.
func (h *Handler) unmarshalIdempotencyKey(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	cfg := new(IdempotencyKeyConfig)
	h.IdempotencyKey = cfg
	return eachSub(d, "idempotency_key", func(sub string) error {
		switch sub {
		case "header":
			return oneValue(d, &cfg.Header)
		case "client":
			args := d.RemainingArgs()
			switch {
			case len(args) == 2 && args[0] == "header":
				cfg.ClientHeader = args[1]
			case len(args) == 1 && (strings.HasPrefix(args[0], "{") || args[0] == clientShared):
				cfg.Client = args[0]
			default:
				return d.Errf("idempotency_key client: want header <name>, a placeholder such as {http.auth.user.id}, or shared")
			}
		case "fingerprint":
			cfg.Fingerprint = d.RemainingArgs()
			if len(cfg.Fingerprint) == 0 {
				return d.ArgErr()
			}
			for _, p := range cfg.Fingerprint {
				if !slices.Contains(fingerprintParts, p) && (p != "none" || len(cfg.Fingerprint) != 1) {
					return d.Errf("idempotency_key fingerprint: want method, path, query, body or none, got %q", p)
				}
			}
		case "optional":
			if d.NextArg() {
				return d.ArgErr()
			}
			cfg.Optional = true
		case "store_4xx":
			on, err := onOff(d, "idempotency_key store_4xx")
			cfg.Store4xx = on
			return err
		case "store_5xx":
			on, err := onOff(d, "idempotency_key store_5xx")
			cfg.Store5xx = on != nil && *on
			return err
		default:
			return d.Errf("idempotency_key: unknown subdirective %q", sub)
		}
		return nil
	})
}

// refuseReused answers a key reused with another request: 422. Any
// caller can reuse its own key at will, so the warning is throttled.
func (h *Handler) refuseReused(w http.ResponseWriter, d *delivery) {
	h.warnThrottled("idempotency key reused with another request fingerprint; answered 422",
		zap.String("scope", h.Scope), zap.String("event_id", d.eventID))
	h.answer(w, d, ansKeyReused, say{})
}

// sweepEvery is how often the retention sweep runs: retentionInterval, or
// a quarter of a shorter retention (provider idempotency_key allows one of
// minutes), so keys are gone close to when they expire.
func (h *Handler) sweepEvery() time.Duration {
	return min(retentionInterval, max(time.Duration(h.Retention)/4, 100*time.Millisecond))
}
