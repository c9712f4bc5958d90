package eventid

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
)

// The gateway and the upstream's JSON parser must never disagree on which
// event a delivery is: a member name given twice on the ID's path is
// refused, whatever its spelling (issue 10, item 5).
func TestExtractAmbiguousJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, path, body string
		want             string // "" = ErrAmbiguous
		wantErr          error
	}{
		{name: "issue input", path: "id", body: `{"id":"evt_A","type":"x","id":"evt_B"}`},
		{name: "same value twice", path: "id", body: `{"id":"evt_A","id":"evt_A"}`},
		{name: "equal after unescaping", path: "id", body: `{"i\u0064":"evt_A","id":"evt_B"}`},
		{name: "both escaped", path: "id", body: `{"\u0069\u0064":"evt_A","i\u0064":"evt_B"}`},
		{name: "escaped second", path: "id", body: `{"id":"evt_A","\u0069d":"evt_B"}`},
		{name: "equal ignoring case", path: "id", body: `{"id":"evt_A","ID":"evt_B"}`},
		{name: "equal ignoring case, Kelvin sign", path: "kind", body: `{"kind":"a","\u212aind":"b"}`},
		{name: "only another case is missing", path: "id", body: `{"ID":"evt_A"}`, wantErr: ErrMissing},
		{name: "nested: first level twice", path: "data.object.id", body: `{"data":{"object":{"id":"pi_A"}},"data":{"object":{"id":"pi_B"}}}`},
		{name: "nested: first level twice, one without the id", path: "data.object.id", body: `{"data":{"x":1},"data":{"object":{"id":"pi_B"}}}`},
		{name: "nested: middle level twice", path: "data.object.id", body: `{"data":{"object":{"id":"pi_A"},"object":{"id":"pi_B"}}}`},
		{name: "nested: last level twice", path: "data.object.id", body: `{"data":{"object":{"id":"pi_A","id":"pi_B"}}}`},
		{name: "nested: escaped parent", path: "data.object.id", body: `{"d\u0061ta":{"object":{"id":"pi_A"}},"data":{"object":{"id":"pi_B"}}}`},
		{name: "array on the path: item's id twice", path: "items.0.id", body: `{"items":[{"id":"a","id":"b"}]}`},
		{name: "array on the path: array twice", path: "items.0.id", body: `{"items":[{"id":"a"}],"items":[{"id":"b"}]}`},
		{name: "escaped dot in the path", path: `a\.b`, body: `{"a.b":"x","a\u002eb":"y"}`},
		{name: "composite part", path: "event_ts", body: `{"event_ts":"1","event_ts":"2"}`},

		// Repeated names off the path do not change which event this is.
		{name: "off path: another member twice", path: "id", body: `{"id":"evt_A","type":"x","type":"y"}`, want: "evt_A"},
		{name: "off path: same name deeper", path: "id", body: `{"id":"evt_A","data":{"id":"x","id":"y"}}`, want: "evt_A"},
		{name: "off path: sibling object twice", path: "data.object.id", body: `{"data":{"object":{"id":"pi_A"},"prev":{},"prev":{}},"x":1,"x":2}`, want: "pi_A"},
		{name: "off path: other array item", path: "items.1.id", body: `{"items":[{"id":"a","id":"b"},{"id":"c"}]}`, want: "c"},
		{name: "array index", path: "items.1.id", body: `{"items":[{"id":"a"},{"id":"b"}]}`, want: "b"},
		{name: "index past the end", path: "items.2.id", body: `{"items":[{"id":"a"},{"id":"b"}]}`, wantErr: ErrMissing},
		{name: "digits name an object's member", path: "items.0.id", body: `{"items":{"0":{"id":"x"}}}`, want: "x"},
		{name: "escaped dot", path: `a\.b`, body: `{"a.b":"x","a":{"b":"y"}}`, want: "x"},
		{name: "escaped key matches", path: "id", body: `{"i\u0064":"evt_A"}`, want: "evt_A"},
		{name: "a scalar on the path", path: "data.id", body: `{"data":"x"}`, wantErr: ErrMissing},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, valid := range []bool{false, true} {
				e := mustNew(t, []Source{{JSON, tc.path}})
				if valid {
					e.AssumeValidJSON()
				}
				got, err := e.Extract([]byte(tc.body), http.Header{})
				switch {
				case tc.wantErr != nil:
					require.ErrorIs(t, err, tc.wantErr)
				case tc.want == "":
					require.ErrorIs(t, err, ErrAmbiguous)
					require.Empty(t, got)
				default:
					require.NoError(t, err)
					require.Equal(t, tc.want, got)
				}
			}
		})
	}
}

