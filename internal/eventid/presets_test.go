package eventid_test

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// Every preset's default json path refuses a member name given twice at
// every depth of the path, in each spelling, and reads the ID of the same
// document without the repetition.
func TestPresetJSONPathsRefuseRepeatedNames(t *testing.T) {
	t.Parallel()
	covered := 0
	for _, provider := range signature.Providers() {
		p, _ := signature.Lookup(provider)
		for _, spec := range p.EventID {
			kind, path, _ := strings.Cut(spec, " ")
			if kind != string(eventid.JSON) {
				continue
			}
			covered++
			src, err := eventid.ParseSource(kind, path)
			require.NoError(t, err, "%s: default %s", provider, spec)
			e, err := eventid.New([][]eventid.Source{{src}})
			require.NoError(t, err)
			names := strings.Split(path, ".")
			t.Run(provider+"/"+path, func(t *testing.T) {
				t.Parallel()
				id, err := e.Extract([]byte(nest(names, 0, -1, "")), http.Header{})
				require.NoError(t, err)
				require.Equal(t, "evt_A", id)
				for depth := range names {
					for _, spelling := range []string{"", "escaped", "upper"} {
						body := nest(names, 0, depth, spelling)
						_, err := e.Extract([]byte(body), http.Header{})
						require.ErrorIs(t, err, eventid.ErrAmbiguous, body)
					}
				}
			})
		}
	}
	require.GreaterOrEqual(t, covered, 8, "presets with a json event ID")
}

// nest builds a document holding names[i:] down to the ID "evt_A". At
// depth dup the member is given a second time, after the first (holding the
// ID "evt_B" below it), its name spelled as the first ("") with its first
// letter as a \u escape ("escaped"), or in upper case ("upper").
func nest(names []string, i, dup int, spelling string) string {
	if i == len(names) {
		return `"evt_A"`
	}
	member := fmt.Sprintf(`{"type":"x",%q:%s`, names[i], nest(names, i+1, dup, spelling))
	if i == dup {
		second := names[i]
		switch spelling {
		case "escaped":
			second = `\u00` + strconv.FormatInt(int64(second[0]), 16) + second[1:]
		case "upper":
			second = strings.ToUpper(second)
		}
		member += `,"` + second + `":` + strings.Replace(nest(names, i+1, -1, ""), "evt_A", "evt_B", 1)
	}
	return member + "}"
}
