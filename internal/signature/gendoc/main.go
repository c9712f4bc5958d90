// Command gendoc writes docs/providers.md from the signature presets (run
// by go generate in internal/signature; TestProvidersDoc fails when the
// file is stale).
package main

import (
	"fmt"
	"os"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

func main() {
	out := "../../docs/providers.md"
	if len(os.Args) > 1 {
		out = os.Args[1]
	}
	if err := os.WriteFile(out, []byte(signature.ProvidersDoc()), 0o644); err != nil { //nolint:gosec // a document, world-readable like the rest of the repository
		fmt.Fprintln(os.Stderr, "gendoc:", err)
		os.Exit(1)
	}
}