// Form fields and headers: the same kind of fault.
func TestExtractAmbiguousFormAndHeader(t *testing.T) {
	t.Parallel()
	form := []Source{{Form, "trigger_id"}}
	header := []Source{{Header, "X-Event-Id"}}
	tests := []struct {
		name    string
		parts   []Source
		body    string
		header  http.Header
		want    string
		wantErr error
	}{
		{name: "form field twice", parts: form, body: "trigger_id=a&text=x&trigger_id=b", wantErr: ErrAmbiguous},
		{name: "form field twice, same value", parts: form, body: "trigger_id=a&trigger_id=a", wantErr: ErrAmbiguous},
		{name: "form field spelled twice", parts: form, body: "trigger_id=a&trigger%5Fid=b", wantErr: ErrAmbiguous},
		{name: "form field once, another twice", parts: form, body: "trigger_id=a&text=x&text=y", want: "a"},
		{name: "header, different values", parts: header, header: http.Header{"X-Event-Id": {"e1", "e2"}}, wantErr: ErrAmbiguous},
		{name: "header, different values under two spellings", parts: header,
			header: http.Header{"X-Event-Id": {"e1"}, "x-event-id": {"e2"}}, wantErr: ErrAmbiguous},
		{name: "header, the same value twice", parts: header, header: http.Header{"X-Event-Id": {"e1", " e1"}}, want: "e1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := tc.header
			if h == nil {
				h = http.Header{}
			}
			got, err := mustNew(t, tc.parts).Extract([]byte(tc.body), h)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// Paths that select by pattern, query or modifier may select another value
// than the upstream reads, or several: refused when configured.
func TestJSONPathPlainOnly(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"items.#.id", "items.#", `items.#(type=="x").id`, "*.id", "i?", "id|@reverse", "@this",
		"[id,type]", "{id}", "!true", "a..b", ".a", "a.", `a\`} {
		_, err := ParseSource("json", p)
		require.Error(t, err, p)
		_, err = New([][]Source{{{JSON, p}}})
		require.Error(t, err, p)
	}
	for _, p := range []string{"id", "data.object.id", "items.0.id", `a\.b`, `x\#y`, "event_id"} {
		_, err := ParseSource("json", p)
		require.NoError(t, err, p)
	}
}

// On every plain path and document the walk agrees with gjson whenever it
// finds one value: the gateway keys on what gjson reads.
func FuzzLookupAgreesWithGJSON(f *testing.F) {
	for _, s := range []string{`{"data":{"id":"a"}}`, `{"data":[{"id":1}]}`, `{"data":{"id":"a","id":"b"}}`,
		`{"d\u0061ta":{"id":"x"}}`, `{"data":{"0":{"id":2}}}`, `[{"data":{"id":"a"}}]`} {
		f.Add(s, "data.id")
		f.Add(s, "data.0.id")
	}
	f.Fuzz(func(t *testing.T, body, path string) {
		names, err := parseJSONPath(path)
		if err != nil || !gjson.Valid(body) {
			return
		}
		r, err := lookupJSON([]byte(body), names)
		if err != nil || !r.Exists() {
			return
		}
		want := gjson.Get(body, path)
		if want.Raw != r.Raw {
			t.Fatalf("path %q over %s: walk read %s, gjson %s", path, body, r.Raw, want.Raw)
		}
	})
}

// A Path (batch items arrays) is looked up with the rules of a json
// source: one value, a member name given twice refused.
func TestPathLookup(t *testing.T) {
	t.Parallel()
	p, err := ParsePath("data.events")
	require.NoError(t, err)
	v, err := p.Lookup([]byte(`{"data":{"events":[1,2]},"other":{}}`))
	require.NoError(t, err)
	require.True(t, v.IsArray())
	require.Equal(t, `[1,2]`, v.Raw)
	v, err = p.Lookup([]byte(`{"data":{}}`))
	require.NoError(t, err)
	require.False(t, v.Exists())
	for _, body := range []string{
		`{"data":{"events":[1]},"data":{"events":[2]}}`,
		`{"data":{"events":[1],"EVENTS":[2]}}`,
		`{"d\u0061ta":{"events":[1]},"data":{}}`,
	} {
		_, err := p.Lookup([]byte(body))
		require.ErrorIs(t, err, ErrAmbiguous, body)
	}
	_, err = ParsePath("@this")
	require.Error(t, err)
}
