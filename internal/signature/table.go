package signature

//go:generate go run ./gendoc ../../docs/providers.md

import (
	"fmt"
	"strings"
	"time"
)

// MarkdownTable renders the provider presets as the scheme table of docs/providers.md:
// name, signature header, signed bytes, algorithm and encoding, default event
// ID, default tolerance, dedupe_body default, the status a delivery that fails verification is refused
// with (refuse_status), whether the event ID stays the
// same across the provider's retries, handshakes, batch policy, the official
// library whose vectors prove the preset (testdata/oracles.json, versions
// there) and the documentation link. ProvidersDoc embeds it, so the
// document cannot drift from the presets.
func MarkdownTable() string {
	var b strings.Builder
	b.WriteString("| provider | signature header | signed bytes | algorithm | default event ID | tolerance | dedupe_body | refuse_status | replay | ID across retries | handshake | batch | oracle | docs |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, name := range Providers() {
		p := registry[name]
		id := "configure `event_id`"
		if len(p.EventID) > 0 {
			parts := make([]string, len(p.EventID))
			for i, s := range p.EventID {
				parts[i] = "`" + s + "`"
			}
			id = strings.Join(parts, ", else ")
		}
		tol := "none"
		if p.DefaultTolerance > 0 {
			tol = shortDuration(p.DefaultTolerance)
		}
		dedupe := "off"
		if p.DedupeBody {
			dedupe = "on"
		}
		stable := string(p.IDStability)
		if p.IDStability == StabilityNone {
			stable = "—"
		}
		hs := "—"
		if len(p.Challenges) > 0 {
			d := make([]string, len(p.Challenges))
			for i, c := range p.Challenges {
				d[i] = c.Describe()
			}
			hs = strings.Join(d, "; ")
		}
		batch := "—"
		if p.Batch != nil {
			items := p.Batch.Items
			if items == "@this" {
				items = "" // the body is the array
			}
			batch = fmt.Sprintf("%s of `%s[].%s`", p.Batch.Policy, items, p.Batch.ItemID)
			if len(p.EventID) == 0 {
				id = "per item (batch)"
			}
		}
		replay := "short"
		if p.ReplayResponse {
			replay = "response" // the provider reads the answer
		}
		oracle := "documentation only"
		if p.Oracle != "" {
			oracle = "`" + p.Oracle + "`"
		}
		fmt.Fprintf(&b, "| `%s` | `%s` | %s | %s | %s | %s | %s | %d | %s | %s | %s | %s | %s | [docs](%s) |\n",
			p.Name, escapePipes(p.SignatureHeader), escapePipes(signedText(p.Signed)), algorithmText(p), id, tol, dedupe,
			p.RefuseStatus, replay, stable, escapePipes(hs), batch, oracle, p.Doc)
	}
	return b.String()
}

// algorithmText names how a preset authenticates: the HMAC hash and
// encoding, a public-key algorithm, or a plain token.
func algorithmText(p Preset) string {
	switch {
	case p.Algorithm == "":
		return "none (token)"
	case p.Algorithm == "ed25519":
		return "none: Ed25519 " + p.Encoding + " (public key)"
	case p.Algorithm == "ecdsa-p256":
		return "none: ECDSA P-256 " + p.Encoding + " DER (public key)"
	case strings.HasPrefix(p.Algorithm, "rsa-") || p.Algorithm == "ecdsa-p256-sha256":
		return "none: " + strings.ToUpper(strings.ReplaceAll(p.Algorithm, "|", " or ")) + " " + p.Encoding + " (provider's key)"
	}
	return "HMAC-" + strings.ToUpper(p.Algorithm) + " " + p.Encoding
}

func signedText(s string) string {
	if strings.Contains(s, "{") && !strings.Contains(s, " ") {
		return "`" + s + "`"
	}
	return s
}

