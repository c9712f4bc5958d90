package signature

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
)

// BatchPolicy is how a delivery carrying several events is deduplicated.
type BatchPolicy string

// Values of Batch.Policy (a route may override the preset's).
const (
	// BatchSet keys the delivery on the set of its items' IDs (SetKey): a
	// retry with exactly the same items is a duplicate; a re-batched retry
	// holding one new item is a new key and is forwarded whole, so the
	// upstream sees the other items twice and must tolerate that (the
	// signature still covers the whole body it checks).
	BatchSet BatchPolicy = "set"
	// BatchSplit forwards each not-yet-seen item as its own request (Split)
	// under its own claim. The forwarded bodies are no longer the signed
	// bytes: only for upstreams that do not verify the signature themselves.
	BatchSplit BatchPolicy = "split"
)

// Batch describes a provider whose deliveries carry an array of events, each
// with its own ID (SendGrid, GoCardless, Okta, HubSpot, ...).
type Batch struct {
	// Items is the plain json path (eventid's syntax) of the events array;
	// "@this" when the body itself is the array.
	Items string
	// ItemID is the plain json path of an event's ID inside one item: an
	// event_id json source, read with its rules.
	ItemID string
	// ItemIDParts are further plain json paths whose values join ItemID's
	// in a composite ID (eventid's JSON-array encoding), for providers
	// whose item is named by several fields (Adyen: pspReference,
	// eventCode, success). Empty: ItemID alone.
	ItemIDParts []string
	// Policy is the preset's default policy.
	Policy BatchPolicy
	// ItemsSigned: each item carries its own signature (Adyen's HMAC per
	// notification item), so items of captured deliveries combine into a
	// new delivery that verifies. Only BatchSplit, which claims each item,
	// keeps such a combination from running an item twice.
	ItemsSigned bool

	// items and itemID are the parsed paths (validate; built on use for a
	// Batch that was not registered).
	items  *eventid.Path
	itemID *eventid.Extractor
}

// Errors of Batch.Split.
var (
	// ErrEmptyBatch: the items array is empty (Asana's heartbeat); nothing
	// to claim.
	ErrEmptyBatch = errors.New("batch has no items")
	// ErrBadBatch: the body has no items array, or an item has no string
	// or number ID.
	ErrBadBatch = errors.New("batch items or their ids missing")
)

// BatchItem is one event of a batch: its ID and the body that forwards it
// alone (the delivery with its items array reduced to this item).
type BatchItem struct {
	ID   string
	Body []byte
	// Raw is the item itself, the element of the items array.
	Raw []byte
}

func (b *Batch) validate() error {
	if b.Items == "" || b.ItemID == "" {
		return errors.New("batch needs Items and ItemID paths")
	}
	if b.Policy != BatchSet && b.Policy != BatchSplit {
		return fmt.Errorf("unknown batch policy %q", b.Policy)
	}
	items, id, err := b.paths()
	if err != nil {
		return err
	}
	b.items, b.itemID = items, id
	return nil
}

// paths parses Items (nil for "@this") and ItemID.
func (b Batch) paths() (*eventid.Path, *eventid.Extractor, error) {
	if b.itemID != nil {
		return b.items, b.itemID, nil
	}
	var items *eventid.Path
	if b.Items != "@this" {
		p, err := eventid.ParsePath(b.Items)
		if err != nil {
			return nil, nil, fmt.Errorf("batch Items: %w", err)
		}
		items = &p
	}
	parts := [][]eventid.Source{{{Kind: eventid.JSON, Name: b.ItemID}}}
	for _, p := range b.ItemIDParts {
		parts = append(parts, []eventid.Source{{Kind: eventid.JSON, Name: p}})
	}
	id, err := eventid.New(parts)
	if err != nil {
		return nil, nil, fmt.Errorf("batch ItemID: %w", err)
	}
	id.AssumeValidJSON() // each item is part of a body checked whole
	return items, id, nil
}

// array returns the items array Items selects in body (valid JSON),
// gjson.Result{} when there is none, or ErrAmbiguous (wrapped) when a
// member on its path is given twice.
func (b Batch) array(body []byte, items *eventid.Path) (gjson.Result, error) {
	if items == nil {
		return gjson.ParseBytes(body), nil
	}
	arr, err := items.Lookup(body)
	if err != nil {
		return gjson.Result{}, fmt.Errorf("batch items %s: %w", b.Items, err)
	}
	return arr, nil
}

