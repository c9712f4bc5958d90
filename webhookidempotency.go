// Package webhookidempotency is the module's root: importing it registers
// the webhook_idempotency Caddy modules (http.handlers.webhook_idempotency,
// admin.api.webhook_idempotency, admin.api.webhook_idempotency_queue and
// the Caddyfile directive), so
//
//	xcaddy build --with github.com/webhook-idempotency/caddy-webhook-idempotency
//
// builds Caddy with them, as with every Caddy plugin. The modules themselves
// live in the caddymodule package; see the README's "Install with xcaddy" section.
package webhookidempotency

import (
	// Registers the modules in its init functions.
	_ "github.com/webhook-idempotency/caddy-webhook-idempotency/caddymodule"
)
