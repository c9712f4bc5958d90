package signature

import (
	"fmt"
	"strings"
	"time"
)

// MarkdownTable renders the provider presets as the README's provider table:
// name, signature header, signed bytes, algorithm and encoding, default event
// ID, default tolerance, dedupe_body default, the status a delivery that
// fails verification is refused with (refuse_status) and documentation link. The
// README's table is generated from it (see readme_test.go), so the two
// cannot drift.
func MarkdownTable() string {
	var b strings.Builder
	b.WriteString("| provider | signature header | signed bytes | HMAC | default event ID | tolerance | dedupe_body | refuse_status | docs |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
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
		alg := p.Algorithm + " " + p.Encoding
		if p.build != nil && p.Name != "hmac" {
			alg = "see docs"
		}
		if p.Algorithm == "ed25519" {
			alg = "none: Ed25519 " + p.Encoding + " (public key)"
		}
		if p.Name == "gitlab" {
			alg = "none (token)"
		}
		dedupe := "off"
		if p.DedupeBody {
			dedupe = "on"
		}
		fmt.Fprintf(&b, "| `%s` | `%s` | %s | %s | %s | %s | %s | %d | [docs](%s) |\n",
			p.Name, escapePipes(p.SignatureHeader), escapePipes(signedText(p.Signed)), alg, id, tol, dedupe, p.RefuseStatus, p.Doc)
	}
	return b.String()
}

func signedText(s string) string {
	if strings.Contains(s, "{") && !strings.Contains(s, " ") {
		return "`" + s + "`"
	}
	return s
}

func escapePipes(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func shortDuration(d time.Duration) string {
	s := d.String()
	s = strings.TrimSuffix(s, "0s")
	s = strings.TrimSuffix(s, "0m")
	return s
}
