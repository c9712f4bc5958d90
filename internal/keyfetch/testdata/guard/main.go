// Command guard calls keyfetch.SetTestOverride from a program that is not a
// test binary; TestOverrideGuard requires it to panic.
package main

import "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/keyfetch"

func main() {
	keyfetch.SetTestOverride(&keyfetch.TestOverride{Addr: "127.0.0.1:1"})
}
