// Package cli is the caddy webhook-idempotency command: sign (a signed
// test delivery), event (the admin API's events), queue (the async queue's
// admin API) and log-filter (the logging configuration that keeps secret
// headers out of Caddy's logs). caddymodule registers it with Caddy's
// command line; it talks to a running Caddy only over HTTP.
package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// secretEnv is read when sign has no --secret, so the secret need not be on
// the command line (shell history, ps).
const secretEnv = "WEBHOOK_IDEMPOTENCY_SECRET" //nolint:gosec // the name of the variable, not a secret

// Admin API paths, shared by the modules that serve them (caddymodule) and
// the commands that call them.
const (
	// AdminPrefix is the events admin API's.
	AdminPrefix = "/webhook_idempotency/"
	// QueueAdminPrefix is the async queue admin API's.
	QueueAdminPrefix = "/webhook_idempotency/queue/"
)

// Configure builds the webhook-idempotency command and its subcommands on
// cmd (caddy's RegisterCommand CobraFunc).
func Configure(cmd *cobra.Command) {
	cmd.Args = cobra.NoArgs
	cmd.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	cmd.AddCommand(signCommand(), eventCommand(), queueCommand(), secretsCommand(), logFilterCommand())
}

func signCommand() *cobra.Command {
	var (
		p                    SignParams
		to, bodyFile, secret string
		headers              []string
		timeout              time.Duration
	)
	c := &cobra.Command{
		Use:   "sign --provider <name> --secret <secret> --to <gateway URL> [flags]",
		Short: "Signs a test delivery as the provider would and POSTs it to the gateway",
		Long: `
Signs a test delivery with the provider's scheme and secret, exactly as the
provider would send it, POSTs it to --to, and prints the answer's status,
Idempotent-Replayed and Retry-After headers and body. The exit status is 0
for a 2xx answer, 1 otherwise.

Without --body the provider's example payload is sent, under a fresh event
ID each time; --event-id repeats one (the second run is then a duplicate).
The event ID is put where the provider's default event_id reads it (a
header, or a JSON path of the body); --event-id-from says where for
providers without one (hmac, zoom, hubspot, ...) or a route with its own
event_id. Schemes that sign the URL (square, twilio, hubspot) sign --url,
the public URL configured at the provider and in the route's url; it
defaults to --to.

The secret comes from --secret or the environment variable ` + secretEnv + `.
It is never printed. For discord (Ed25519) it is not the route's secret: it
is the application's private seed (64 hex digits), and the route is
configured with the matching public key. For telnyx it is seed:<base64
32-byte seed>; for sendgrid a base64 DER PKCS#8 ECDSA private key.
`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p.Secret = secret
			if p.Secret == "" {
				p.Secret = os.Getenv(secretEnv)
			}
			if to == "" {
				return errors.New("--to is required: the gateway URL the delivery is POSTed to")
			}
			if p.URL == "" {
				p.URL = to
			}
			switch bodyFile {
			case "":
			case "-":
				b, err := io.ReadAll(cmd.InOrStdin())
				if err != nil {
					return fmt.Errorf("reading body from stdin: %w", err)
				}
				p.Body = b
			default:
				b, err := os.ReadFile(bodyFile) //nolint:gosec // the operator names the file to send on the command line
				if err != nil {
					return fmt.Errorf("reading body: %w", err)
				}
				p.Body = b
			}
			p.Headers = http.Header{}
			for _, h := range headers {
				name, value, ok := strings.Cut(h, ":")
				if !ok || strings.TrimSpace(name) == "" {
					return fmt.Errorf("--header %q: want \"Name: value\"", h)
				}
				p.Headers.Add(strings.TrimSpace(name), strings.TrimSpace(value))
			}
			p.Now = time.Now()
			ok, err := SendSigned(cmd.Context(), cmd.OutOrStdout(), p, to, timeout)
			if err != nil {
				return err
			}
			if !ok {
				cmd.SilenceUsage = true
				return errors.New("the gateway did not answer 2xx")
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&p.Provider, "provider", "", "provider preset: "+strings.Join(signature.Providers(), ", "))
	f.StringVar(&secret, "secret", "", "signing secret (default: $"+secretEnv+"); discord: the private seed in hex")
	f.StringVar(&to, "to", "", "gateway URL to POST the delivery to")
	f.StringVar(&p.URL, "url", "", "public URL the provider signs (square, twilio, hubspot); default --to")
	f.StringVar(&bodyFile, "body", "", "file with the raw body, or - for stdin (default: the provider's example payload)")
	f.StringVar(&p.ContentType, "content-type", "", "Content-Type (default: the payload's, application/json or form)")
	f.StringVar(&p.EventID, "event-id", "", "event ID to deliver (default: a fresh one, or the body's own with --body)")
	f.StringVar(&p.EventIDFrom, "event-id-from", "", `where the event ID goes: "header <Name>", "json <path>" or "form <field>" (default: the provider's)`)
	f.StringVar(&p.HMAC.Header, "hmac-header", "", "provider hmac: signature header")
	f.StringVar(&p.HMAC.Algorithm, "hmac-algorithm", "", "provider hmac: sha1, sha256 or sha512")
	f.StringVar(&p.HMAC.Encoding, "hmac-encoding", "", "provider hmac: hex or base64")
	f.StringVar(&p.HMAC.Prefix, "hmac-prefix", "", "provider hmac: text before the signature, e.g. sha256=")
	f.StringArrayVar(&headers, "header", nil, `extra request header "Name: value" (repeatable)`)
	f.DurationVar(&timeout, "timeout", 30*time.Second, "how long to wait for the gateway's answer")
	return c
}

func eventCommand() *cobra.Command {
	var admin, scope, id string
	c := &cobra.Command{
		Use:   "event get|forget|release|complete|list [flags]",
		Short: "Inspects, forgets, releases or completes events through the admin API",
		Long: `
Calls the admin API of a running Caddy (module admin.api.webhook_idempotency):

  get       --scope S --id I   the event's state, attempts, first seen, status; for a held event, why (hold_reason)
  forget    --scope S --id I   deletes it: the provider's next delivery is forwarded again
  release   --scope S --id I   a held event, or a claim whose gateway died: the next delivery is forwarded
  complete  --scope S --id I   the same, but later deliveries are answered as duplicates
  list      [--state held] [--older-than 5m] [--scope S] [--limit N]

The scope of a route is its scope setting, by default the provider name.
`,
	}
	c.PersistentFlags().StringVar(&admin, "admin", caddy.DefaultAdminListen, adminFlagHelp)
	one := func(name, method, action, short string) *cobra.Command {
		sc := &cobra.Command{
			Use:   name + " --scope <scope> --id <event id>",
			Short: short,
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if scope == "" || id == "" {
					return errors.New("--scope and --id are required")
				}
				// Query parameters, not path segments: an ID such as ".."
				// or "a//b" would be cleaned into another resource.
				q := url.Values{"scope": {scope}, "id": {id}}
				if method == http.MethodDelete {
					q.Set("confirm", id) // the admin API's guard (caddymodule/adminguard.go)
				}
				uri := AdminPrefix + "event" + action + "?" + q.Encode()
				cmd.SilenceUsage = true
				return adminCall(cmd.OutOrStdout(), admin, method, uri)
			},
		}
		sc.Flags().StringVar(&scope, "scope", "", "the route's scope (default of a route: its provider name)")
		sc.Flags().StringVar(&id, "id", "", "the event ID")
		return sc
	}
	var (
		state, olderThan string
		limit            int
	)
	list := &cobra.Command{
		Use:   "list [--state S] [--older-than D] [--scope S] [--limit N]",
		Short: "Lists events, oldest update first (one page; its next_url is the next)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := url.Values{}
			for k, v := range map[string]string{"state": state, "older_than": olderThan, "scope": scope} {
				if v != "" {
					q.Set(k, v)
				}
			}
			if limit > 0 {
				q.Set("limit", fmt.Sprint(limit))
			}
			cmd.SilenceUsage = true
			return adminCall(cmd.OutOrStdout(), admin, http.MethodGet, AdminPrefix+"events?"+q.Encode())
		},
	}
	list.Flags().StringVar(&state, "state", "", "processing, completed, released or held")
	list.Flags().StringVar(&olderThan, "older-than", "", "only events not updated for this long, e.g. 5m")
	list.Flags().StringVar(&scope, "scope", "", "only this scope")
	list.Flags().IntVar(&limit, "limit", 0, "page size, 1..1000 (default 100)")

	c.AddCommand(
		one("get", http.MethodGet, "", "Shows one event"),
		one("forget", http.MethodDelete, "", "Deletes an event: the provider's next delivery is forwarded again"),
		one("release", http.MethodPost, "/release", "Releases a held or stuck event: the next delivery is forwarded"),
		one("complete", http.MethodPost, "/complete", "Completes a held or stuck event: later deliveries are duplicates"),
		list,
	)
	return c
}

