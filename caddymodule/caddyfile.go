package caddymodule

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("webhook_idempotency", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("webhook_idempotency", httpcaddyfile.Before, "reverse_proxy")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	webhook_idempotency [<matcher>] {
//		provider  stripe | github | shopify | standard | slack | paddle | square | hmac | ... [{
//			header | algorithm | encoding | prefix <value>  # override the preset's scheme
//			<any subdirective below>                        # e.g. tolerance, event_id
//		}]
//		secret    <secret>               # repeatable; every one is tried (rotation)
//		tolerance <duration>             # timestamped schemes; default 5m
//		url       <public url>           # schemes that sign the URL (square, twilio)
//		event_id  header <name> | json <path>... | form <field>  # repeatable parts; default: the provider's own ID
//		scope     <name>                 # namespace of event IDs; default: provider
//		storage   postgres <dsn> | sqlite <path>
//		table     <name>                 # events table; default webhook_events
//		lease     <duration>             # default 30s
//		retention <duration>             # default 30d
//		max_body  <size>                 # default 5MB
//		cache     <entries>              # completed IDs held in memory; 0 = off
//		forward_timeout <duration>       # upper bound of one forward; default 5m
//		read_timeout <duration>          # to receive the whole body; default 10s
//		on_ambiguous reforward | hold    # default reforward
//		on_missing_id reject | forward   # default reject
//		dedupe_body on | off             # default per provider
//		replay_window <duration>         # dedupe_body: how long body hashes are kept; default 400d
//		refuse_status <4xx>              # status of a delivery that fails verification; default per provider (400, discord 401)
//		allow_sha1                       # github: accept X-Hub-Signature when X-Hub-Signature-256 is absent
//		mode      sync | async           # default sync; async: store and answer at once, deliver from a queue (postgres)
//		deliver_to <url>                 # async: where queued events are delivered (required)
//		max_attempts <n>                 # async: default 8
//		max_age   <duration>             # async: default 72h
//		retry_schedule <duration>...     # async: default 5s 1m 5m 30m 2h 8h 24h
//		max_concurrency <n>              # async: deliveries in flight across all instances; default no cap
//		rate      <n>/<duration>         # async: attempts per window across all instances; default no cap
//		order_key json <path> | header <name>  # async: one at a time, in order, per key
//		keep_body <duration>             # async: drop delivered bodies this long after delivery
//		spool     <dir> | on | off       # sync: keep deliveries the store cannot claim on disk, forward them later; default on where the provider does not retry
//		spool_max <size>                 # bytes of deliveries the spool may hold; default 1GB
//		handshake edge | forward         # who answers the provider's endpoint handshakes; default edge
//		verify_token <token>             # repeatable; the verify token of a handshake (meta)
//		learned_secret keep | replace    # a handshake bringing a different secret (asana, notion); default keep
//		batch     set | split            # batching providers (sendgrid, gocardless, okta, hubspot); default per provider
//		replay    short | response       # how duplicates are answered; default per provider
//		replay_max <size>                # largest body stored for replay; default 64KiB
//		replay_headers <name>...         # headers stored for replay; default Content-Type Content-Language Location
//		idempotency_key {                # provider idempotency_key only (client APIs, no secret)
//			header      <name>           # default Idempotency-Key
//			client      header <name> | <placeholder> | shared  # caller identity, hashed; default header Authorization
//			fingerprint method path query body | none  # default all four
//			optional                     # forward requests without a key (default: 400)
//			store_4xx   on | off         # store and replay 4xx answers; default on
//			store_5xx   on | off         # store and replay 5xx answers (not 503), as Stripe does; default off
//		}
//		hmac {                           # provider hmac (same as a provider hmac { } block)
//			header    <name>
//			algorithm sha1 | sha256 | sha512
//			encoding  hex | base64
//			prefix    <text>
//		}
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for d.NextBlock(0) {
		if err := h.unmarshalSubdirective(d, seen); err != nil {
			return err
		}
	}
	return nil // the rules on values are checkConfig's (config.go)
}

func durationArg(d *caddyfile.Dispenser) (caddy.Duration, error) {
	name := d.Val()
	var s string
	if !d.AllArgs(&s) {
		return 0, d.ArgErr()
	}
	dur, err := caddy.ParseDuration(s)
	if err != nil || dur <= 0 {
		return 0, d.Errf("%s: invalid duration %q", name, s)
	}
	return caddy.Duration(dur), nil
}

// unmarshalSubdirective parses one subdirective of the block; seen tracks the
// ones that may not repeat.
func (h *Handler) unmarshalSubdirective(d *caddyfile.Dispenser, seen map[string]bool) error {
	name := d.Val()
	switch name {
	case "secret", "event_id", "verify_token":
	default:
		if seen[name] {
			return d.Errf("%s already specified", name)
		}
	}
	seen[name] = true

	switch name {
	case "provider":
		if !d.AllArgs(&h.Provider) {
			return d.ArgErr()
		}
		// provider <name> { ... }: overrides of the preset's fields.
		bseen := map[string]bool{}
		for nesting := d.Nesting(); d.NextBlock(nesting); {
			switch d.Val() {
			case "header", "algorithm", "encoding", "prefix":
				if bseen[d.Val()] {
					return d.Errf("provider %s already specified", d.Val())
				}
				bseen[d.Val()] = true
				if err := h.unmarshalScheme(d, d.Val()); err != nil {
					return err
				}
			default:
				if err := h.unmarshalSubdirective(d, seen); err != nil {
					return err
				}
			}
		}
	case "secret":
		var s string
		if !d.AllArgs(&s) {
			// d.ArgErr would echo the token after the secret.
			return d.Err("secret: want exactly one value (quote a secret that contains spaces)")
		}
		h.Secrets = append(h.Secrets, s)
	case "tolerance":
		dur, err := durationArg(d)
		if err != nil {
			return err
		}
		h.Tolerance = dur
	case "url":
		if !d.AllArgs(&h.URL) {
			return d.ArgErr()
		}
	case "event_id":
		args := d.RemainingArgs()
		if len(args) < 2 {
			return d.Errf("event_id: want header <name>, json <path>... or form <field>")
		}
		if args[0] != "json" && len(args) != 2 {
			// A composite key mixing kinds is one line per part: a JSON path
			// may itself be named json or header, so one line cannot mix them.
			return d.Errf("event_id %s takes one name; for a key of several parts write one event_id line per part, e.g. event_id %s %s, then event_id json <path>...", args[0], args[0], args[1])
		}
		for _, n := range args[1:] {
			s, err := eventid.ParseSource(args[0], n)
			if err != nil {
				return d.Errf("event_id: %v", err)
			}
			h.EventID = append(h.EventID, s)
		}
	case "scope":
		if !d.AllArgs(&h.Scope) {
			return d.ArgErr()
		}
	case "storage":
		var kind, arg string
		if !d.AllArgs(&kind, &arg) {
			return d.Errf("storage: want postgres <dsn> or sqlite <path>")
		}
		if h.Storage == nil {
			h.Storage = new(Storage)
		}
		h.Storage.Backend = kind
		if kind == "postgres" {
			h.Storage.DSN = arg
		} else {
			h.Storage.Path = arg // checkConfig refuses a backend other than sqlite
		}
	case "table":
		if h.Storage == nil {
			h.Storage = new(Storage)
		}
		if !d.AllArgs(&h.Storage.Table) {
			return d.ArgErr()
		}
	case "lease":
		dur, err := durationArg(d)
		if err != nil {
			return err
		}
		h.Lease = dur
	case "retention":
		dur, err := durationArg(d)
		if err != nil {
			return err
		}
		h.Retention = dur
	case "replay_window":
		dur, err := durationArg(d)
		if err != nil {
			return err
		}
		h.ReplayWindow = dur
	case "forward_timeout":
		dur, err := durationArg(d)
		if err != nil {
			return err
		}
		h.ForwardTimeout = dur
	case "read_timeout":
		dur, err := durationArg(d)
		if err != nil {
			return err
		}
		h.ReadTimeout = dur
	case "max_body":
		var s string
		if !d.AllArgs(&s) {
			return d.ArgErr()
		}
		n, err := humanize.ParseBytes(s)
		if err != nil || n == 0 || n > 1<<40 {
			return d.Errf("max_body: invalid size %q", s)
		}
		h.MaxBody = int64(n)
	case "cache":
		var s string
		if !d.AllArgs(&s) {
			return d.ArgErr()
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return d.Errf("cache: want a number of entries (0 = off), got %q", s)
		}
		h.Cache = &n
	case "on_ambiguous":
		if !d.AllArgs(&h.OnAmbiguous) {
			return d.ArgErr()
		}
	case "on_missing_id":
		if !d.AllArgs(&h.OnMissingID) {
			return d.ArgErr()
		}
	case "dedupe_body":
		var v string
		if !d.AllArgs(&v) {
			return d.ArgErr()
		}
		if v != "on" && v != "off" {
			return d.Errf("dedupe_body: want on or off, got %q", v)
		}
		on := v == "on"
		h.DedupeBody = &on
	case "refuse_status":
		var v string
		if !d.AllArgs(&v) {
			return d.ArgErr()
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return d.Errf("refuse_status: want a 4xx status, got %q", v)
		}
		h.RefuseStatus = n
	case "allow_sha1":
		if d.NextArg() {
			return d.ArgErr()
		}
		h.AllowSHA1 = true
	case "hmac":
		if d.NextArg() {
			return d.ArgErr()
		}
		hseen := map[string]bool{}
		for nesting := d.Nesting(); d.NextBlock(nesting); {
			sub := d.Val()
			if hseen[sub] {
				return d.Errf("hmac %s already specified", sub)
			}
			hseen[sub] = true
			if err := h.unmarshalScheme(d, sub); err != nil {
				return err
			}
		}
	case "mode", "deliver_to", "max_attempts", "max_age", "retry_schedule", "max_concurrency", "rate", "order_key", "keep_body":
		return h.unmarshalAsync(d, name)
	case "handshake", "verify_token", "learned_secret", "batch":
		return h.unmarshalProtocol(d, name)
	case "replay", "replay_max", "replay_headers", "idempotency_key":
		return h.unmarshalReplay(d, name)
	case "spool", "spool_max":
		return h.unmarshalSpool(d, name)
	default:
		return d.Errf("unknown subdirective %q", name)
	}
	return nil
}

// unmarshalScheme parses one field of an hmac { } or provider <name> { }
// block: header, algorithm, encoding or prefix.
func (h *Handler) unmarshalScheme(d *caddyfile.Dispenser, sub string) error {
	if h.HMAC == nil {
		h.HMAC = new(HMACConfig)
	}
	var v string
	if !d.AllArgs(&v) {
		return d.ArgErr()
	}
	switch sub {
	case "header":
		h.HMAC.Header = v
	case "algorithm":
		if v != "sha1" && v != "sha256" && v != "sha512" {
			return d.Errf("hmac algorithm: want sha1, sha256 or sha512, got %q", v)
		}
		h.HMAC.Algorithm = v
	case "encoding":
		if v != "hex" && v != "base64" {
			return d.Errf("hmac encoding: want hex or base64, got %q", v)
		}
		h.HMAC.Encoding = v
	case "prefix":
		h.HMAC.Prefix = v
	default:
		return d.Errf("hmac: unknown subdirective %q", sub)
	}
	return nil
}

// ---- Async mode (store-and-forward): its config and subdirectives. ----

// AsyncConfig is the store-and-forward mode of the handler. Its fields sit
// at the top level of the handler's JSON, spelled like the Caddyfile's
// subdirectives.
type AsyncConfig struct {
	// Mode is "sync" (the default): a verified, claimed delivery is forwarded
	// to the next handler while the provider waits, and the provider gets the
	// upstream's own answer; or "async": the delivery is stored in a durable
	// PostgreSQL queue together with its claim, in one transaction, and the
	// provider gets 200 {"received":true,"queued":true} at once; dispatchers
	// on every instance then deliver it to deliver_to, retrying until it is
	// delivered or dead. Async needs storage postgres.
	Mode string `json:"mode,omitempty"`

	// DeliverTo is the URL async mode delivers to (http or https). With no
	// path (or "/") the delivery's own path and query are appended, as
	// reverse_proxy does; with a path, that URL is used as is. The route's
	// next handler (reverse_proxy) is not used for queued events: the
	// provider's request has ended by the time an event is delivered.
	// Required in async mode. {env.NAME} placeholders are expanded.
	DeliverTo string `json:"deliver_to,omitempty"`

	// MaxAttempts is how many attempts an event gets before it is dead.
	// Default: one more than the entries of retry_schedule (8).
	MaxAttempts int `json:"max_attempts,omitempty"`

	// MaxAge is how long after it was received an event is retried; an
	// attempt that would fall later makes it dead. At most retention.
	// Default: 72h.
	MaxAge caddy.Duration `json:"max_age,omitempty"`

	// RetrySchedule is the delay before each retry: the first entry after
	// the first failed attempt, and so on; the last entry repeats. Each
	// delay gets ±20% random jitter. Default: 5s 1m 5m 30m 2h 8h 24h.
	RetrySchedule []caddy.Duration `json:"retry_schedule,omitempty"`

	// MaxConcurrency caps the deliveries of this scope in flight at once
	// across every gateway instance sharing the database (enforced in the
	// database, not per process). Default 0: no cap (each instance runs up
	// to 16 at once).
	MaxConcurrency int `json:"max_concurrency,omitempty"`

	// Rate caps the delivery attempts of this scope started in any window,
	// across every instance. Default: no cap.
	Rate *RateLimit `json:"rate,omitempty"`

	// OrderKey makes events of the scope that share a key (read from the
	// body with json <path>, or from a header) be delivered one at a time,
	// in the order they were received; an event without the key is
	// delivered unordered. Default: no ordering.
	OrderKey *eventid.Source `json:"order_key,omitempty"`

	// KeepBody drops the body and headers of delivered events this long
	// after delivery, before retention deletes their rows. Default 0: kept
	// until retention.
	KeepBody caddy.Duration `json:"keep_body,omitempty"`

	async *asyncState
}

// RateLimit is a number of delivery attempts per window.
type RateLimit struct {
	// Events is the most attempts started in any window.
	Events int `json:"events,omitempty"`
	// Window is the length of the sliding window.
	Window caddy.Duration `json:"window,omitempty"`
}

// unmarshalAsync parses one subdirective of async mode:
//
//	mode            sync | async
//	deliver_to      <url>
//	max_attempts    <n>
//	max_age         <duration>
//	retry_schedule  <duration>...
//	max_concurrency <n>
//	rate            <n>/<duration>
//	order_key       json <path> | header <name>
//	keep_body       <duration>
func (h *Handler) unmarshalAsync(d *caddyfile.Dispenser, name string) error {
	switch name {
	case "mode":
		if !d.AllArgs(&h.Mode) {
			return d.ArgErr()
		}
	case "deliver_to":
		if !d.AllArgs(&h.DeliverTo) {
			return d.ArgErr()
		}
	case "max_attempts", "max_concurrency":
		var s string
		if !d.AllArgs(&s) {
			return d.ArgErr()
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return d.Errf("%s: want a positive number, got %q", name, s)
		}
		if name == "max_attempts" {
			h.MaxAttempts = n
		} else {
			h.MaxConcurrency = n
		}
	case "max_age", "keep_body":
		dur, err := durationArg(d)
		if err != nil {
			return err
		}
		if name == "max_age" {
			h.MaxAge = dur
		} else {
			h.KeepBody = dur
		}
	case "retry_schedule":
		args := d.RemainingArgs()
		if len(args) == 0 {
			return d.Errf("retry_schedule: want one or more durations")
		}
		for _, a := range args {
			dur, err := caddy.ParseDuration(a)
			if err != nil || dur <= 0 {
				return d.Errf("retry_schedule: invalid duration %q", a)
			}
			h.RetrySchedule = append(h.RetrySchedule, caddy.Duration(dur))
		}
	case "rate":
		var s string
		if !d.AllArgs(&s) {
			return d.ArgErr()
		}
		r, err := parseRate(s)
		if err != nil {
			return d.Errf("rate: %v", err)
		}
		h.Rate = r
	case "order_key":
		var kind, arg string
		if !d.AllArgs(&kind, &arg) {
			return d.Errf("order_key: want json <path> or header <name>")
		}
		s, err := eventid.ParseSource(kind, arg)
		if err != nil {
			return d.Errf("order_key: %v", err)
		}
		h.OrderKey = &s
	default:
		return d.Errf("unknown subdirective %q", name)
	}
	return nil
}

// parseRate parses "<n>/<duration>", e.g. 10/1s, 600/1m or 10/s.
func parseRate(s string) (*RateLimit, error) {
	ns, ws, ok := strings.Cut(s, "/")
	if !ok {
		return nil, fmt.Errorf("want <n>/<duration>, e.g. 10/1s, got %q", s)
	}
	n, err := strconv.Atoi(ns)
	if err != nil || n < 1 {
		return nil, fmt.Errorf("want a positive number of events, got %q", ns)
	}
	if ws != "" && (ws[0] < '0' || ws[0] > '9') {
		ws = "1" + ws // 10/s
	}
	w, err := caddy.ParseDuration(ws)
	if err != nil || w <= 0 {
		return nil, fmt.Errorf("invalid window %q", ws)
	}
	return &RateLimit{Events: n, Window: caddy.Duration(w)}, nil
}

// parseDeliverTo checks deliver_to: an absolute http(s) URL with a host.
func parseDeliverTo(s string) (*url.URL, error) {
	if s == "" {
		return nil, errors.New("required in async mode: the URL queued events are delivered to")
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("want an absolute http or https URL, got %q", s)
	}
	if u.Fragment != "" {
		return nil, errors.New("a URL without a #fragment")
	}
	return u, nil
}
