// Command send signs a realistic Stripe event the way Stripe does
// (Stripe-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "t.body">) and delivers
// it n times, as a provider redelivering one event would, optionally all at
// once. It only talks to the URL it is given.
//
//	go run ./examples/send -url http://127.0.0.1:8080/webhooks/stripe -n 5
package main

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run delivers as the flags in args say and returns the exit status: 0 when
// the gateway answered every delivery (whatever the status), 1 otherwise.
func run(args []string, stdout, stderr io.Writer) int {
	flag := flag.NewFlagSet("send", flag.ContinueOnError)
	flag.SetOutput(stderr)
	url := flag.String("url", "http://127.0.0.1:8080/webhooks/stripe", "gateway URL")
	secret := flag.String("secret", envOr("STRIPE_WEBHOOK_SECRET", "whsec_demo_not_a_real_secret"),
		"Stripe signing secret (default $STRIPE_WEBHOOK_SECRET, else the demo's)")
	n := flag.Int("n", 5, "how many times to deliver the event (1..1000)")
	concurrent := flag.Bool("concurrent", false, "send all deliveries at once instead of one after another")
	payload := flag.String("payload", "examples/payloads/stripe_payment_intent_succeeded.json", "event body template")
	eventID := flag.String("id", "", "event ID (default: a fresh evt_...)")
	if err := flag.Parse(args); err != nil {
		return 2
	}
	if *n < 1 || *n > 1000 {
		fmt.Fprintln(stderr, "-n must be between 1 and 1000")
		return 2
	}
	tmpl, err := os.ReadFile(*payload)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	id := *eventID
	if id == "" {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		id = "evt_demo_" + hex.EncodeToString(b)
	}
	// Give the template a fresh event ID, keeping every other byte.
	body := replaceID(tmpl, id)

	client := &http.Client{Timeout: 30 * time.Second}
	// send returns the delivery's line and whether the gateway answered at all.
	send := func(i int) (string, bool) {
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		mac := hmac.New(sha256.New, []byte(*secret))
		mac.Write([]byte(ts + "."))
		mac.Write(body)
		req, err := http.NewRequest(http.MethodPost, *url, bytes.NewReader(body))
		if err != nil {
			return err.Error(), false
		}
		req.Header.Set("Content-Type", "application/json; charset=utf-8")
		req.Header.Set("Stripe-Signature", "t="+ts+",v1="+hex.EncodeToString(mac.Sum(nil)))
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Sprintf("delivery %d: %v", i, err), false
		}
		defer resp.Body.Close()
		rb, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		line := fmt.Sprintf("delivery %d: %d %s", i, resp.StatusCode, strings.TrimSpace(string(rb)))
		if resp.Header.Get("Idempotent-Replayed") == "true" {
			line += "  (Idempotent-Replayed: true)"
		}
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			line += "  (Retry-After: " + ra + ")"
		}
		return line, true
	}

	fmt.Fprintf(stdout, "event %s, %d deliveries to %s\n", id, *n, *url)
	lines := make([]string, *n)
	answered := make([]bool, *n)
	if *concurrent {
		var wg sync.WaitGroup
		for i := range *n {
			wg.Add(1)
			go func() { defer wg.Done(); lines[i], answered[i] = send(i + 1) }()
		}
		wg.Wait()
	} else {
		for i := range *n {
			lines[i], answered[i] = send(i + 1)
		}
	}
	unanswered := 0
	for i, l := range lines {
		fmt.Fprintln(stdout, l)
		if !answered[i] {
			unanswered++
		}
	}
	if unanswered > 0 {
		// A demo that reached no gateway must not read as a success (make demo
		// stops here): say what to start.
		fmt.Fprintf(stderr, "%d of %d deliveries got no answer from %s: is the gateway running? (make run, in another terminal)\n", unanswered, *n, *url)
		return 1
	}
	return 0
}

// replaceID swaps the first "id" value of the event envelope.
func replaceID(body []byte, id string) []byte {
	const key = `"id": "`
	i := bytes.Index(body, []byte(key))
	if i < 0 {
		return body
	}
	j := bytes.IndexByte(body[i+len(key):], '"')
	if j < 0 {
		return body
	}
	out := append([]byte{}, body[:i+len(key)]...)
	out = append(out, id...)
	return append(out, body[i+len(key)+j:]...)
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}
