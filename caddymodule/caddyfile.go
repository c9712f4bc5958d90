package caddymodule

import (
	"maps"
	"slices"
	"strconv"

	"github.com/agnivade/levenshtein"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("webhook_idempotency", parseCaddyfile)
	// Before invoke, which comes just before handle: at a site's top level
	// the gate runs before the site's handle and route blocks, and in any
	// block before an invoke of a named route, which would otherwise answer
	// without it (and so before reverse_proxy too).
	httpcaddyfile.RegisterDirectiveOrder("webhook_idempotency", httpcaddyfile.Before, "invoke")
}

// unsetAdaptVar explains a subdirective left without its value: what an
// unset {$NAME} leaves once the Caddyfile is adapted.
const unsetAdaptVar = "a {$NAME} placeholder whose variable is unset when the Caddyfile is adapted leaves nothing: " +
	"set it, or write {env.NAME}, read when Caddy loads the config"

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
//		tolerance <duration>             # timestamped schemes; default per provider (5m for most)
//		url       <public url>           # schemes that sign the URL (square, twilio)
//		event_id  header <name> | json <path>... | form <field> | form_sha256 <field> | jws <member>#<path>  # repeatable parts; default: the provider's own ID
//		scope     <name>                 # namespace of event IDs; default: provider
//		storage   postgres <dsn> | sqlite <path>
//		table     <name>                 # events table; default webhook_events
//		lease     <duration>             # default 30s
//		retention <duration>             # default 30d
//		max_body  <size>                 # default: the provider's documented maximum over 5MB (github 25MiB), else 5MB
//		body_budget <size>               # body bytes the scope holds at once (memory and temporary files); at least 2 × max_body + 64KiB; default 1GiB
//		cache     <entries>              # completed IDs held in memory; default 100000; 0 = off
//		forward_timeout <duration>       # upper bound of one forward; default 5m
//		read_timeout <duration>          # to receive the whole body; default 10s
//		on_ambiguous reforward | hold    # default reforward
//		complete_by gateway | upstream   # default gateway; upstream: the upstream commits the claim (postgres)
//		on_missing_id reject | forward   # default reject
//		dedupe_body on | off             # default per provider
//		replay_window <duration>         # dedupe_body: how long body hashes are kept; default 400d
//		refuse_status <4xx>              # status of a delivery that fails verification; default per provider (400, discord 401)
//		allow_sha1                       # github: accept X-Hub-Signature when X-Hub-Signature-256 is absent
//		mode      sync | async           # default sync; async: store and answer at once, deliver from a queue (postgres)
//		deliver_to <url>                 # async: where queued events are delivered (required)
//		max_attempts <n>                 # async: default retry_schedule entries + 1 (8)
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
//		enroll_window <duration> | off   # asana, notion: how long after the first load a handshake may teach the secret; default 10m
//		batch     set | split            # batching providers (adyen, fastspring, gocardless, hubspot, okta, sendgrid); default per provider
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

// values are the subdirectives that take one string or duration, by name:
// the core's and async mode's (asyncValues).
func (h *Handler) values() map[string]any {
	m := map[string]any{
		"url": &h.URL, "scope": &h.Scope, "on_ambiguous": &h.OnAmbiguous, "on_missing_id": &h.OnMissingID,
		"complete_by": &h.CompleteBy,
		"tolerance":   &h.Tolerance, "lease": &h.Lease, "retention": &h.Retention, "replay_window": &h.ReplayWindow,
		"forward_timeout": &h.ForwardTimeout, "read_timeout": &h.ReadTimeout,
	}
	maps.Copy(m, h.asyncValues())
	return m
}

// oneValue parses a subdirective's one argument into dst, a *string or a
// *caddy.Duration (positive).
func oneValue(d *caddyfile.Dispenser, dst any) error {
	switch p := dst.(type) {
	case *caddy.Duration:
		dur, err := durationArg(d)
		*p = dur
		return err
	case *string:
		if !d.AllArgs(p) {
			return d.ArgErr()
		}
	}
	return nil
}

// eachSub parses the block of subdirective name, line by line, refusing a
// repeated line ("<name> <sub> already specified").
func eachSub(d *caddyfile.Dispenser, name string, parse func(sub string) error) error {
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		if seen[sub] {
			return d.Errf("%s %s already specified", name, sub)
		}
		seen[sub] = true
		if err := parse(sub); err != nil {
			return err
		}
	}
	return nil
}

