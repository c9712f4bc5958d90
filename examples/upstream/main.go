// Command upstream is the demo "legacy" webhook handler: deliberately naive
// and non-idempotent. Every POST marks the order paid and "sends" a receipt
// email again, exactly like a handler that was never written for
// at-least-once delivery. GET /stats reports what it did.
//
//	go run ./examples/upstream -listen 127.0.0.1:9000
package main

import (
	"encoding/json"
	"flag"
	"io"
	"log"
	"net/http"
	"sync"
	"time"
)

type stats struct {
	mu        sync.Mutex
	Calls     int            `json:"calls"`
	Emails    int            `json:"emails_sent"`
	PaidCount map[string]int `json:"times_marked_paid"` // per event ID
}

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "address to listen on")
	delay := flag.Duration("delay", 0, "time each webhook takes, e.g. 2s (a slow legacy handler)")
	failEvery := flag.Int("fail-every", 0, "answer 500 to every n-th call (0 = never)")
	flag.Parse()

	st := &stats{PaidCount: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 10<<20))
		if err != nil {
			http.Error(w, "read error", http.StatusBadRequest)
			return
		}
		var evt struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(body, &evt)
		time.Sleep(*delay)

		st.mu.Lock()
		st.Calls++
		n := st.Calls
		fail := *failEvery > 0 && n%*failEvery == 0
		if !fail {
			// The non-idempotent work: no check whether it was done before.
			st.PaidCount[evt.ID]++
			st.Emails++
		}
		st.mu.Unlock()
		if fail {
			log.Printf("call %d: event %s: failing with 500 (fail-every)", n, evt.ID)
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		log.Printf("call %d: event %s: order marked paid, receipt email sent", n, evt.ID)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		st.mu.Lock()
		defer st.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	})
	log.Printf("demo legacy upstream listening on http://%s (POST any path; GET /stats)", *listen)
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
