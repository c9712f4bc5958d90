package caddymodule

import (
	"cmp"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// Every answer the gateway writes itself (not the upstream's, not a
// handshake's documented one) comes from the table below, through one
// writer (Handler.answer). A call site names the answer and, where the row
// leaves it to the call, the reason, status or Retry-After. Answers are
// JSON: {"error": reason}, or under provider idempotency_key an RFC 9457
// problem (application/problem+json) where the row has a title. The
// README's "How it works" table states them.

// answerID names one of the gateway's own answers.
type answerID int

const (
	ansDuplicate         answerID = iota + 1 // a redelivery of a completed event
	ansBodyReplay                            // dedupe_body: the body came before under another event ID
	ansQueued                                // async: stored for delivery
	ansStoreUnavailable                      // the store failed: nothing forwarded
	ansStoredUnreadable                      // replay: the stored answer of a completed event could not be read
	ansKeyUnavailable                        // the provider's signing key could not be fetched: nothing recorded
	ansInFlight                              // another delivery holds the event's claim
	ansBodyInFlight                          // dedupe_body: another delivery holds the body's claim
	ansHeld                                  // the event is held after an ambiguous forward
	ansRefused                               // verification failed (refuse_status)
	ansBodyRefused                           // a correctly signed body the scheme refuses (refuse_status)
	ansBadRequest                            // no usable event ID, an unreadable body, a bad handshake
	ansTooLarge                              // over max_body
	ansUnsupported                           // a Content-Encoding other than gzip or identity
	ansReadTimeout                           // the body did not arrive within read_timeout
	ansKeyMalformed                          // idempotency_key: the key header is malformed
	ansKeyMissing                            // idempotency_key: no key on a request that needs one
	ansKeyReused                             // idempotency_key: the key came with another request
	ansNoIdentity                            // idempotency_key: a key without the caller's identity
	ansIncomplete                            // idempotency_key: the key's stored answer has no body
	ansUpstreamError                         // the next handler failed before answering (status: the error's)
	ansNoUpstream                            // no handler after this one answered (status: 502)
	ansItemsDone                             // batch split: every item completed (body: the call's summary)
	ansItemsUnavailable                      // batch split: an item could not be claimed or is held
	ansItemsInFlight                         // batch split: an item is in flight in another delivery
	ansItemsFailed                           // batch split: the upstream did not accept an item
	ansItemsRefused                          // batch split: items failed their own signature (refuse_status)
	ansAccepted                              // the provider's literal success answer (Adyen's "[accepted]"; body: the call's)
	ansAcceptedDuplicate                     // the same, for a delivery whose every item was a duplicate
	ansTokenReused                           // a single-use signature value came before with another body
	ansSpooled                               // the store failed: kept in the spool, forwarded once it is back
	ansSpooledAccepted                       // the same, with the provider's literal success answer (body: the call's)
	ansSpoolFull                             // the store failed and the spool is full: nothing kept
	ansSpoolError                            // the store failed and writing the spool failed: nothing kept
	ansBodyUnkept                            // a body past spillAbove could not be kept in its temporary file
	ansBodyBudget                            // the scope's body_budget is spent: the body not read on
)

// statusRefuse in a row's status means the route's refuse_status.
const statusRefuse = -1

// answerRow is one answer: what the delivery's log line and metric say,
// and what the client gets.
type answerRow struct {
	// outcome is the delivery's outcome (metrics label, log line); ""
	// leaves the one the delivery has.
	outcome string
	// status is the answer's status; 0: the call's; statusRefuse: the
	// route's refuse_status.
	status int
	// reason is the {"error": ...} text; "": the call's.
	reason string
	// logged: the reason goes to the delivery's log line too.
	logged bool
	// retry is the least Retry-After; the call's is used when longer (the
	// lease left of an event in flight). 0 and no call's: none.
	retry time.Duration
	// title and detail make the answer an RFC 9457 problem under provider
	// idempotency_key; detail "": the reason. No title: {"error": ...}
	// there too.
	title, detail string
	// body is a fixed body (duplicate, queued) instead of {"error": ...};
	// replayed adds Idempotent-Replayed: true.
	body     []byte
	replayed bool
	// contentType is the Content-Type of the call's body; "":
	// application/json.
	contentType string
}

var (
	duplicateBody = []byte(`{"received":true,"duplicate":true}` + "\n")
	queuedBody    = []byte(`{"received":true,"queued":true}` + "\n")
	spooledBody   = []byte(`{"received":true,"spooled":true}` + "\n")
)

// answers is the table.
var answers = [...]answerRow{
	ansDuplicate:  {outcome: outcomeDuplicate, status: http.StatusOK, body: duplicateBody, replayed: true},
	ansBodyReplay: {outcome: outcomeBodyReplay, status: http.StatusOK, body: duplicateBody, replayed: true},
	ansQueued:     {outcome: outcomeQueued, status: http.StatusOK, body: queuedBody},
	ansStoreUnavailable: {outcome: outcomeStoreError, status: http.StatusServiceUnavailable,
		reason: "event store unavailable", retry: unavailableRetryAfter,
		title: "Idempotency store unavailable", detail: "The request was not processed; retry later."},
	// {"error"} JSON under provider idempotency_key too, as this answer
	// always was (no title); the other store failures there are problems.
	ansStoredUnreadable: {outcome: outcomeStoreError, status: http.StatusServiceUnavailable,
		reason: "event store unavailable", retry: unavailableRetryAfter},
	ansKeyUnavailable: {outcome: outcomeKeyUnavailable, status: http.StatusServiceUnavailable,
		reason: "provider key unavailable", retry: unavailableRetryAfter},
	ansInFlight: {outcome: outcomeInFlight, status: http.StatusConflict,
		reason: "event is being processed by another delivery; retry later",
		title:  "A request is outstanding for this Idempotency-Key",
		detail: "A request with the same key is being processed; retry after it has completed."},
	ansBodyInFlight: {outcome: outcomeInFlight, status: http.StatusConflict,
		reason: "the same body is being processed under another event id; retry later"},
	// No Retry-After: nothing changes until an operator acts.
	ansHeld: {outcome: outcomeHeld, status: http.StatusServiceUnavailable,
		reason: "event is held: a forward of it ended with no known outcome, so the upstream may have run it and may still be running it; it is not forwarded until an operator completes or releases it",
		title:  "Idempotency-Key is held",
		detail: "A request with this key ended with no known outcome: it may have been processed, and may still be running. It is not processed again until an operator completes or releases the key."},
	ansRefused:     {outcome: outcomeInvalidSignature, status: statusRefuse, logged: true},
	ansBodyRefused: {outcome: outcomeBadRequest, status: statusRefuse, logged: true},
	ansBadRequest:  {outcome: outcomeBadRequest, status: http.StatusBadRequest, logged: true, title: "Bad Request"},
	ansTooLarge: {outcome: outcomeTooLarge, status: http.StatusRequestEntityTooLarge, logged: true,
		title: http.StatusText(http.StatusRequestEntityTooLarge)},
	ansUnsupported: {outcome: outcomeUnsupported, status: http.StatusUnsupportedMediaType, logged: true,
		title: http.StatusText(http.StatusUnsupportedMediaType)},
	ansReadTimeout: {outcome: outcomeReadTimeout, status: http.StatusRequestTimeout, logged: true,
		title: http.StatusText(http.StatusRequestTimeout)},
	ansKeyMalformed: {outcome: outcomeBadRequest, status: http.StatusBadRequest, logged: true,
		title: "Idempotency-Key is malformed"},
	ansKeyMissing: {outcome: outcomeBadRequest, status: http.StatusBadRequest, logged: true,
		title: "Idempotency-Key is missing"},
	ansKeyReused: {outcome: outcomeKeyReused, status: http.StatusUnprocessableEntity,
		reason: "the key was used with another request", logged: true, title: "Idempotency-Key is already used",
		detail: "This key was used with a different request; an Idempotency-Key must not be reused across different requests."},
	ansNoIdentity: {outcome: outcomeBadRequest, status: http.StatusUnauthorized,
		reason: "the request has no client identity", logged: true, title: "Client identity is missing"},
	ansIncomplete:       {status: http.StatusBadGateway, replayed: true, title: "Stored answer is incomplete"},
	ansUpstreamError:    {reason: "upstream unavailable"},
	ansNoUpstream:       {reason: "no upstream handler answered", logged: true},
	ansItemsDone:        {outcome: outcomeCompleted, status: http.StatusOK},
	ansItemsUnavailable: {outcome: outcomeStoreError, status: http.StatusServiceUnavailable, retry: unavailableRetryAfter},
	ansItemsInFlight:    {outcome: outcomeInFlight, status: http.StatusConflict},
	ansItemsFailed:      {outcome: outcomeReleased, status: http.StatusBadGateway},
	ansItemsRefused:     {outcome: outcomeInvalidSignature, status: statusRefuse},
	ansAccepted:         {outcome: outcomeCompleted, status: http.StatusOK, contentType: textPlain},
	ansAcceptedDuplicate: {outcome: outcomeDuplicate, status: http.StatusOK, contentType: textPlain,
		replayed: true},
	ansTokenReused: {outcome: outcomeInvalidSignature, status: http.StatusBadRequest,
		reason: "signature token already used", logged: true},
	ansSpooled:         {outcome: outcomeSpooled, status: http.StatusOK, body: spooledBody},
	ansSpooledAccepted: {outcome: outcomeSpooled, status: http.StatusOK, contentType: textPlain},
	ansSpoolFull: {outcome: outcomeSpoolFull, status: http.StatusServiceUnavailable,
		reason: "event store unavailable and spool full", retry: unavailableRetryAfter},
	ansSpoolError: {outcome: outcomeSpoolError, status: http.StatusServiceUnavailable,
		reason: "event store unavailable", retry: unavailableRetryAfter},
	ansBodyUnkept: {outcome: outcomeBodyUnkept, status: http.StatusServiceUnavailable,
		reason: "body could not be kept", retry: unavailableRetryAfter},
	// Retry-After 1 s: a budget frees as soon as the bodies held are
	// answered (read_timeout bounds a body that trickles).
	ansBodyBudget: {outcome: outcomeBodyBudget, status: http.StatusServiceUnavailable,
		reason: "body budget spent; retry later", retry: time.Second,
		title: "Too many request bodies in progress", detail: "The request was not read; retry later."},
}

// textPlain is the Content-Type of a provider's literal answer.
const textPlain = "text/plain; charset=utf-8"

// say is what a call adds to its answer's row.
type say struct {
	reason, detail string
	status         int
	retryAfter     time.Duration
	// upstreamStatus is the problem's upstream_status member (ansIncomplete).
	upstreamStatus int
	// body replaces {"error": ...} (ansItemsDone's summary).
	body []byte
}

// answer writes answer a for delivery d and sets its outcome and, where
// the row says so, its log reason (unless the caller set a more detailed
// one first).
func (h *Handler) answer(w http.ResponseWriter, d *delivery, a answerID, s say) {
	row := &answers[a]
	if row.outcome != "" {
		d.outcome = row.outcome
	}
	reason := cmp.Or(s.reason, row.reason)
	if row.logged && d.reason == "" {
		d.reason = reason
	}
	status := cmp.Or(s.status, row.status)
	if status == statusRefuse {
		status = h.RefuseStatus
	}
	retry := max(row.retry, s.retryAfter)
	if !d.bodyRead && a != ansReadTimeout && d.r.ContentLength != 0 && d.r.ProtoMajor == 1 {
		endUnreadBody(w, d)
	}
	switch {
	case row.body != nil:
		writeFixed(w, status, row.body, row.replayed)
	case s.body != nil:
		if row.replayed {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		writeBody(w, status, cmp.Or(row.contentType, "application/json"), s.body, retry)
	case h.idem != nil && row.title != "":
		if row.replayed {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		b, _ := json.Marshal(problem{Type: problemType, Title: row.title, Status: status,
			Detail: cmp.Or(s.detail, row.detail, reason), UpstreamStatus: s.upstreamStatus})
		writeBody(w, status, "application/problem+json", append(b, '\n'), retry)
	default:
		b, _ := json.Marshal(struct {
			Error string `json:"error"`
		}{reason})
		writeBody(w, status, "application/json", append(b, '\n'), retry)
	}
}

// endUnreadBody prepares the connection for an answer given before the
// body's end. A sender that asked for 100 Continue, none sent since nothing
// read the body, waits for it or for this answer and sends no body: the
// connection closes after the answer, as net/http itself does when it can
// see the request's own body (Caddy's wrapper hides it, and reading the rest
// waited drainAtMost for bytes that never come). Otherwise drainBriefly.
func endUnreadBody(w http.ResponseWriter, d *delivery) {
	if !d.bodyStarted && httpguts.HeaderValuesContainsToken(d.r.Header.Values("Expect"), "100-continue") {
		w.Header().Set("Connection", "close")
		return
	}
	drainBriefly(w)
}

// drainAtMost bounds how long the server reads the unread rest of a
// refused body before it writes the answer.
const drainAtMost = 500 * time.Millisecond

// drainBriefly bounds the connection's reading for an answer given before
// the body's end (too large, an unsupported encoding, body_budget, a
// missing Idempotency-Key). Before writing it, the server reads up to 256
// KiB of the rest, to keep the connection (Caddy's server, whose wrapped
// body net/http cannot size, always does): without a deadline it waited on
// a sender that sends nothing more, and a trial's stalled 6 MB post had no
// 413 after 15 s. Closing the connection at once instead loses the answer
// to a sender still writing (its unread bytes make the close a reset).
// Within drainAtMost the body ends and the connection is kept, or 256 KiB
// more arrived and net/http half-closes and lingers so that the answer is
// read, or the deadline passes and it closes (a stalled sender, its sent
// bytes read). HTTP/2 resets the stream alone.
func drainBriefly(w http.ResponseWriter) {
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(drainAtMost))
}

// problem is an RFC 9457 problem answer of provider idempotency_key, as the
// Idempotency-Key draft recommends.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// UpstreamStatus (an extension member) is the status the upstream
	// answered the key's request with, when its stored answer is
	// incomplete.
	UpstreamStatus int `json:"upstream_status,omitempty"`
}

// problemType is the RFC 9457 type of the problem answers: the README
// section that explains them.
const problemType = "https://github.com/webhook-idempotency/caddy-webhook-idempotency#idempotency-key-for-client-apis"

// writeFixed writes a fixed body with one allocation for the three header
// values. Never shared between answers: the header handler's replace
// operations rewrite values in place.
func writeFixed(w http.ResponseWriter, status int, body []byte, replayed bool) {
	vals := [...]string{"application/json", strconv.Itoa(len(body)), "true"}
	v := vals[:] // one array on the heap, each header a cap-1 window of it
	hdr := w.Header()
	hdr["Content-Type"] = v[0:1:1]
	hdr["Content-Length"] = v[1:2:2]
	if replayed {
		hdr["Idempotent-Replayed"] = v[2:3:3]
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeBody writes status, the body with its Content-Type and
// Content-Length, and Retry-After (whole seconds, at least 1) when
// retryAfter > 0.
func writeBody(w http.ResponseWriter, status int, contentType string, body []byte, retryAfter time.Duration) {
	hdr := w.Header()
	hdr.Set("Content-Type", contentType)
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	if retryAfter > 0 {
		hdr.Set("Retry-After", strconv.Itoa(retrySeconds(retryAfter)))
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// retrySeconds rounds up to whole seconds, at least 1.
func retrySeconds(d time.Duration) int {
	return max(int((d+time.Second-1)/time.Second), 1)
}

// signatureReason turns a verification error into the reason the provider
// (and the operator reading its dashboard) sees: one of "missing signature
// header", "malformed signature header", "no matching signature",
// "timestamp outside tolerance", "body is not JSON" (a correctly signed body
// the scheme refuses) and "body is not a form". The details (the header
// concerned, how many secrets were tried, the tolerance) go to the log line
// only: they tell a prober how the route is configured. No secret or
// signature is ever in either.
func signatureReason(err error) string {
	for _, sentinel := range []error{signature.ErrMissingHeader, signature.ErrMalformedHeader,
		signature.ErrNoMatchingSignature, signature.ErrTimestampOutOfTolerance,
		signature.ErrBodyNotJSON, signature.ErrBodyNotForm} {
		if errors.Is(err, sentinel) {
			return sentinel.Error()
		}
	}
	return "signature verification failed"
}

// refusal is the answer of a verification error: a body the scheme
// refuses is a bad request, not an invalid signature.
func refusal(err error) answerID {
	if errors.Is(err, signature.ErrBodyNotJSON) || errors.Is(err, signature.ErrBodyNotForm) {
		return ansBodyRefused
	}
	return ansRefused
}

// eventIDReason explains why a delivery has no usable event ID.
func eventIDReason(err error) string {
	for _, e := range []error{eventid.ErrMissing, eventid.ErrEmpty, eventid.ErrNotScalar,
		eventid.ErrTooLong, eventid.ErrAmbiguous, eventid.ErrBadBody, eventid.ErrNotText} {
		if errors.Is(err, e) {
			return err.Error()
		}
	}
	return "no usable event id"
}
