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
	// Items is the gjson path of the events array; "@this" when the body
	// itself is the array.
	Items string
	// ItemID is the gjson path of an event's ID inside one item.
	ItemID string
	// Policy is the preset's default policy.
	Policy BatchPolicy
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
}

func (b *Batch) validate() error {
	if b.Items == "" || b.ItemID == "" {
		return errors.New("batch needs Items and ItemID paths")
	}
	if b.Policy != BatchSet && b.Policy != BatchSplit {
		return fmt.Errorf("unknown batch policy %q", b.Policy)
	}
	return nil
}

// Split returns the items of a JSON batch body, in order, duplicates
// within the body kept once (the first). Errors: ErrEmptyBatch,
// ErrBadBatch (wrapped with the item's position, never its content).
func (b Batch) Split(body []byte) ([]BatchItem, error) {
	if !gjson.ValidBytes(body) {
		return nil, fmt.Errorf("body is not JSON: %w", ErrBadBatch)
	}
	arr := gjson.GetBytes(body, b.Items)
	if !arr.IsArray() {
		return nil, fmt.Errorf("%s is not an array: %w", b.Items, ErrBadBatch)
	}
	elems := arr.Array()
	if len(elems) == 0 {
		return nil, ErrEmptyBatch
	}
	// The array's position in the body, to rebuild one-item bodies.
	var start, end int
	if b.Items != "@this" {
		if arr.Index <= 0 {
			return nil, fmt.Errorf("%s cannot be located in the body: %w", b.Items, ErrBadBatch)
		}
		start, end = arr.Index, arr.Index+len(arr.Raw)
	} else {
		start = strings.Index(string(body), arr.Raw)
		end = start + len(arr.Raw)
	}
	items := make([]BatchItem, 0, len(elems))
	seen := make(map[string]bool, len(elems))
	for i, e := range elems {
		id := e.Get(b.ItemID)
		var v string
		switch id.Type {
		case gjson.String:
			v = id.Str
		case gjson.Number:
			v = id.Raw
		}
		if v == "" {
			return nil, fmt.Errorf("item %d has no %s: %w", i+1, b.ItemID, ErrBadBatch)
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
		items = append(items, BatchItem{ID: v, Body: one})
	}
	return items, nil
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