// Present reports whether body carries the items array, or names it
// ambiguously (Split then refuses it): whether a delivery is keyed as a
// batch when the preset has an event ID of its own too.
func (b Batch) Present(body []byte) bool {
	body = eventid.JSONText(body)
	items, _, err := b.paths()
	if err != nil || !gjson.ValidBytes(body) {
		return false
	}
	arr, err := b.array(body, items)
	return err != nil || arr.IsArray()
}

// Split returns the items of a JSON batch body, in order, duplicates
// within the body kept once (the first). The items array and each item's
// ID are read as an event_id json source is: a member name given twice in
// an object on either path (after unescaping, or ignoring case) is
// eventid.ErrAmbiguous, and an ID must be one string or number of 1 to
// 255 bytes of text. Errors: ErrEmptyBatch, eventid.ErrAmbiguous, and
// ErrBadBatch (also wrapping the eventid error of a bad item ID), wrapped
// with the item's position, never its content.
func (b Batch) Split(body []byte) ([]BatchItem, error) {
	items, _, err := b.SplitChecked(body, nil)
	return items, err
}

// SplitChecked is Split for a provider that signs each item (ItemVerifier):
// check is called with each item's Raw before its ID is read, and an item
// it refuses is left out (before duplicates within the body are removed,
// so a forged copy cannot displace an authentic item with its ID). It
// returns the accepted items and how many were refused; a nil check
// accepts every item.
func (b Batch) SplitChecked(body []byte, check func(raw []byte) error) ([]BatchItem, int, error) {
	body = eventid.JSONText(body)
	if !gjson.ValidBytes(body) {
		return nil, 0, fmt.Errorf("body is not JSON: %w", ErrBadBatch)
	}
	itemsPath, itemID, err := b.paths()
	if err != nil {
		return nil, 0, err
	}
	arr, err := b.array(body, itemsPath)
	if err != nil {
		return nil, 0, err
	}
	if !arr.IsArray() {
		return nil, 0, fmt.Errorf("%s is not an array: %w", b.Items, ErrBadBatch)
	}
	elems := arr.Array()
	if len(elems) == 0 {
		return nil, 0, ErrEmptyBatch
	}
	// The array's position in the body, to rebuild one-item bodies.
	var start, end int
	if b.Items != "@this" {
		if arr.Index <= 0 {
			return nil, 0, fmt.Errorf("%s cannot be located in the body: %w", b.Items, ErrBadBatch)
		}
		start, end = arr.Index, arr.Index+len(arr.Raw)
	} else {
		start = strings.Index(string(body), arr.Raw)
		end = start + len(arr.Raw)
	}
	items := make([]BatchItem, 0, len(elems))
	seen := make(map[string]bool, len(elems))
	refused := 0
	for i, e := range elems {
		if check != nil && check([]byte(e.Raw)) != nil {
			refused++
			continue
		}
		v, err := itemID.Extract([]byte(e.Raw), nil)
		switch {
		case errors.Is(err, eventid.ErrAmbiguous):
			return nil, 0, fmt.Errorf("item %d: %w", i+1, err)
		case err != nil:
			return nil, 0, fmt.Errorf("item %d: %w: %w", i+1, err, ErrBadBatch)
		}
		if seen[v] {
			continue
		}
		seen[v] = true
		one := make([]byte, 0, start+len(e.Raw)+2+len(body)-end)
		one = append(one, body[:start]...)
		one = append(one, '[')
		one = append(one, e.Raw...)
		one = append(one, ']')
		one = append(one, body[end:]...)
		items = append(items, BatchItem{ID: v, Body: one, Raw: []byte(e.Raw)})
	}
	return items, refused, nil
}

// SetKey returns the event ID of a whole batch under BatchSet: "set:" and the
// hex SHA-256 of its distinct item IDs, sorted, as a JSON array, so the
// order of the items does not matter and the key fits the store's 255 bytes.
func SetKey(items []BatchItem) string {
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.ID
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	enc, _ := json.Marshal(ids) // unambiguous, unlike a separator an ID may hold
	sum := sha256.Sum256(enc)
	return "set:" + hex.EncodeToString(sum[:])
}
