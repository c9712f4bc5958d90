// Command caddy is Caddy with the standard modules and webhook_idempotency:
// the binary `xcaddy build --with github.com/webhook-idempotency/caddy-webhook-idempotency=.`
// produces (xcaddy blank-imports the module's root package, as here), kept in
// the repository so `go build -o caddy ./xcaddy` needs no extra tool.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	// plug in Caddy modules here
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/webhook-idempotency/caddy-webhook-idempotency"
)

func main() {
	caddycmd.Main()
}