// adminCall calls the admin API and prints its JSON answer, indented.
func adminCall(out io.Writer, admin, method, uri string) error {
	resp, err := caddycmd.AdminAPIRequest(admin, method, uri, nil, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("reading the admin API's answer: %w", err)
	}
	var buf bytes.Buffer
	if json.Indent(&buf, b, "", "  ") != nil {
		buf.Reset()
		buf.Write(b)
	}
	buf.WriteByte('\n')
	_, err = out.Write(buf.Bytes())
	return err
}

// SignParams describe a test delivery.
type SignParams struct {
	Provider string
	// Secret signs the delivery. Never printed.
	Secret string
	// URL is the public URL url-signed schemes sign.
	URL string
	// Body is the raw body; nil means the provider's example payload.
	Body []byte
	// ContentType defaults to the payload's.
	ContentType string
	// EventID is the event ID to deliver: "" means a fresh one with the
	// example payload, or the body's own with Body.
	EventID string
	// EventIDFrom is where the ID goes, "header <Name>", "json <path>" or
	// "form <field>"; "" means the provider's default source.
	EventIDFrom string
	// HMAC is the scheme of provider hmac.
	HMAC signature.HMACOptions
	// Headers are added to the request before signing.
	Headers http.Header
	// Now is the signing time.
	Now time.Time
}