func escapePipes(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func shortDuration(d time.Duration) string {
	s := d.String() // 5m0s, 10m0s, 1h0m0s, 1m30s
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// ProvidersDoc renders docs/providers.md: every preset's delivery facts,
// each linked to the document it comes from, whether an official library
// proves the preset, and the scheme table (MarkdownTable). cmd gendoc
// writes it; TestProvidersDoc fails when the file is stale.
func ProvidersDoc() string {
	var b strings.Builder
	b.WriteString(providersDocHead)
	fmt.Fprintf(&b, "%d presets, %d of them proven by the provider's official library.\n\n", len(registry), oracleCount())
	b.WriteString("## Delivery facts\n\n")
	b.WriteString(deliveryLegend)
	b.WriteString("| provider | retries a failed delivery | max body | timeout | success answer | refusal | replay stopped by | proof |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, name := range Providers() {
		p := registry[name]
		d := p.Delivery
		proof := "documentation only"
		if p.Oracle != "" {
			proof = "oracle: `" + p.Oracle + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s | %s | %s |\n", p.Name,
			fact(retryText(d.Retry), d.Retry.Source),
			fact(maxBodyText(d.MaxBody), d.MaxBody.Source),
			fact(joinNote(shortDurationOr(d.Timeout.Duration), d.Timeout.Note), d.Timeout.Source),
			fact(answerText(d.Answer), d.Answer.Source),
			fact(refusalText(p), d.Refusal.Source),
			fact(escapePipes(p.ReplayGuard()), Source(p.Doc)),
			proof)
	}
	b.WriteString("\n## Secrets\n\nEach `secret` is the provider's signing secret as it displays it, except:\n\n")
	for _, name := range Providers() {
		if f := registry[name].SecretFormat; f != "" {
			fmt.Fprintf(&b, "- `%s`: %s\n", name, f)
		}
	}
	b.WriteString("\n## Signature schemes\n\n")
	b.WriteString(MarkdownTable())
	return b.String()
}

const providersDocHead = `# Providers

<!-- Generated from internal/signature by ` + "`go generate ./internal/signature`" + `; do not edit. -->

Every ` + "`provider`" + ` preset, what its provider documents about how it delivers, and how it signs.

`

const deliveryLegend = `Each fact links the provider's document it comes from; *undocumented* means the provider's webhook
documentation does not state it, and "not yet checked" that it has not been looked up yet. "Retries" is what happens to a delivery that fails (no answer in time, a connection
error, or a status the provider does not count as success): a provider that does not retry never
sends a refused or failed event again, so an upstream that fails one (a ` + "`5xx`" + `, a dropped
connection) loses it unless someone redelivers it by hand; in front of such a provider, [async
mode](async.md) answers once the event is stored and retries the upstream itself. "Refusal" is the status the gateway answers a delivery that
fails verification with (` + "`refuse_status`" + `) and what the provider documents about it. "Replay stopped
by" is what keeps a captured delivery from being accepted again under the preset's defaults: a
signed timestamp within the tolerance (with Mailgun, whose signature does not cover the event
data, its token spent once), or, for every preset without a signed timestamp, a replay record
the gateway keeps for ` + "`replay_window`" + ` (400 days by default), longer than the event's row
(` + "`retention`" + `): a replay is answered as a duplicate, never forwarded. "Max body" is the largest body the provider
documents; where it is larger than 5 MB it is the route's default ` + "`max_body`" + ` (5 MB elsewhere: a smaller
figure bounds only part of the body, or is not a promise, so it never lowers the default). "Proof": the official library whose vectors the
preset passes, or *documentation only* where no official library on npm verifies the scheme.

`

// fact renders one fact's text with its source.
func fact(text string, s Source) string {
	switch s {
	case "":
		return "not yet checked"
	case Undocumented:
		return "*undocumented*"
	}
	return text + " ([doc](" + string(s) + "))"
}

func joinNote(text, note string) string {
	switch {
	case note == "":
		return text
	case text == "":
		return escapePipes(note)
	}
	return text + "; " + escapePipes(note)
}

func retryText(r Retry) string {
	if !r.Retries {
		return joinNote("no", r.Note)
	}
	t := "yes"
	if r.For > 0 {
		t += ", for " + shortDurationOr(r.For)
	}
	if r.Attempts > 0 {
		t += fmt.Sprintf(", %d attempts in all", r.Attempts)
	}
	return joinNote(t, r.Note)
}

func maxBodyText(m MaxBody) string {
	t := byteText(m.Bytes)
	if m.Body != 0 {
		t += " (bodies up to " + byteText(m.Body) + ")"
	}
	return joinNote(t, m.Note)
}

// byteText writes a size in the unit that divides it: MiB, MB, KiB, kB.
func byteText(n int64) string {
	var t string
	switch {
	case n == 0:
	case n%(1<<20) == 0:
		t = fmt.Sprintf("%d MiB", n>>20)
	case n%1_000_000 == 0:
		t = fmt.Sprintf("%d MB", n/1_000_000)
	case n%(1<<10) == 0:
		t = fmt.Sprintf("%d KiB", n>>10)
	case n%1000 == 0:
		t = fmt.Sprintf("%d kB", n/1000)
	default:
		t = fmt.Sprintf("%d bytes", n)
	}
	return t
}

func answerText(a Answer) string {
	t := "any 2xx"
	if a.Status != 0 {
		t = fmt.Sprintf("`%d`", a.Status)
	}
	if a.Body != "" {
		t += " with body `" + a.Body + "`"
	}
	return joinNote(t, a.Note)
}

func refusalText(p Preset) string {
	t := fmt.Sprintf("`%d`", p.RefuseStatus)
	if p.Delivery.Refusal.Status != 0 {
		t += " required"
	}
	return joinNote(t, p.Delivery.Refusal.Note)
}

// shortDurationOr renders d for people: whole days as days, else as
// shortDuration; "" for 0.
func shortDurationOr(d time.Duration) string {
	switch {
	case d == 0:
		return ""
	case d%(24*time.Hour) == 0 && d >= 48*time.Hour:
		return fmt.Sprintf("%d days", d/(24*time.Hour))
	}
	return shortDuration(d)
}

func oracleCount() int {
	n := 0
	for _, p := range registry {
		if p.Oracle != "" {
			n++
		}
	}
	return n
}
