package eventid

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
)

// A json source's path is a plain gjson path: member names separated by
// dots, a literal dot or special character escaped with a backslash
// (`a\.b`), and digits selecting an element when the value there is an
// array (`items.0.id`), as gjson reads them. Wildcards (* ?), # (array
// length, queries, all elements), @ modifiers, | pipes, [ ] { } multipaths
// and ! literals are refused when the source is configured: each can select
// another value than the one the upstream reads, or several values, and a
// JSON path must resolve to exactly one scalar.

// parseJSONPath splits a plain gjson path into its member names, unescaped.
func parseJSONPath(path string) ([]string, error) {
	if path == "" {
		return nil, errors.New("empty json path")
	}
	var names []string
	var cur strings.Builder
	for i := 0; i < len(path); i++ {
		c := path[i]
		switch c {
		case '\\':
			if i+1 == len(path) {
				return nil, fmt.Errorf("json path %q ends in a lone backslash", path)
			}
			i++
			cur.WriteByte(path[i])
		case '.':
			if cur.Len() == 0 {
				return nil, fmt.Errorf("json path %q has an empty member name", path)
			}
			names = append(names, cur.String())
			cur.Reset()
		case '*', '?', '#', '@', '|', '[', ']', '{', '}', '!':
			return nil, fmt.Errorf("json path %q: %q selects by pattern, query or modifier, so it may select another or several values; "+
				"use a plain path of member names and array indexes (escape a literal %q as \\%c)", path, c, c, c)
		default:
			cur.WriteByte(c)
		}
	}
	if cur.Len() == 0 {
		return nil, fmt.Errorf("json path %q has an empty member name", path)
	}
	return append(names, cur.String()), nil
}

// Path is a plain json path, parsed once (ParsePath), looked up with the
// rules of a json event-ID source: batch presets read their items array
// with it.
type Path struct{ names []string }

// ParsePath parses a plain gjson path as a json source takes it: member
// names separated by dots and array indexes; wildcards, queries and
// modifiers are refused.
func ParsePath(path string) (Path, error) {
	names, err := parseJSONPath(path)
	return Path{names: names}, err
}

// Lookup returns the one value p selects in body (valid JSON), a zero
// Result when it selects nothing, or ErrAmbiguous (wrapped) when a member
// name on the path is given twice in its object (see lookupJSON). The
// result shares body's memory.
func (p Path) Lookup(body []byte) (gjson.Result, error) {
	return lookupJSON(JSONText(body), p.names)
}

// lookupJSON walks the parsed path over body and returns the one value it
// selects. Along the path, every object must hold the next member name
// exactly once: a name repeated in the same object, also when the two
// spellings are equal only after unescaping ("id" and "i\u0064") or only
// ignoring case ("id" and "ID", which Go's encoding/json decodes into the
// same struct field), is ErrAmbiguous, because parsers disagree on which
// one counts (gjson reads the first, encoding/json, Python and JavaScript
// the last). Repeated names elsewhere in the document do not change which
// event this is and are left alone. A missing member, or an index into
// something other than an array, is a zero Result. The returned strings
// share body's memory: callers copy what they keep.
func lookupJSON(body []byte, names []string) (gjson.Result, error) {
	if len(body) == 0 {
		return gjson.Result{}, nil
	}
	// gjson.GetBytes converts the same way; no copy of the body.
	cur := gjson.Parse(unsafe.String(unsafe.SliceData(body), len(body))) //nolint:gosec // audited: body is not written while the result is used; callers copy what they keep
	for depth, name := range names {
		switch {
		case cur.IsObject():
			var found gjson.Result
			exact, folded := 0, 0
			cur.ForEach(func(k, v gjson.Result) bool {
				switch {
				case k.Str == name:
					exact++
					found = v
				case strings.EqualFold(k.Str, name):
					folded++
				}
				return true
			})
			if exact+folded > 1 && exact > 0 {
				return gjson.Result{}, fmt.Errorf("member %q of %s is given %d times: %w",
					name, pathName(names[:depth]), exact+folded, ErrAmbiguous)
			}
			if exact == 0 {
				return gjson.Result{}, nil
			}
			cur = found
		case cur.IsArray():
			i, err := strconv.Atoi(name)
			if err != nil || i < 0 || name != strconv.Itoa(i) {
				return gjson.Result{}, nil
			}
			var found gjson.Result
			n := 0
			cur.ForEach(func(_, v gjson.Result) bool {
				if n == i {
					found = v
					return false
				}
				n++
				return true
			})
			if !found.Exists() {
				return gjson.Result{}, nil
			}
			cur = found
		default:
			return gjson.Result{}, nil
		}
	}
	return cur, nil
}

// pathName names the object a member was looked up in, for errors.
func pathName(names []string) string {
	if len(names) == 0 {
		return "the document"
	}
	return strconv.Quote(strings.Join(names, "."))
}
