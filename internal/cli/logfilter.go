package cli

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// Caddy's own log lines print a request's headers: reverse_proxy's
// "upstream roundtrip" (DEBUG, with the global debug option) and "aborting
// with incomplete response" (WARN, when the upstream cuts its answer), the
// error log http.log.error, and every access log. Caddy redacts only
// Authorization and Cookie; a provider's signature header, and GitLab's
// X-Gitlab-Token (the secret itself), are printed as sent. The handler
// cannot change what reverse_proxy logs, nor strip the headers (the upstream
// may verify them too), so the gateway ships the logging configuration that
// removes them: Caddy's filter encoder on the default log and on access logs.

// SecretHeaders returns the canonical names (as Caddy's logs print them) of
// the request headers that carry a signature or a secret token for each
// provider: every signature header of its scheme and its other
// credential headers (Preset.CredentialHeaders), its alias families
// (svix-* for standard), the legacy SHA-1 header of github, and the extra
// names given (a provider hmac's configured header, a renamed header),
// and Webhook-Claim, the claim value of complete_by upstream.
func SecretHeaders(providers []string, extra ...string) ([]string, error) {
	var out []string
	for _, p := range providers {
		preset, ok := signature.Lookup(p)
		if !ok {
			return nil, fmt.Errorf("unknown provider %q (known: %s)", p, strings.Join(signature.Providers(), ", "))
		}
		for _, hs := range preset.Headers {
			if hs.Signature != "" {
				out = append(out, http.CanonicalHeaderKey(hs.Signature))
			}
		}
		for _, h := range preset.CredentialHeaders {
			out = append(out, http.CanonicalHeaderKey(h))
		}
		if preset.Legacy != nil && preset.Legacy.Header != "" {
			out = append(out, http.CanonicalHeaderKey(preset.Legacy.Header))
		}
		for _, c := range preset.Challenges {
			// A handshake header whose value becomes the signing secret
			// (Asana's X-Hook-Secret).
			if kind, name, _ := strings.Cut(c.LearnSecret, " "); kind == "header" {
				out = append(out, http.CanonicalHeaderKey(name))
			}
		}
		if p == "hmac" && len(extra) == 0 {
			return nil, errors.New("provider hmac: name its signature header (--header)")
		}
	}
	for _, h := range extra {
		if h = strings.TrimSpace(h); h != "" {
			out = append(out, http.CanonicalHeaderKey(h))
		}
	}
	// complete_by upstream's claim value, on the request reverse_proxy
	// sends (its debug line prints that request's headers).
	out = append(out, "Webhook-Claim")
	slices.Sort(out)
	return slices.Compact(out), nil
}

// HandshakeSecrets returns what else of a handshake carries a secret, for
// the providers: response headers that echo a learned secret (Asana's
// X-Hook-Secret, printed by access logs as resp_headers) and query
// parameters that carry a verify token (Meta's hub.verify_token, printed in
// the request's uri).
func HandshakeSecrets(providers []string) (respHeaders, queryParams []string) {
	for _, p := range providers {
		preset, _ := signature.Lookup(p)
		for _, c := range preset.Challenges {
			if c.Answer == signature.AnswerHeader && c.LearnSecret != "" && c.Echo == c.LearnSecret {
				respHeaders = append(respHeaders, http.CanonicalHeaderKey(c.EchoHeader))
			}
			if c.Auth == signature.AuthVerifyToken && c.TokenQuery != "" {
				queryParams = append(queryParams, c.TokenQuery)
			}
		}
	}
	slices.Sort(respHeaders)
	slices.Sort(queryParams)
	return slices.Compact(respHeaders), slices.Compact(queryParams)
}

// LogFilter renders the Caddyfile logging configuration that deletes the
// headers from every line that prints a request: the global default log
// (reverse_proxy, http.log.error) when site is false, a site's access log
// directive when site is true. wrap is the encoder the lines are written
// with (json or console).
func LogFilter(headers []string, wrap string, site bool) string {
	return LogFilterWith(headers, nil, nil, wrap, site)
}

// LogFilterWith is LogFilter that also deletes response headers
// (resp_headers) and the values of query parameters in the request's uri
// (see HandshakeSecrets).
func LogFilterWith(headers, respHeaders, queryParams []string, wrap string, site bool) string {
	var b strings.Builder
	indent := "\t"
	if site {
		b.WriteString("log {\n")
	} else {
		b.WriteString("{\n\tlog default {\n")
		indent = "\t\t"
	}
	fmt.Fprintf(&b, "%sformat filter {\n%s\twrap %s\n%s\tfields {\n", indent, indent, wrap, indent)
	for _, h := range headers {
		fmt.Fprintf(&b, "%s\t\trequest>headers>%s delete\n", indent, h)
	}
	for _, h := range respHeaders {
		fmt.Fprintf(&b, "%s\t\tresp_headers>%s delete\n", indent, h)
	}
	if len(queryParams) > 0 {
		fmt.Fprintf(&b, "%s\t\trequest>uri query {\n", indent)
		for _, q := range queryParams {
			fmt.Fprintf(&b, "%s\t\t\tdelete %s\n", indent, q)
		}
		fmt.Fprintf(&b, "%s\t\t}\n", indent)
	}
	fmt.Fprintf(&b, "%s\t}\n%s}\n", indent, indent)
	if !site {
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

func logFilterCommand() *cobra.Command {
	var (
		providers, headers []string
		wrap               string
		site               bool
	)
	c := &cobra.Command{
		Use:   "log-filter --provider <name>... [--header <name>...] [--site] [--wrap json|console]",
		Short: "Prints the logging configuration that keeps signature and token headers out of Caddy's logs",
		Long: `
Caddy's own log lines print a request's headers: reverse_proxy's "upstream
roundtrip" (DEBUG, with the global debug option), "aborting with incomplete
response" (WARN, when the upstream cuts its answer), the error log, and every
access log. Caddy redacts only Authorization and Cookie; a provider's
signature header, and GitLab's X-Gitlab-Token (the secret itself), are
printed as sent.

This prints the configuration that deletes every signature and token header
of the given providers from those lines: by default the global options block
with the default log (put it in your Caddyfile's global options, merging with
a log default block you already have); with --site the log directive for a
site's access log. Give every provider the Caddy instance serves; --header
adds names (provider hmac's configured header, a renamed header).
`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(providers) == 0 {
				return errors.New("--provider is required (repeatable, or comma-separated)")
			}
			if wrap != "json" && wrap != "console" {
				return fmt.Errorf("--wrap: want json or console, got %q", wrap)
			}
			hs, err := SecretHeaders(providers, headers...)
			if err != nil {
				return err
			}
			resp, query := HandshakeSecrets(providers)
			_, err = fmt.Fprint(cmd.OutOrStdout(), LogFilterWith(hs, resp, query, wrap, site))
			return err
		},
	}
	f := c.Flags()
	f.StringSliceVar(&providers, "provider", nil, "provider preset (repeatable): "+strings.Join(signature.Providers(), ", "))
	f.StringSliceVar(&headers, "header", nil, "another header to delete (repeatable), e.g. provider hmac's")
	f.StringVar(&wrap, "wrap", "json", "encoder of the log lines: json or console")
	f.BoolVar(&site, "site", false, "print a site's access log directive instead of the global default log")
	return c
}
