package signature_test

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// at is the fixed clock of the examples.
var at = time.Unix(1_764_547_200, 0)

// deliver signs body as the provider would and verifies it with the same
// options, printing the verdict.
func deliver(provider string, o signature.Options, body string, h http.Header) {
	o.Now = func() time.Time { return at }
	if err := signature.Sign(provider, o, []byte(body), h, at); err != nil {
		fmt.Println("sign:", err)
		return
	}
	v, err := signature.New(provider, o)
	if err != nil {
		fmt.Println("new:", err)
		return
	}
	fmt.Println(provider, "verified:", v.Verify([]byte(body), h) == nil)
}

func ExampleNew_stripe() {
	v, err := signature.New("stripe", signature.Options{
		Secrets: []string{"whsec_new", "whsec_old"}, // rotation: both are tried
		Now:     func() time.Time { return at },
	})
	if err != nil {
		panic(err)
	}
	body := []byte(`{"id":"evt_1","object":"event"}`)
	h := http.Header{}
	h.Set("Stripe-Signature", "t=1764547200,v1=0000000000000000000000000000000000000000000000000000000000000000")
	err = v.Verify(body, h)
	fmt.Println(errors.Is(err, signature.ErrNoMatchingSignature))
	// Output: true
}

func ExampleSign() {
	h := http.Header{}
	o := signature.Options{Secrets: []string{"whsec_test"}}
	if err := signature.Sign("stripe", o, []byte(`{"id":"evt_1"}`), h, at); err != nil {
		panic(err)
	}
	fmt.Println(h.Get("Stripe-Signature")[:13])
	// Output: t=1764547200,
}

func ExampleNew_github() {
	deliver("github", signature.Options{Secrets: []string{"gh-secret"}}, `{"zen":"hi"}`, http.Header{})
	// Output: github verified: true
}

func ExampleNew_standard() {
	h := http.Header{}
	h.Set("webhook-id", "msg_1") // signed, so it must be present before signing
	deliver("standard", signature.Options{Secrets: []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}, `{"type":"user.created"}`, h)
	// Output: standard verified: true
}

func ExampleNew_shopify() {
	deliver("shopify", signature.Options{Secrets: []string{"shpss_secret"}}, `{"id":820982911946154508}`, http.Header{})
	// Output: shopify verified: true
}

func ExampleNew_slack() {
	deliver("slack", signature.Options{Secrets: []string{"slack_signing_secret"}}, `{"type":"event_callback","event_id":"Ev1"}`, http.Header{})
	// Output: slack verified: true
}

func ExampleNew_paddle() {
	deliver("paddle", signature.Options{Secrets: []string{"pdl_ntfset_01_secret"}}, `{"event_id":"evt_01"}`, http.Header{})
	// Output: paddle verified: true
}

func ExampleNew_square() {
	o := signature.Options{Secrets: []string{"sq_signature_key"}, URL: "https://hooks.example.com/square"}
	deliver("square", o, `{"event_id":"6a8f5f28"}`, http.Header{})
	// Output: square verified: true
}

func ExampleNew_hmac() {
	o := signature.Options{
		Secrets: []string{"generic-secret"},
		HMAC:    signature.HMACOptions{Header: "X-Webhook-Signature", Algorithm: "sha256", Encoding: "hex", Prefix: "sha256="},
	}
	deliver("hmac", o, `{"id":"whevt_1"}`, http.Header{})
	// Output: hmac verified: true
}

func ExampleNew_twilio() {
	h := http.Header{}
	h.Set("Content-Type", "application/x-www-form-urlencoded")
	o := signature.Options{Secrets: []string{"twilio_auth_token"}, URL: "https://hooks.example.com/twilio/sms"}
	deliver("twilio", o, "Body=Hello&From=%2B15550000001&MessageSid=SM1", h)
	// Output: twilio verified: true
}

func ExampleLookup() {
	p, _ := signature.Lookup("slack")
	fmt.Println(p.SignatureHeader)
	fmt.Println(p.Signed, p.Algorithm, p.Encoding, p.DefaultTolerance, p.EventID)
	// Output:
	// X-Slack-Signature: v0=<hex> (with X-Slack-Request-Timestamp)
	// v0:{timestamp}:{body} sha256 hex 5m0s [json event_id]
}
