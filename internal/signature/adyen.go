package signature

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
)

// Adyen's standard (payments) webhooks carry an HMAC inside each
// notification item rather than over the body: additionalData.hmacSignature
// is the base64 HMAC-SHA256, keyed with the hex-decoded HMAC key from the
// Customer Area, of the item's fields
//
//	pspReference:originalReference:merchantAccountCode:merchantReference:amount.value:amount.currency:eventCode:success
//
// (absent fields as empty text, numbers as JavaScript writes them), as
// https://docs.adyen.com/development-resources/webhooks/secure-webhooks/verify-hmac-signatures
// documents and @adyen/api-library's HmacValidator.validateHMAC computes.
// The body, the live flag and every other field are not signed; Basic
// authentication, which Adyen sends when a user name and password are set
// on the webhook, covers the whole delivery.
//
// Secrets: HMAC keys in hex, and optionally "basic:<user>:<password>"
// credentials; when any are configured every delivery must carry one of
// them (Authorization: Basic), else none is asked for. At least one HMAC key
// is required: Basic authentication alone does not protect an item's
// amount.
//
// Each item is an event: the preset batches on the item's pspReference,
// eventCode and success (a payment's AUTHORISATION that failed and one that
// succeeded are two events) and splits by default, so an item whose HMAC
// fails is refused alone (ItemVerifier) while the others are forwarded,
// each as a one-item delivery that still carries its own hmacSignature for
// an upstream that verifies it. Adyen counts a delivery as accepted on a
// 2xx; the gateway answers "[accepted]", the body older Adyen integrations
// required, only when every item is accepted (forwarded and completed, or a
// duplicate), otherwise Adyen keeps the whole delivery in its retry queue
// and resends it: the completed items are then duplicates and only the rest
// is forwarded (see Delivery).
func init() {
	register(Preset{ //nolint:gosec // G101: SecretFormat describes a secret, holds none
		Name:              "adyen",
		SecretFormat:      "HMAC keys in hex, plus optional `basic:<user>:<password>` Basic credentials (then required on every delivery)",
		Doc:               "https://docs.adyen.com/development-resources/webhooks/secure-webhooks/verify-hmac-signatures",
		SignatureHeader:   "additionalData.hmacSignature in each notification item (optional Authorization: Basic)",
		Oracle:            "@adyen/api-library",
		CredentialHeaders: []string{"Authorization"}, // Basic credentials, when configured
		Batch: &Batch{
			Items:       "notificationItems",
			ItemID:      "NotificationRequestItem.pspReference",
			ItemIDParts: []string{"NotificationRequestItem.eventCode", "NotificationRequestItem.success"},
			Policy:      BatchSplit,
			ItemsSigned: true,
		},
		Delivery: Delivery{
			Retry: Retry{
				Retries: true, For: 30 * 24 * time.Hour,
				Note:   "3 retries within 30 s, then a retry queue per endpoint (2 min, 5 min, … 8 h apart) for up to 30 days; the queue waits for the failing webhook",
				Source: "https://docs.adyen.com/development-resources/webhooks/troubleshoot",
			},
			Answer: Answer{
				Body:   "[accepted]",
				Note:   "a 2xx such as 200 or 202 accepts; the gateway also sends the [accepted] body older integrations required",
				Source: "https://docs.adyen.com/development-resources/webhooks/handle-webhook-events",
			},
			MaxBody: MaxBody{Source: Undocumented},
			Timeout: Timeout{
				Duration: 10 * time.Second,
				Note:     "a slower answer queues every webhook of the endpoint",
				Source:   "https://help.adyen.com/knowledge/ecommerce-integrations/webhooks/how-do-i-set-up-webhooks",
			},
			Refusal: Refusal{
				Note:   "any non-2xx is a failure: the webhook goes to the endpoint's retry queue, which holds the webhooks behind it",
				Source: "https://docs.adyen.com/development-resources/webhooks/troubleshoot",
			},
		},
		Scheme: Scheme{
			Signed:    "pspReference:originalReference:merchantAccountCode:merchantReference:value:currency:eventCode:success of each item",
			Algorithm: "sha256",
			Encoding:  "base64",
		},
		build:  buildAdyen,
		covers: adyenCovers,
	})
}

// adyenCovers is Preset.Covered of Adyen: each item's signed fields, one
// line per item, not the JSON around them (the live flag, additionalData,
// spacing). The item's event ID is among those fields, so no two events
// share it.
func adyenCovers(body []byte, _ http.Header) []byte {
	items := gjson.GetBytes(body, "notificationItems")
	if !items.IsArray() {
		return body
	}
	out := []byte("adyen:")
	for _, it := range items.Array() {
		signed, err := adyenSigned([]byte(it.Get("NotificationRequestItem").Raw))
		if err != nil {
			return body
		}
		out = append(append(out, signed...), '\n')
	}
	return out
}

