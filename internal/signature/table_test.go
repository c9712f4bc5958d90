package signature

import (
	"fmt"
	"strings"
	"time"
)

// MarkdownTable renders the provider presets as the README's provider table:
// name, signature header, signed bytes, algorithm and encoding, default event
// ID, default tolerance, dedupe_body default, the status a delivery that fails verification is refused
// with (refuse_status), whether the event ID stays the
// same across the provider's retries, handshakes, batch policy, the official
// library whose vectors prove the preset (testdata/oracles.json, versions
// there) and the documentation link. The README's table is generated from it
// (see readme_test.go), so the two cannot drift.
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
