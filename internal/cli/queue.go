package cli

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/caddyserver/caddy/v2"
	"github.com/spf13/cobra"
)

// queueCommand is `caddy webhook-idempotency queue`: the async queue's admin
// API (admin.api.webhook_idempotency_queue) from the command line.
func queueCommand() *cobra.Command {
	var (
		admin, scope, id, state string
		limit                   int
		afterID                 int64
	)
	c := &cobra.Command{
		Use:   "queue list|get|retry|purge [flags]",
		Short: "Lists, shows, retries or purges async-mode queued events through the admin API",
		Long: `
Calls the queue admin API of a running Caddy (module
admin.api.webhook_idempotency_queue, routes in mode async):

  list   [--scope S [--state dead] [--limit N] [--after-id N]]
         without --scope: every scope's queued, delivering and dead counts
  get    --scope S --id I          one event and its attempts (never the body)
  retry  --scope S [--id I]        a dead event (or every dead event of the
                                   scope): due now, a fresh round of attempts
  purge  --scope S --id I          deletes the queue row (not while in delivery)
  purge  --scope S --state S       every event in a state: dead, delivered or queued

A purge loses events the provider was already told were received; the claim
stays, so the provider's redelivery is still a duplicate. The command sends
the confirmation the admin API requires (?confirm=<event id> or <state>).
`,
	}
	c.PersistentFlags().StringVar(&admin, "admin", caddy.DefaultAdminListen, adminFlagHelp)
	call := func(cmd *cobra.Command, method, uri string) error {
		cmd.SilenceUsage = true
		return adminCall(cmd.OutOrStdout(), admin, method, uri)
	}
	scoped := func() (string, error) {
		if scope == "" {
			return "", errors.New("--scope is required")
		}
		return QueueAdminPrefix + url.PathEscape(scope), nil
	}
	list := &cobra.Command{
		Use:   "list [--scope S] [--state S] [--limit N] [--after-id N]",
		Short: "Without --scope every scope's counts; with it a page of its events",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if scope == "" {
				return call(cmd, http.MethodGet, QueueAdminPrefix)
			}
			q := url.Values{}
			if state != "" {
				q.Set("state", state)
			}
			if limit > 0 {
				q.Set("limit", fmt.Sprint(limit))
			}
			if afterID > 0 {
				q.Set("after_id", fmt.Sprint(afterID))
			}
			return call(cmd, http.MethodGet, QueueAdminPrefix+url.PathEscape(scope)+"/events?"+q.Encode())
		},
	}
	list.Flags().StringVar(&state, "state", "", "queued, delivering, delivered or dead")
	list.Flags().IntVar(&limit, "limit", 0, "page size, 1..1000 (default 100)")
	list.Flags().Int64Var(&afterID, "after-id", 0, "the previous page's next.after_id")
	get := &cobra.Command{
		Use:   "get --scope S --id I",
		Short: "Shows one queued event and its attempts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			base, err := scoped()
			if err != nil || id == "" {
				return errors.New("--scope and --id are required")
			}
			return call(cmd, http.MethodGet, base+"/event?"+url.Values{"id": {id}}.Encode())
		},
	}
	retry := &cobra.Command{
		Use:   "retry --scope S [--id I]",
		Short: "Retries a dead event, or every dead event of the scope",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			base, err := scoped()
			if err != nil {
				return err
			}
			if id == "" {
				return call(cmd, http.MethodPost, base+"/retry")
			}
			return call(cmd, http.MethodPost, base+"/event/retry?"+url.Values{"id": {id}}.Encode())
		},
	}
	purge := &cobra.Command{
		Use:   "purge --scope S (--id I | --state S)",
		Short: "Deletes one queued event, or every event in a state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			base, err := scoped()
			if err != nil {
				return err
			}
			switch {
			case id != "" && state == "":
				// Query parameters, not a path segment: an ID such as ".."
				// would be cleaned into another resource.
				return call(cmd, http.MethodDelete, base+"/event?"+url.Values{"id": {id}, "confirm": {id}}.Encode())
			case id == "" && state != "":
				q := url.Values{"state": {state}, "confirm": {state}}
				return call(cmd, http.MethodDelete, base+"/events?"+q.Encode())
			}
			return errors.New("purge: give exactly one of --id and --state")
		},
	}
	purge.Flags().StringVar(&state, "state", "", "dead, delivered or queued")
	for _, sc := range []*cobra.Command{list, get, retry, purge} {
		sc.Flags().StringVar(&scope, "scope", "", "the route's scope (default of a route: its provider name)")
		if sc != list {
			sc.Flags().StringVar(&id, "id", "", "the event ID")
		}
	}
	c.AddCommand(list, get, retry, purge)
	return c
}

// adminFlagHelp explains --admin: Caddy's admin endpoint, as the config's
// global admin option sets it.
const adminFlagHelp = "address of Caddy's admin endpoint: the Caddyfile's global `admin` option " +
	"(default localhost:2019; the demo's 127.0.0.1:2019; unix//path for a socket)"