// onOff parses a subdirective's on or off; name names it in the error.
func onOff(d *caddyfile.Dispenser, name string) (*bool, error) {
	var v string
	if !d.AllArgs(&v) {
		return nil, d.ArgErr()
	}
	if v != "on" && v != "off" {
		return nil, d.Errf("%s: want on or off, got %q", name, v)
	}
	on := v == "on"
	return &on, nil
}

func durationArg(d *caddyfile.Dispenser) (caddy.Duration, error) {
	name := d.Val()
	var s string
	if !d.AllArgs(&s) {
		return 0, d.ArgErr()
	}
	dur, err := caddy.ParseDuration(s)
	if err != nil || dur <= 0 {
		return 0, d.Errf("%s: invalid duration %q (write it as Caddy does: 30d, 72h, 90m, 1h30m)", name, s)
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
	if dst, ok := h.values()[name]; ok {
		return oneValue(d, dst)
	}

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
		if d.CountRemainingArgs() == 0 {
			return d.Err("secret: no value; " + unsetAdaptVar)
		}
		if !d.AllArgs(&s) {
			// d.ArgErr would echo the token after the secret.
			return d.Err("secret: want exactly one value (quote a secret that contains spaces)")
		}
		h.Secrets = append(h.Secrets, s)
	case "event_id":
		args := d.RemainingArgs()
		if len(args) < 2 {
			return d.Errf("event_id: want header <name>, json <path>..., form <field>, form_sha256 <field> or jws <member>#<path>")
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
	case "storage":
		var kind, arg string
		if !d.AllArgs(&kind, &arg) {
			if k := kindOf(kind); k != nil && arg == "" {
				return d.Errf("storage %s: no %s; %s", kind, k.whereName, unsetAdaptVar)
			}
			return d.Errf("storage: want postgres <dsn> or sqlite <path>")
		}
		h.setStorage(kind, arg)
	case "table":
		if h.Storage == nil {
			h.Storage = new(Storage)
		}
		if !d.AllArgs(&h.Storage.Table) {
			return d.ArgErr()
		}
	case "max_body", "body_budget":
		var s string
		if !d.AllArgs(&s) {
			return d.ArgErr()
		}
		n, err := humanize.ParseBytes(s)
		if err != nil || n == 0 || n > 1<<40 {
			return d.Errf("%s: invalid size %q (e.g. 25MiB, 512MiB, 1GiB)", name, s)
		}
		if name == "max_body" {
			h.MaxBody = int64(n)
		} else {
			h.BodyBudget = int64(n)
		}
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
	case "dedupe_body":
		on, err := onOff(d, "dedupe_body")
		h.DedupeBody = on
		return err
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
		return eachSub(d, "hmac", func(sub string) error { return h.unmarshalScheme(d, sub) })
	case "max_attempts", "retry_schedule", "max_concurrency", "rate", "order_key":
		return h.unmarshalAsync(d, name)
	case "handshake", "verify_token", "learned_secret", "enroll_window", "batch":
		return h.unmarshalProtocol(d, name)
	case "replay", "replay_max", "replay_headers", "idempotency_key":
		return h.unmarshalReplay(d, name)
	case "spool", "spool_max":
		return h.unmarshalSpool(d, name)
	default:
		return h.unknownSubdirective(d, name)
	}
	return nil
}

// subdirectives are the block's subdirectives besides values(): with them,
// the names an unknown one is compared with (TestSubdirectivesKnown keeps
// the list in step with the parser and the syntax).
var subdirectives = []string{"provider", "secret", "event_id", "storage", "table", "max_body", "body_budget",
	"cache", "dedupe_body", "refuse_status", "allow_sha1", "hmac", "max_attempts", "retry_schedule",
	"max_concurrency", "rate", "order_key", "handshake", "verify_token", "learned_secret", "enroll_window",
	"batch", "replay", "replay_max", "replay_headers", "idempotency_key", "spool", "spool_max"}

// closest is the candidate name is closest to, two edits at most (a typo),
// or "".
func closest(name string, candidates []string) string {
	best, bestDist := "", 3
	for _, k := range candidates {
		if dist := levenshtein.ComputeDistance(name, k); dist < bestDist {
			best, bestDist = k, dist
		}
	}
	return best
}

// unknownSubdirective refuses name, suggesting the subdirective it is
// closest to (two edits at most: secrets, retension).
func (h *Handler) unknownSubdirective(d *caddyfile.Dispenser, name string) error {
	if best := closest(name, slices.Concat(slices.Sorted(maps.Keys(h.values())), subdirectives)); best != "" {
		return d.Errf("unknown subdirective %q: did you mean %s?", name, best)
	}
	return d.Errf("unknown subdirective %q (every subdirective is in the config reference, docs/config.md)", name)
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
