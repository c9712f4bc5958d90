package caddymodule

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/cli"
)

// The caddy webhook-idempotency command (internal/cli), registered with
// Caddy's command line.
func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "webhook-idempotency",
		Usage: "sign|event|queue|log-filter ...",
		Short: "Sends signed test deliveries, manages webhook events and the async queue, prints the log filter",
		Long: `
Operations tooling of the webhook_idempotency handler.

  sign    signs a test delivery exactly as the provider would and POSTs it
          to the gateway, printing the status, Idempotent-Replayed and body.
  event   get | forget | release | complete | list: calls the admin API
          (/webhook_idempotency/events) of a running Caddy.
  queue   list | get | retry | purge: the async queue's admin API
          (/webhook_idempotency/queue/).
  log-filter  prints the logging configuration that keeps signature and
          token headers out of Caddy's own log lines.

--admin is Caddy's admin endpoint, as the config's global admin option sets
it: localhost:2019 unless the Caddyfile says otherwise (the demo's
examples/demo.Caddyfile uses 127.0.0.1:2019; a unix socket is unix//path).

Run "caddy webhook-idempotency <command> --help" for the flags.
`,
		CobraFunc: cli.Configure,
	})
}