// ItemVerifier is a Verifier whose provider signs each item of a batch
// (Adyen). Verify accepts a delivery only when every item verifies, so a
// delivery forwarded whole never carries a forged item; a delivery split
// into its items (batch split) is checked with VerifyDelivery and then
// each item with VerifyItem, so one forged item is refused alone.
type ItemVerifier interface {
	Verifier
	// VerifyDelivery checks what covers the whole delivery (Adyen's Basic
	// authentication, the body's shape), not the items.
	VerifyDelivery(body []byte, h http.Header) error
	// VerifyItem checks one item: raw is an element of the preset's
	// Batch.Items array (BatchItem.Raw).
	VerifyItem(raw []byte) error
}

type adyen struct {
	keys  [][]byte
	basic [][]byte // SHA-256 of each accepted Authorization header value
	auth  string   // the first credential's header value, for sign
}

// adyenFields are the item members Adyen signs, in order.
var adyenFields = func() []eventid.Path {
	names := []string{"pspReference", "originalReference", "merchantAccountCode", "merchantReference",
		"amount.value", "amount.currency", "eventCode", "success"}
	paths := make([]eventid.Path, len(names))
	for i, n := range names {
		p, err := eventid.ParsePath(n)
		if err != nil {
			panic(err)
		}
		paths[i] = p
	}
	return paths
}()

func buildAdyen(_ Preset, o Options) (signer, error) {
	a := &adyen{}
	for i, s := range o.Secrets {
		if cred, ok := strings.CutPrefix(s, "basic:"); ok {
			if !strings.Contains(cred, ":") {
				return nil, fmt.Errorf("secret %d: write Basic credentials as basic:<user>:<password>", i+1)
			}
			v := "Basic " + base64.StdEncoding.EncodeToString([]byte(cred))
			d := sha256.Sum256([]byte(v))
			a.basic = append(a.basic, d[:])
			if a.auth == "" {
				a.auth = v
			}
			continue
		}
		k, err := hex.DecodeString(s)
		if err != nil || len(k) == 0 {
			return nil, fmt.Errorf("secret %d: an Adyen HMAC key is hex (or basic:<user>:<password> for Basic authentication)", i+1)
		}
		a.keys = append(a.keys, k)
	}
	if len(a.keys) == 0 {
		return nil, errors.New("an HMAC key is required: Basic authentication alone does not protect an item's fields")
	}
	return a, nil
}

func (a *adyen) Verify(body []byte, h http.Header) error {
	body = eventid.JSONText(body)
	if err := a.VerifyDelivery(body, h); err != nil {
		return err
	}
	for i, it := range gjson.GetBytes(body, "notificationItems").Array() {
		if err := a.VerifyItem([]byte(it.Raw)); err != nil {
			return fmt.Errorf("notification item %d: %w", i+1, err)
		}
	}
	return nil
}

func (a *adyen) VerifyDelivery(body []byte, h http.Header) error {
	body = eventid.JSONText(body)
	if len(a.basic) > 0 {
		v, err := oneValue(h, "Authorization")
		if err != nil {
			return err
		}
		d := sha256.Sum256([]byte(v))
		ok := 0
		for _, want := range a.basic {
			ok |= subtle.ConstantTimeCompare(d[:], want)
		}
		if ok == 0 {
			return fmt.Errorf("header Authorization matches none of %d Basic credential(s): %w", len(a.basic), ErrNoMatchingSignature)
		}
	}
	if !isJSONObject(body) {
		return fmt.Errorf("body is not a JSON object with notificationItems: %w", ErrMissingHeader)
	}
	items, err := lookupOnce(body, "notificationItems")
	if err != nil {
		return err
	}
	if !items.IsArray() || len(items.Array()) == 0 {
		return fmt.Errorf("body has no notificationItems: %w", ErrMissingHeader)
	}
	return nil
}

