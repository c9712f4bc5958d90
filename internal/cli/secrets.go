package cli

import (
	"errors"
	"net/http"
	"net/url"

	"github.com/caddyserver/caddy/v2"
	"github.com/spf13/cobra"
)

// secretsCommand is `secrets list|enroll|forget`: the secrets routes learn
// in handshakes (asana, notion) through the admin API, never their values.
func secretsCommand() *cobra.Command {
	var admin, scope, forText string
	c := &cobra.Command{
		Use:   "secrets list|enroll|forget [flags]",
		Short: "Lists, enrolls or forgets the secrets routes learn in handshakes (asana, notion)",
		Long: `
Calls the admin API of a running Caddy (module admin.api.webhook_idempotency).
A provider that hands its signing secret over in an unauthenticated handshake
(Asana's X-Hook-Secret, Notion's verification_token) teaches a route its
secret only while the scope's enrollment window is open:

  list     [--scope S]              each scope's learned secret as a fingerprint (never the value),
                                    when, from which address and by which instance it was learned,
                                    and its enrollment window
  enroll   --scope S --for 10m      opens the window (register the webhook at the provider now);
                                    --for 0 closes it; learning a secret closes it too
  forget   --scope S                forgets the learned secret (then enroll and register again)
`,
	}
	c.PersistentFlags().StringVar(&admin, "admin", caddy.DefaultAdminListen, adminFlagHelp)
	list := &cobra.Command{
		Use:   "list [--scope S]",
		Short: "Lists learned secrets (fingerprints) and enrollment windows",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			uri := AdminPrefix + "secrets"
			if scope != "" {
				uri += "?" + url.Values{"scope": {scope}}.Encode()
			}
			cmd.SilenceUsage = true
			return adminCall(cmd.OutOrStdout(), admin, http.MethodGet, uri)
		},
	}
	list.Flags().StringVar(&scope, "scope", "", "only this scope")
	enroll := &cobra.Command{
		Use:   "enroll --scope S --for D",
		Short: "Opens a scope's enrollment window: a handshake may teach its secret until it closes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if scope == "" || forText == "" {
				return errors.New("--scope and --for are required (e.g. --for 10m; --for 0 closes the window)")
			}
			cmd.SilenceUsage = true
			return adminCall(cmd.OutOrStdout(), admin, http.MethodPost,
				AdminPrefix+"secrets/enroll?"+url.Values{"scope": {scope}, "for": {forText}}.Encode())
		},
	}
	enroll.Flags().StringVar(&scope, "scope", "", "the route's scope (default of a route: its provider name)")
	enroll.Flags().StringVar(&forText, "for", "", "how long the window stays open, e.g. 10m (at most 24h)")
	forget := &cobra.Command{
		Use:   "forget --scope S",
		Short: "Forgets a scope's learned secret",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if scope == "" {
				return errors.New("--scope is required")
			}
			cmd.SilenceUsage = true
			return adminCall(cmd.OutOrStdout(), admin, http.MethodDelete,
				AdminPrefix+"secrets?"+url.Values{"scope": {scope}, "confirm": {scope}}.Encode())
		},
	}
	forget.Flags().StringVar(&scope, "scope", "", "the route's scope")
	c.AddCommand(list, enroll, forget)
	return c
}