// Delivery is a delivery built by BuildDelivery.
type Delivery struct {
	Body    []byte
	Header  http.Header
	EventID string // "" when no event ID was set (no source known)
}

//go:embed payloads/*.json payloads/*.txt
var payloads embed.FS

// examplePayload is the example body of a provider and its Content-Type.
func examplePayload(provider string) ([]byte, string) {
	name := map[string]string{
		"stripe":     "stripe_payment_intent_succeeded.json",
		"github":     "github_push.json",
		"gitea":      "github_push.json",
		"forgejo":    "github_push.json",
		"shopify":    "shopify_orders_create.json",
		"paddle":     "paddle_transaction_completed.json",
		"square":     "square_payment_created.json",
		"slack":      "slack_event_callback.json",
		"twilio":     "twilio_sms_incoming.txt",
		"razorpay":   "razorpay_payment_captured.json",
		"standard":   "standardwebhooks_invoice_paid.json",
		"svix":       "svix_user_created.json",
		"adyen":      "adyen_authorisation.json",
		"midtrans":   "midtrans_settlement.json",
		"fastspring": "fastspring_order_completed.json",
	}[provider]
	if name == "" {
		name = "generic_order_paid.json"
	}
	b, err := payloads.ReadFile("payloads/" + name)
	if err != nil {
		panic("embedded payload missing: " + name) // caught by every test run
	}
	if strings.HasSuffix(name, ".txt") {
		return b, "application/x-www-form-urlencoded"
	}
	return b, "application/json"
}

