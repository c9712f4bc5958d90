package signature

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Delivery is how a provider delivers its webhooks, as its documentation
// states it: the facts around the signature that decide how the gateway
// should treat the provider (how long a failed delivery comes back, how
// large a body to accept, how fast to answer and with what). Other features
// read it: MaxBody is the natural default of a route's max_body, Retry
// decides whether a delivery the upstream refused must be spooled because
// the provider will not send it again.
//
// Every fact names its Source: the provider's document, or Undocumented
// when the documentation does not state it, in which case the fact's
// values are zero and mean nothing. A fact with no Source at all has not
// been researched yet (TestDeliveryFacts allows that for no preset).
type Delivery struct {
	// Retry is whether and how long the provider redelivers a delivery
	// that failed.
	Retry Retry
	// MaxBody is the largest body the provider sends.
	MaxBody MaxBody
	// Timeout is how long the provider waits for the answer before it
	// counts the delivery as failed.
	Timeout Timeout
	// Answer is the answer that counts as success.
	Answer Answer
	// Refusal is what the provider requires of, or does with, the answer
	// to a delivery the gateway refuses (a bad or missing signature).
	Refusal Refusal
}

// allUndocumented is the delivery facts of a provider whose documents,
// read, state none of them.
var allUndocumented = Delivery{
	Retry: Retry{Source: Undocumented}, MaxBody: MaxBody{Source: Undocumented}, Timeout: Timeout{Source: Undocumented},
	Answer: Answer{Source: Undocumented}, Refusal: Refusal{Source: Undocumented},
}

// Source is where a fact comes from: the https URL of the provider's
// document (an anchor where one exists), or Undocumented.
type Source string

// Undocumented marks a fact the provider's documentation does not state.
const Undocumented Source = "undocumented"

// Retry says whether a provider redelivers a failed delivery (no answer in
// time, a connection error, or a status it does not count as success).
type Retry struct {
	// Retries is true when the provider redelivers a failed delivery on
	// its own. False with a Source: it documents that it does not (a lost
	// delivery is lost, or only a manual resend exists).
	Retries bool
	// For is how long after the first attempt the provider keeps
	// retrying; 0: not stated.
	For time.Duration
	// Attempts is the number of deliveries of one event in all, the first
	// included; 0: not stated.
	Attempts int
	// Note is what else the document says, in a few words: backoff, which
	// statuses are retried, when the endpoint is disabled.
	Note   string
	Source Source
}

// OutlastsOutage reports whether the provider's documented redelivery
// would bring a delivery refused during a store outage back after the
// outage: it retries for at least an hour by its document. An hour covers
// the store outages a spool is for (a failover, a restart, a managed
// database's maintenance). A provider that gives up sooner (Okta retries
// once) or does not say for how long loses what arrives during a longer
// one, so the safe answer there is no.
func (r Retry) OutlastsOutage() bool {
	return r.Retries && r.For >= time.Hour
}

// MaxBody is the largest delivery body the provider sends. A route's
// max_body defaults to Limit when that is larger than the gateway's own
// default (5 MB).
type MaxBody struct {
	// Bytes is the documented limit; 0: not stated.
	Bytes int64
	// Body is the largest request body Bytes allows when Bytes bounds only
	// part of it (Pub/Sub's message data, base64-encoded inside a JSON
	// envelope), worked out from the document's other limits; 0: Bytes
	// bounds the whole body.
	Body int64
	// Note qualifies it (e.g. what the provider does with a larger event).
	Note   string
	Source Source
}

// Limit is the largest request body the provider documents, in bytes: Body
// when set, else Bytes; 0 when undocumented.
func (m MaxBody) Limit() int64 {
	if m.Body != 0 {
		return m.Body
	}
	return m.Bytes
}

// Timeout is how long the provider waits for the answer.
type Timeout struct {
	// Duration is the documented limit; 0: not stated.
	Duration time.Duration
	Note     string
	Source   Source
}

// Answer is the answer that counts as a successful delivery.
type Answer struct {
	// Status is the one status required; 0: any 2xx.
	Status int
	// Body is the literal body required (Adyen's "[accepted]"); "": any.
	Body string
	// Note qualifies it (e.g. "answer before processing").
	Note   string
	Source Source
}

