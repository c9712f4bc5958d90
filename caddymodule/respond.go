package caddymodule

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// The answers of the README's "How it works" table, in one place. Every answer the gateway gives
// itself (not the upstream's) is JSON.

var duplicateBody = []byte(`{"received":true,"duplicate":true}` + "\n")

// respondDuplicate answers a redelivery of a completed event at the edge.
func respondDuplicate(w http.ResponseWriter) {
	// One allocation for the three values. Never shared between answers:
	// the header handler's replace operations rewrite values in place.
	vals := [...]string{"application/json", "true", duplicateLength}
	v := vals[:] // one array on the heap, each header a cap-1 window of it
	hdr := w.Header()
	hdr["Content-Type"] = v[0:1:1]
	hdr["Idempotent-Replayed"] = v[1:2:2]
	hdr["Content-Length"] = v[2:3:3]
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(duplicateBody)
}

var duplicateLength = strconv.Itoa(len(duplicateBody))

// respondError writes {"error": msg} with the status, and Retry-After (whole
// seconds, at least 1) when retryAfter > 0.
func respondError(w http.ResponseWriter, status int, msg string, retryAfter time.Duration) {
	b, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	writeAnswer(w, status, "application/json", append(b, '\n'), retryAfter)
}

// writeAnswer writes one of the gateway's own answers: status, the body
// with its Content-Type and Content-Length, and Retry-After (whole seconds,
// at least 1) when retryAfter > 0.
func writeAnswer(w http.ResponseWriter, status int, contentType string, body []byte, retryAfter time.Duration) {
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
	s := int((d + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return s
}

// signatureReason turns a verification error into the reason the provider
// (and the operator reading its dashboard) sees: one of "missing signature
// header", "malformed signature header", "no matching signature",
// "timestamp outside tolerance", "body is not JSON" (a correctly signed body
// the scheme refuses) and "body is not a form". The details (the header concerned,
// how many secrets were tried, the tolerance) go to the log line only: they
// tell a prober how the route is configured. No secret or signature is ever
// in either.
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

// isBodyRefusal reports a verification error about the body rather than the
// signature: the delivery is a bad request, not an invalid signature.
func isBodyRefusal(err error) bool {
	return errors.Is(err, signature.ErrBodyNotJSON) || errors.Is(err, signature.ErrBodyNotForm)
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
