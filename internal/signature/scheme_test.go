package signature

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseTemplate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		template string
		want     []part
		err      string
	}{
		{"{body}", []part{{kind: partBody}}, ""},
		{"v0:{timestamp}:{body}", []part{{kind: partText, text: "v0:"}, {kind: partTimestamp}, {kind: partText, text: ":"}, {kind: partBody}}, ""},
		{"{method}{url}{body}{timestamp}", []part{{kind: partMethod}, {kind: partURL}, {kind: partBody}, {kind: partTimestamp}}, ""},
		{"{id}.{timestamp}.{body}!", []part{{kind: partID}, {kind: partText, text: "."}, {kind: partTimestamp}, {kind: partText, text: "."}, {kind: partBody}, {kind: partText, text: "!"}}, ""},
		{"", nil, "exactly once"},
		{"{body}{body}", nil, "exactly once"},
		{"{timestamp}", nil, "exactly once"},
		{"{body", nil, "unterminated"},
		{"{secret}{body}", nil, "unknown {secret}"},
	}
	for _, tc := range cases {
		t.Run(tc.template, func(t *testing.T) {
			t.Parallel()
			got, err := parseTemplate(tc.template)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// TestSchemeValidate checks that register refuses inconsistent data, so a
// new preset cannot be added broken.
func TestSchemeValidate(t *testing.T) {
	t.Parallel()
	ok := Scheme{
		Headers: []HeaderSet{{Signature: "X-Sig"}}, Signed: "{body}",
		Algorithm: "sha256", Encoding: "hex", Secret: "raw", TimestampUnit: time.Second,
	}
	cases := []struct {
		name   string
		preset Preset
		mutate func(*Scheme)
		err    string
	}{
		{"valid", Preset{}, func(*Scheme) {}, ""},
		{"no headers", Preset{}, func(s *Scheme) { s.Headers = nil }, "no headers"},
		{"bad algorithm", Preset{}, func(s *Scheme) { s.Algorithm = "md5" }, "unknown algorithm"},
		{"bad encoding", Preset{}, func(s *Scheme) { s.Encoding = "base32" }, "unknown encoding"},
		{"timestamp without tolerance", Preset{}, func(s *Scheme) { s.Headers[0].Timestamp = "X-Ts"; s.Signed = "{timestamp}.{body}" }, "default tolerance"},
		{"tolerance without timestamp", Preset{DefaultTolerance: time.Minute}, func(*Scheme) {}, "default tolerance"},
		{"timestamp in two places", Preset{DefaultTolerance: time.Minute}, func(s *Scheme) {
			s.Headers[0].Timestamp = "X-Ts"
			s.Format = Format{List: ",", Pair: "=", SigKey: "v1", TimestampKey: "t"}
		}, "both in a header"},
		{"signed timestamp without source", Preset{}, func(s *Scheme) { s.Signed = "{timestamp}{body}" }, "no timestamp source"},
		{"signed id without header", Preset{}, func(s *Scheme) { s.Signed = "{id}{body}" }, "no ID header"},
		{"signed url without NeedsURL", Preset{}, func(s *Scheme) { s.Signed = "{url}{body}" }, "NeedsURL"},
		{"list without key", Preset{}, func(s *Scheme) { s.Format = Format{List: ","} }, "Pair and SigKey"},
		{"bad secret format", Preset{}, func(s *Scheme) { s.Secret = "hex" }, "unknown secret format"},
		{"bad unit", Preset{}, func(s *Scheme) { s.TimestampUnit = time.Minute }, "seconds or milliseconds"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := ok
			s.Headers = append([]HeaderSet(nil), ok.Headers...)
			tc.mutate(&s)
			err := s.validate(tc.preset)
			if tc.err == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.err)
		})
	}
}

// TestRegisteredSchemesValidate re-checks every data preset (register
// panics at init otherwise, so this mostly documents the invariant).
func TestRegisteredSchemesValidate(t *testing.T) {
	t.Parallel()
	for name, p := range registry {
		if p.build != nil {
			continue
		}
		require.NoError(t, p.Scheme.validate(p), name)
	}
}
