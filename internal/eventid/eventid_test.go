package eventid

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func mustNew(t *testing.T, parts ...[]Source) *Extractor {
	t.Helper()
	e, err := New(parts)
	require.NoError(t, err)
	return e
}

func TestExtract(t *testing.T) {
	t.Parallel()
	jsonID := []Source{{JSON, "id"}}
	long255 := strings.Repeat("a", 255)
	tests := []struct {
		name    string
		parts   [][]Source
		body    string
		header  http.Header
		want    string
		wantErr error
	}{
		{name: "json string", parts: [][]Source{jsonID}, body: `{"id":"evt_1"}`, want: "evt_1"},
		{name: "json lone high surrogate", parts: [][]Source{jsonID}, body: `{"id":"evt_\ud801"}`, wantErr: ErrNotText},
		{name: "json lone low surrogate", parts: [][]Source{jsonID}, body: `{"id":"evt_\udfff"}`, wantErr: ErrNotText},
		{name: "json reversed pair", parts: [][]Source{jsonID}, body: `{"id":"evt_\udc00\ud800"}`, wantErr: ErrNotText},
		{name: "json surrogate pair", parts: [][]Source{jsonID}, body: `{"id":"evt_\ud83d\ude00"}`, want: "evt_😀"},
		{name: "json escaped backslash then u", parts: [][]Source{jsonID}, body: `{"id":"evt_\\ud801"}`, want: `evt_\ud801`},
		{name: "json literal replacement character", parts: [][]Source{jsonID}, body: `{"id":"evt_\ufffd"}`, want: "evt_\ufffd"},
		{name: "json string unescaped", parts: [][]Source{jsonID}, body: `{"id":"evt_\u00e9\"q"}`, want: "evt_é\"q"},
		{name: "json big number keeps its text", parts: [][]Source{jsonID}, body: `{"id":18446744073709551617}`, want: "18446744073709551617"},
		{name: "json nested path", parts: [][]Source{{{JSON, "data.object.id"}}}, body: `{"data":{"object":{"id":"pi_1"}}}`, want: "pi_1"},
		{name: "json 255 bytes", parts: [][]Source{jsonID}, body: `{"id":"` + long255 + `"}`, want: long255},
		{name: "json 256 bytes", parts: [][]Source{jsonID}, body: `{"id":"` + long255 + `a"}`, wantErr: ErrTooLong},
		{name: "json missing", parts: [][]Source{jsonID}, body: `{"type":"x"}`, wantErr: ErrMissing},
		{name: "json empty", parts: [][]Source{jsonID}, body: `{"id":""}`, wantErr: ErrEmpty},
		{name: "json null", parts: [][]Source{jsonID}, body: `{"id":null}`, wantErr: ErrNotScalar},
		{name: "json object", parts: [][]Source{jsonID}, body: `{"id":{"a":1}}`, wantErr: ErrNotScalar},
		{name: "json array", parts: [][]Source{jsonID}, body: `{"id":["a"]}`, wantErr: ErrNotScalar},
		{name: "json bool", parts: [][]Source{jsonID}, body: `{"id":true}`, wantErr: ErrNotScalar},
		{name: "not json", parts: [][]Source{jsonID}, body: `id=evt_1`, wantErr: ErrBadBody},
		{name: "header", parts: [][]Source{{{Header, "X-Event-Id"}}}, header: http.Header{"X-Event-Id": {"e1"}}, want: "e1"},
		{name: "header missing", parts: [][]Source{{{Header, "X-Event-Id"}}}, header: http.Header{}, wantErr: ErrMissing},
		{name: "header repeated", parts: [][]Source{{{Header, "X-Event-Id"}}}, header: http.Header{"X-Event-Id": {"e1", "e2"}}, wantErr: ErrAmbiguous},
		{
			name: "alternatives: first present wins", parts: [][]Source{{{Header, "X-Shopify-Event-Id"}, {Header, "X-Shopify-Webhook-Id"}}},
			header: http.Header{"X-Shopify-Webhook-Id": {"w1"}, "X-Shopify-Event-Id": {"e1"}}, want: "e1",
		},
		{
			name: "alternatives: fallback", parts: [][]Source{{{Header, "X-Shopify-Event-Id"}, {Header, "X-Shopify-Webhook-Id"}}},
			header: http.Header{"X-Shopify-Webhook-Id": {"w1"}}, want: "w1",
		},
		{name: "form field", parts: [][]Source{{{Form, "trigger_id"}}}, body: "team_id=T1&trigger_id=BR13.trigger.0001&text=%2Abold%2A", want: "BR13.trigger.0001"},
		{name: "form field missing", parts: [][]Source{{{Form, "trigger_id"}}}, body: "team_id=T1", wantErr: ErrMissing},
		{name: "form field repeated", parts: [][]Source{{{Form, "a"}}}, body: "a=1&a=2", wantErr: ErrAmbiguous},
		{
			name: "composite", parts: [][]Source{{{JSON, "order"}}, {{Header, "X-Topic"}}},
			body: `{"order":"o|1"}`, header: http.Header{"X-Topic": {"paid"}}, want: `["o|1","paid"]`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := tc.header
			if h == nil {
				h = http.Header{}
			}
			got, err := mustNew(t, tc.parts...).Extract([]byte(tc.body), h)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				require.Empty(t, got)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// Composite keys don't collide when a separator shows up inside a part.
func TestCompositeUnambiguous(t *testing.T) {
	t.Parallel()
	e := mustNew(t, []Source{{JSON, "a"}}, []Source{{JSON, "b"}})
	x, err := e.Extract([]byte(`{"a":"1\",\"2","b":"3"}`), http.Header{})
	require.NoError(t, err)
	y, err := e.Extract([]byte(`{"a":"1","b":"2\",\"3"}`), http.Header{})
	require.NoError(t, err)
	require.NotEqual(t, x, y)
}

func TestParseSource(t *testing.T) {
	t.Parallel()
	_, err := ParseSource("query", "id")
	require.Error(t, err)
	_, err = ParseSource("json", "")
	require.Error(t, err)
	s, err := ParseSource("form", "trigger_id")
	require.NoError(t, err)
	require.Equal(t, Source{Form, "trigger_id"}, s)
}

func FuzzExtractJSON(f *testing.F) {
	for _, s := range []string{`{"id":"evt_1"}`, `{"id":1e400}`, `{"id":"\u0000"}`, `[`, `{"id":{"id":1}}`, ``} {
		f.Add(s)
	}
	e, err := New([][]Source{{{JSON, "id"}}, {{Form, "x"}}})
	if err != nil {
		f.Fatal(err)
	}
	single, _ := New([][]Source{{{JSON, "data.id"}}})
	f.Fuzz(func(t *testing.T, body string) {
		for _, x := range []*Extractor{e, single} {
			id, err := x.Extract([]byte(body), http.Header{})
			if err == nil && (id == "" || len(id) > MaxLen) {
				t.Fatalf("accepted id %q", id)
			}
		}
	})
}

func FuzzExtractForm(f *testing.F) {
	for _, s := range []string{"a=1", "a=1&a=2", "%zz", "a=" + strings.Repeat("x", 300), ""} {
		f.Add(s)
	}
	e, _ := New([][]Source{{{Form, "a"}}})
	f.Fuzz(func(t *testing.T, body string) {
		id, err := e.Extract([]byte(body), http.Header{})
		if err == nil && (id == "" || len(id) > MaxLen) {
			t.Fatalf("accepted id %q", id)
		}
	})
}

func FuzzExtractHeader(f *testing.F) {
	for _, s := range []string{"e1", "", " ", strings.Repeat("x", 256)} {
		f.Add(s)
	}
	e, _ := New([][]Source{{{Header, "X-Event-Id"}}})
	f.Fuzz(func(t *testing.T, v string) {
		id, err := e.Extract(nil, http.Header{"X-Event-Id": {v}})
		if err == nil && (id == "" || len(id) > MaxLen) {
			t.Fatalf("accepted id %q", id)
		}
	})
}