func (a *adyen) VerifyItem(raw []byte) error {
	item, err := lookupOnce(raw, "NotificationRequestItem")
	if err != nil {
		return err
	}
	if !item.IsObject() {
		return fmt.Errorf("no NotificationRequestItem: %w", ErrMissingHeader)
	}
	sigField, err := lookupOnce([]byte(item.Raw), "additionalData.hmacSignature")
	if err != nil {
		return err
	}
	if !sigField.Exists() {
		return fmt.Errorf("no additionalData.hmacSignature: %w", ErrMissingHeader)
	}
	if sigField.Type != gjson.String {
		return fmt.Errorf("additionalData.hmacSignature is not a string: %w", ErrMalformedHeader)
	}
	sig, err := base64.StdEncoding.DecodeString(sigField.Str)
	if err != nil || len(sig) != sha256.Size {
		return fmt.Errorf("additionalData.hmacSignature is not a base64 SHA-256 digest: %w", ErrMalformedHeader)
	}
	signed, err := adyenSigned([]byte(item.Raw))
	if err != nil {
		return err
	}
	for _, k := range a.keys {
		m := hmac.New(sha256.New, k)
		m.Write(signed)
		if hmac.Equal(m.Sum(nil), sig) {
			return nil
		}
	}
	return fmt.Errorf("hmacSignature matches none of %d key(s): %w", len(a.keys), ErrNoMatchingSignature)
}

// adyenSigned returns the text Adyen signs for one NotificationRequestItem.
// A member named twice on a signed path is refused (JavaScript's JSON.parse
// keeps the last, gjson the first), and so is an item without amount
// (@adyen/api-library fails on it).
func adyenSigned(item []byte) ([]byte, error) {
	if amount, err := lookupOnce(item, "amount"); err != nil {
		return nil, err
	} else if !amount.IsObject() {
		return nil, fmt.Errorf("item has no amount object: %w", ErrMalformedHeader)
	}
	var b []byte
	for i, p := range adyenFields {
		v, err := p.Lookup(item)
		if err != nil {
			return nil, fmt.Errorf("item field: %w: %w", err, ErrMalformedHeader)
		}
		s, ok := jsText(v)
		if !ok {
			return nil, fmt.Errorf("a signed item field is an object or array: %w", ErrMalformedHeader)
		}
		if i > 0 {
			b = append(b, ':')
		}
		b = append(b, s...)
	}
	return b, nil
}

// lookupOnce reads a plain json path whose members must each be given once.
func lookupOnce(body []byte, path string) (gjson.Result, error) {
	p, err := eventid.ParsePath(path)
	if err != nil {
		return gjson.Result{}, err
	}
	v, err := p.Lookup(body)
	if err != nil {
		return gjson.Result{}, fmt.Errorf("%s: %w: %w", path, err, ErrMalformedHeader)
	}
	return v, nil
}

// jsText is how JavaScript's Array.prototype.join writes a JSON value:
// strings as they are, numbers as Number.prototype.toString, booleans as
// true/false, null and absent values as "". Objects and arrays: false.
func jsText(v gjson.Result) (string, bool) {
	switch {
	case !v.Exists():
		return "", true
	case v.IsObject() || v.IsArray():
		return "", false
	}
	switch v.Type {
	case gjson.String:
		return v.Str, true
	case gjson.Number:
		f := v.Num
		switch {
		case f == 0:
			return "0", true // also -0
		case math.Abs(f) >= 1e21 || math.Abs(f) < 1e-6:
			// JavaScript writes the exponent without leading zeros: 1e-7,
			// 1.5e+21 (Go: 1e-07).
			m, e, _ := strings.Cut(strconv.FormatFloat(f, 'e', -1, 64), "e")
			sign, digits := e[:1], strings.TrimLeft(e[1:], "0")
			return m + "e" + sign + digits, true
		}
		return strconv.FormatFloat(f, 'f', -1, 64), true
	case gjson.True:
		return "true", true
	case gjson.False:
		return "false", true
	}
	return "", true // null
}

// signBody writes additionalData.hmacSignature into every item, signed
// with the first HMAC key.
func (a *adyen) signBody(body []byte, _ time.Time) ([]byte, error) {
	items := gjson.GetBytes(body, "notificationItems")
	if !items.IsArray() {
		return nil, errors.New("body has no notificationItems array")
	}
	out := body
	for i, it := range items.Array() {
		signed, err := adyenSigned([]byte(it.Get("NotificationRequestItem").Raw))
		if err != nil {
			return nil, fmt.Errorf("item %d: %w", i+1, err)
		}
		m := hmac.New(sha256.New, a.keys[0])
		m.Write(signed)
		path := "notificationItems." + strconv.Itoa(i) + ".NotificationRequestItem.additionalData.hmacSignature"
		if out, err = sjson.SetBytes(out, path, base64.StdEncoding.EncodeToString(m.Sum(nil))); err != nil {
			return nil, fmt.Errorf("writing hmacSignature: %w", err)
		}
	}
	return out, nil
}

// signHeaders sets the first Basic credentials when any are configured.
func (a *adyen) signHeaders(h http.Header) error {
	if a.auth != "" {
		h.Set("Authorization", a.auth)
	}
	return nil
}

func (a *adyen) sign([]byte, http.Header, time.Time) error {
	return errors.New("adyen signs inside each notification item: use SignDelivery")
}