// BuildDelivery builds the body and headers of a test delivery and signs
// them with signature.SignDelivery, as the provider would (writing into the
// body where the provider does: Mailgun, Graph, Linear).
func BuildDelivery(p SignParams) (Delivery, error) {
	preset, ok := signature.Lookup(p.Provider)
	if !ok {
		return Delivery{}, fmt.Errorf("--provider: unknown provider %q (known: %s)", p.Provider, strings.Join(signature.Providers(), ", "))
	}
	if p.Secret == "" {
		return Delivery{}, fmt.Errorf("--secret (or $%s) is required", secretEnv)
	}
	body, contentType := p.Body, p.ContentType
	example := body == nil
	if example {
		var ct string
		body, ct = examplePayload(p.Provider)
		if contentType == "" {
			contentType = ct
		}
	}
	if contentType == "" {
		contentType = "application/json"
	}
	h := http.Header{}
	for k, vs := range p.Headers {
		h[k] = append([]string(nil), vs...)
	}
	h.Set("Content-Type", contentType)

	from := p.EventIDFrom
	if from == "" && len(preset.EventID) > 0 {
		from = preset.EventID[0]
	}
	d := Delivery{}
	hashField := ""
	if from == "" {
		if p.EventID != "" {
			return Delivery{}, fmt.Errorf("--event-id: provider %s has no event ID of its own; say where it goes with --event-id-from", p.Provider)
		}
	} else {
		kind, name, _ := strings.Cut(from, " ")
		id := p.EventID
		if id == "" && kind == "header" {
			id = h.Get(name) // from --header
		}
		if id == "" && (example || kind == "header") {
			id = "evt_test_" + randomID()
		}
		var err error
		switch {
		case name == "":
			return Delivery{}, fmt.Errorf("--event-id-from %q: want \"header <Name>\", \"json <path>\" or \"form <field>\"", from)
		case kind == "header":
			h.Set(name, id)
			if example {
				// The example's body would be the same on every run, and
				// a route's dedupe_body (github, shopify, ...) answers a
				// known body under a new ID as a replay: the body carries
				// the ID too, so a fresh ID is a new event and a repeated
				// --event-id the same one.
				body = varyExample(body, contentType, id)
			}
		case kind == "json" && id != "":
			if body, err = setJSON(body, name, id); err != nil {
				return Delivery{}, fmt.Errorf("setting the event ID at json %s: %w", name, err)
			}
		case kind == "json":
			id = gjson.GetBytes(body, name).String()
		case kind == "jws":
			// The signer makes the body's members the JWS payload's
			// (appstore): the ID goes into the body at its payload path.
			_, inner, _ := strings.Cut(name, "#")
			if id == "" {
				id = "evt_test_" + randomID()
			}
			if body, err = setJSON(body, inner, id); err != nil {
				return Delivery{}, fmt.Errorf("setting the event ID at %s: %w", inner, err)
			}
		case kind == "form_sha256":
			// The ID is the hash of a field the signing writes (Braintree's
			// bt_payload): read after signing; an example gets a fresh body.
			if p.EventID != "" {
				return Delivery{}, fmt.Errorf("--event-id: provider %s's event ID is the SHA-256 of form field %s; it cannot be set", p.Provider, name)
			}
			if example {
				if body, err = setJSON(body, "id", "evt_test_"+randomID()); err != nil {
					return Delivery{}, err
				}
			}
			hashField = name
		case kind == "form":
			vals, err := url.ParseQuery(string(body))
			if err != nil {
				return Delivery{}, fmt.Errorf("body is not form-encoded: %w", err)
			}
			if id == "" {
				id = vals.Get(name)
			} else {
				vals.Set(name, id)
				body = []byte(vals.Encode())
			}
		default:
			return Delivery{}, fmt.Errorf("--event-id-from %q: want \"header <Name>\", \"json <path>\" or \"form <field>\"", from)
		}
		d.EventID = id
	}

	if p.Provider == "discord" || p.Provider == "telnyx" {
		// Their verifiers read a secret as a public key and say so; sign
		// needs the private seed, and its error must name that.
		if _, err := signature.PublicSecret(p.Provider, p.Secret); err != nil {
			return Delivery{}, fmt.Errorf("--secret: %w", err)
		}
	}
	opts := signature.Options{Secrets: []string{p.Secret}, HMAC: p.HMAC}
	if preset.NeedsURL {
		opts.URL = p.URL
	}
	now := p.Now
	if now.IsZero() {
		now = time.Now()
	}
	body, err := signature.SignDelivery(p.Provider, opts, body, h, now)
	if err != nil {
		return Delivery{}, fmt.Errorf("signing: %w", err)
	}
	if hashField != "" {
		vals, err := url.ParseQuery(string(body))
		if err != nil {
			return Delivery{}, fmt.Errorf("signed body is not form-encoded: %w", err)
		}
		sum := sha256.Sum256([]byte(vals.Get(hashField)))
		d.EventID = hex.EncodeToString(sum[:])
	}
	d.Body, d.Header = body, h
	return d, nil
}

