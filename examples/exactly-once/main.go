// Command exactly-once is a legacy Stripe webhook handler in Go
// (net/http + database/sql), made exactly-once behind Caddy's
// webhook_idempotency with complete_by upstream: the legacy code as it
// was (one transaction: mark the order paid, queue the confirmation
// e-mail) plus ONE call inside that transaction,
//
//	SELECT webhook_events_commit($1)   -- $1: the Webhook-Claim header
//
// which completes the delivery's claim in the same commit, or raises when
// the claim is no longer this delivery's, so the order update and the
// e-mail roll back and the provider's retry does the work, once.
//
// Run: DATABASE_URL=postgres://app@127.0.0.1/shop PORT=9000 go run ./examples/exactly-once
// (schema.sql creates the tables).
package main

import (
	"cmp"
	"database/sql"
	"encoding/json"
	"errors"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

type event struct {
	Type string `json:"type"`
	Data struct {
		Object struct {
			ID string `json:"id"`
		} `json:"object"`
	} `json:"data"`
}

func stripeWebhook(db *sql.DB) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// The gateway verified Stripe's signature before forwarding.
		var ev event
		if err := json.NewDecoder(r.Body).Decode(&ev); err != nil {
			http.Error(w, "bad json", http.StatusBadRequest)
			return
		}
		if ev.Type != "payment_intent.succeeded" {
			return
		}
		ctx := r.Context()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			http.Error(w, "database unavailable", http.StatusServiceUnavailable)
			return
		}
		defer func() { _ = tx.Rollback() }() // a no-op after Commit

		var orderID string
		err = tx.QueryRowContext(ctx, `UPDATE orders SET status = 'paid', paid_at = now()
			WHERE payment_intent_id = $1 RETURNING id`, ev.Data.Object.ID).Scan(&orderID)
		if errors.Is(err, sql.ErrNoRows) {
			http.Error(w, "unknown payment intent", http.StatusNotFound)
			return
		}
		if err == nil {
			_, err = tx.ExecContext(ctx, `INSERT INTO email_outbox (order_id, template)
				VALUES ($1, 'payment_confirmation')`, orderID)
		}
		if err == nil {
			// The one call (complete_by upstream). Never log the header's value.
			_, err = tx.ExecContext(ctx, `SELECT webhook_events_commit($1)`, r.Header.Get("Webhook-Claim"))
		}
		if err == nil {
			err = tx.Commit()
		}
		if err != nil {
			log.Printf("payment_intent %s: not recorded: %v", ev.Data.Object.ID, err)
			http.Error(w, "not recorded", http.StatusInternalServerError)
			return
		}
	}
}

func main() {
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/stripe", stripeWebhook(db))
	srv := &http.Server{
		Addr:              net.JoinHostPort("127.0.0.1", cmp.Or(os.Getenv("PORT"), "9000")),
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
	}
	log.Fatal(srv.ListenAndServe())
}