// Refusal is what the provider says about the answer to a delivery the
// receiver refuses.
type Refusal struct {
	// Status is the status the provider requires for a refused delivery
	// (Discord's 401); 0: none required, the gateway answers 400. It sets
	// the preset's RefuseStatus.
	Status int
	// Note is how the provider treats a refusal (retried like any
	// failure, or given up).
	Note   string
	Source Source
}

// checkSource checks one fact's source: unresearched (""), Undocumented
// with zero values, or an https URL.
func checkSource(fact string, s Source, zero bool) error {
	switch {
	case s == "":
		if !zero {
			return fmt.Errorf("%s: values without a source", fact)
		}
		return nil
	case s == Undocumented:
		if !zero {
			return fmt.Errorf("%s: undocumented but has values", fact)
		}
		return nil
	case !strings.HasPrefix(string(s), "https://"):
		return fmt.Errorf("%s: source %q is not an https URL", fact, s)
	}
	return nil
}

// validate checks that each fact is consistent with its Source.
func (d Delivery) validate() error {
	r := d.Retry
	return errors.Join(
		checkSource("retry", r.Source, !r.Retries && r.For == 0 && r.Attempts == 0 && r.Note == ""),
		checkSource("max body", d.MaxBody.Source, d.MaxBody.Bytes == 0 && d.MaxBody.Body == 0 && d.MaxBody.Note == ""),
		checkSource("timeout", d.Timeout.Source, d.Timeout.Duration == 0 && d.Timeout.Note == ""),
		checkSource("answer", d.Answer.Source, d.Answer.Status == 0 && d.Answer.Body == "" && d.Answer.Note == ""),
		checkSource("refusal", d.Refusal.Source, d.Refusal.Status == 0 && d.Refusal.Note == ""),
		func() error {
			if d.Refusal.Status != 0 && (d.Refusal.Status < 400 || d.Refusal.Status > 499) {
				return fmt.Errorf("refusal: status %d is not 4xx", d.Refusal.Status)
			}
			if d.Answer.Status != 0 && (d.Answer.Status < 200 || d.Answer.Status > 299) {
				return fmt.Errorf("answer: status %d is not 2xx", d.Answer.Status)
			}
			return nil
		}(),
	)
}

// Researched reports whether every fact has a Source (a document or
// Undocumented).
func (d Delivery) Researched() bool {
	return d.Retry.Source != "" && d.MaxBody.Source != "" && d.Timeout.Source != "" &&
		d.Answer.Source != "" && d.Refusal.Source != ""
}

// ReplayGuard says what stops a captured delivery from being accepted
// again under this preset's defaults, as the gateway enforces it: a signed
// timestamp within the tolerance (and, where the signature does not cover
// the event data, its single-use token spent once: SingleUse), else a
// replay record the gateway keeps for replay_window (400 days by default),
// longer than the event's row: the body's hash under dedupe_body, else the
// hash of the event ID and the body. The source is the preset's Doc.
func (p Preset) ReplayGuard() string {
	const window = " kept for `replay_window` (400 days)"
	switch {
	case p.DefaultTolerance > 0 && p.SingleUse != "":
		return "signed timestamp (±" + shortDuration(p.DefaultTolerance) + "); its token (`" +
			strings.TrimPrefix(p.SingleUse, "json ") + "`) refused with other event data for " + shortDuration(2*p.DefaultTolerance+time.Minute)
	case p.DefaultTolerance > 0:
		return "signed timestamp (±" + shortDuration(p.DefaultTolerance) + ")"
	case p.DedupeBody:
		return "body hash" + window
	case p.Batch != nil && len(p.EventID) == 0:
		return "item IDs and body hash" + window
	case len(p.EventID) > 0:
		return "event ID and body hash" + window
	}
	return "configured event ID and body hash" + window
}

// deliveryRefuseStatus reconciles Preset.RefuseStatus with a documented
// Refusal.Status: the documented one wins, a conflicting one is a
// programming error.
func deliveryRefuseStatus(p Preset) (int, error) {
	doc := p.Delivery.Refusal.Status
	switch {
	case doc == 0 && p.RefuseStatus == 0:
		return http.StatusBadRequest, nil
	case doc == 0:
		return p.RefuseStatus, nil
	case p.RefuseStatus != 0 && p.RefuseStatus != doc:
		return 0, fmt.Errorf("RefuseStatus %d differs from the documented refusal %d", p.RefuseStatus, doc)
	}
	return doc, nil
}
