package signature

import (
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
)

// topMember returns the one member of body's top-level JSON object named
// name. A second member of that name (after unescaping, or ignoring case,
// as encoding/json matches struct fields) makes ok false: parsers disagree
// on which one counts (gjson reads the first, encoding/json, Python and
// JavaScript the last), so a handshake test on such a body would let the
// gateway answer a delivery at the edge as a handshake while the upstream
// reads it as an event (Challenge.BodyField walks its path with it).
// eventid applies the same rule to event-ID paths.
func topMember(body []byte, name string) (v gjson.Result, ok bool) {
	if !isJSONObject(body) {
		return gjson.Result{}, false
	}
	body = eventid.JSONText(body)
	n := 0
	// No copy of the body (as gjson.GetBytes); nothing read is kept.
	doc := gjson.Parse(unsafe.String(unsafe.SliceData(body), len(body))) //nolint:gosec // audited: nothing read is kept
	doc.ForEach(func(k, val gjson.Result) bool {
		if strings.EqualFold(k.Str, name) {
			n++
			v = val
		}
		return n < 2
	})
	return v, n == 1 && v.Exists()
}
