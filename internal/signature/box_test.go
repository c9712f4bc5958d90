package signature

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// boxEscaped must write what box-node-sdk's jsonStringifyWithEscapedUnicode
// writes: UTF-16 units from U+007F up as lower-case \uXXXX, "/" as "\/"
// unless already escaped.
func TestBoxEscaped(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{`{"a":"b"}`, `{"a":"b"}`},
		{`{"name":"Café"}`, `{"name":"Caf\u00e9"}`},
		{`{"e":"😀"}`, `{"e":"\ud83d\ude00"}`},
		{`{"p":"/a/b"}`, `{"p":"\/a\/b"}`},
		{`{"p":"\/a"}`, `{"p":"\/a"}`},
		{"{\"d\":\"\x7f\"}", `{"d":"\u007f"}`},
		{"\xff/", "\xff\\/"},
	}
	for _, tc := range cases {
		got, changed := boxEscaped([]byte(tc.in))
		require.Equal(t, tc.want, string(got), tc.in)
		require.Equal(t, tc.in != tc.want, changed, tc.in)
	}
}
