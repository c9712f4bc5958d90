package eventid_test

import (
	"net/http"
	"os"
	"testing"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
)

// BenchmarkExtract measures reading the event ID of a realistic Stripe event
// (json id: validating and scanning the ~2 KB body) and of a GitHub delivery
// (header X-GitHub-Delivery).
func BenchmarkExtract(b *testing.B) {
	body, err := os.ReadFile("../../examples/payloads/stripe_payment_intent_succeeded.json")
	if err != nil {
		b.Fatal(err)
	}
	cases := []struct {
		name   string
		source eventid.Source
		header http.Header
	}{
		{"json", eventid.Source{Kind: eventid.JSON, Name: "id"}, http.Header{}},
		{"header", eventid.Source{Kind: eventid.Header, Name: "X-GitHub-Delivery"},
			http.Header{"X-Github-Delivery": {"72d3162e-cc78-11e3-81ab-4c9367dc0958"}}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			e, err := eventid.New([][]eventid.Source{{c.source}})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := e.Extract(body, c.header); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.Extract(body, c.header); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