// varyExample writes id into an example body as its test_delivery member
// (JSON) or field (form); another body is left as it is.
func varyExample(body []byte, contentType, id string) []byte {
	if b, err := setJSON(body, "test_delivery", id); err == nil {
		return b
	}
	if strings.HasPrefix(contentType, "application/x-www-form-urlencoded") {
		if vals, err := url.ParseQuery(string(body)); err == nil {
			vals.Set("test_delivery", id)
			return []byte(vals.Encode())
		}
	}
	return body
}

// setJSON sets the string at a gjson-style dotted path of a JSON body,
// keeping the rest of the body as it is.
func setJSON(body []byte, path, value string) ([]byte, error) {
	if !gjson.ValidBytes(body) {
		return nil, errors.New("body is not JSON")
	}
	if strings.ContainsAny(path, "*?#@|") {
		return nil, fmt.Errorf("path %q: only plain dotted paths can be set", path)
	}
	return sjson.SetBytes(body, path, value)
}

func randomID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// SendSigned builds, signs and POSTs a test delivery to to, and prints the
// answer. ok reports a 2xx answer.
func SendSigned(ctx context.Context, out io.Writer, p SignParams, to string, timeout time.Duration) (ok bool, err error) {
	d, err := BuildDelivery(p)
	if err != nil {
		return false, err
	}
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, to, bytes.NewReader(d.Body))
	if err != nil {
		return false, fmt.Errorf("--to: %w", err)
	}
	for k, vs := range d.Header {
		req.Header[k] = vs
	}
	if host := req.Header.Get("Host"); host != "" {
		// net/http sends req.Host and ignores a Host header: --header
		// "Host: hooks.example.com" reaches a host-matched site locally.
		req.Host = host
		req.Header.Del("Host")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, fmt.Errorf("posting the delivery: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		// The status line arrived (the upstream may have done the work):
		// say which, so a cut answer is not mistaken for no answer.
		return false, fmt.Errorf("reading the answer (status %d received, body cut after %d bytes): %w", resp.StatusCode, len(body), err)
	}
	id := d.EventID
	if id == "" {
		id = "(none set)"
	}
	fmt.Fprintf(out, "POST %s  provider=%s  event_id=%s\n", to, p.Provider, id)
	fmt.Fprintf(out, "status: %d\n", resp.StatusCode)
	replayed := resp.Header.Get("Idempotent-Replayed")
	if replayed == "" {
		replayed = "false"
	}
	fmt.Fprintf(out, "Idempotent-Replayed: %s\n", replayed)
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		fmt.Fprintf(out, "Retry-After: %s\n", ra)
	}
	fmt.Fprintf(out, "%s\n", bytes.TrimRight(body, "\n"))
	return resp.StatusCode >= 200 && resp.StatusCode < 300, nil
}
