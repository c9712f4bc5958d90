package e2e

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// The gateway tests play Stripe: each delivery is a Stripe event signed the
// way Stripe signs it (Stripe-Signature: t=<unix>,v1=<hex HMAC-SHA256 of
// "t.body">), re-signed on every redelivery as Stripe does.

// RandomHex returns n random bytes, hex encoded.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// NewSecret returns a fresh Stripe-style signing secret.
func NewSecret() string { return "whsec_" + RandomHex(16) }

// NewEventID returns a fresh Stripe-style event ID.
func NewEventID() string { return "evt_" + RandomHex(12) }

// StripeBody is the body of a Stripe event with the given ID.
func StripeBody(eventID string) []byte {
	return fmt.Appendf(nil, `{"id":%q,"object":"event","api_version":"2024-06-20","type":"payment_intent.succeeded","data":{"object":{"id":"pi_%s","object":"payment_intent","amount":2000,"currency":"usd"}}}`,
		eventID, eventID[len(eventID)-8:])
}

// StripeSignature is the Stripe-Signature header for body at ts.
func StripeSignature(secret string, body []byte, ts time.Time) string {
	t := strconv.FormatInt(ts.Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(t + "."))
	mac.Write(body)
	return "t=" + t + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

// Result is the gateway's answer to one delivery.
type Result struct {
	Status     int
	Replayed   bool   // Idempotent-Replayed: true
	RetryAfter string // Retry-After header
	Body       string
	Start, End time.Time
}

// Forwarded reports whether the answer is the upstream's own 2xx, not a
// duplicate answered at the edge.
func (r Result) Forwarded() bool { return r.Status >= 200 && r.Status < 300 && !r.Replayed }

// RetryAfterSeconds is the Retry-After header as whole seconds, -1 when it
// is absent or not a number.
func (r Result) RetryAfterSeconds() int {
	n, err := strconv.Atoi(r.RetryAfter)
	if err != nil {
		return -1
	}
	return n
}

// OK reports whether the provider would consider the delivery done (2xx).
func (r Result) OK() bool { return r.Status >= 200 && r.Status < 300 }

// Deliver posts one Stripe-signed delivery of eventID to url, signed now.
func Deliver(ctx context.Context, c *http.Client, url, secret, eventID string) (Result, error) {
	body := StripeBody(eventID)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return Result{}, err
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	req.Header.Set("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)")
	sig := StripeSignature(secret, body, time.Now())
	recordSignature(sig) // looked for in the logs (CheckNoLeaks)
	req.Header.Set("Stripe-Signature", sig)
	res := Result{Start: time.Now()}
	resp, err := c.Do(req)
	if err != nil {
		res.End = time.Now()
		return res, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	res.End = time.Now()
	res.Status = resp.StatusCode
	res.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	res.RetryAfter = resp.Header.Get("Retry-After")
	res.Body = string(b)
	return res, err
}

// NewClient returns an HTTP client for deliveries: keep-alive connections
// for up to conns concurrent requests, and the given overall timeout.
func NewClient(conns int, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			MaxIdleConns:        conns * 2,
			MaxIdleConnsPerHost: conns,
			IdleConnTimeout:     30 * time.Second,
		},
	}
}

// StripeHandler returns the lines of a webhook_idempotency block for Stripe
// on PostgreSQL, followed by extra lines (lease, on_ambiguous, ...).
func StripeHandler(secret, dsn string, extra ...string) []string {
	lines := []string{
		"provider stripe",
		"secret " + strconv.Quote(secret),
		"storage postgres " + strconv.Quote(dsn),
	}
	return append(lines, extra...)
}
