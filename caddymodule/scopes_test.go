package caddymodule

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestScopeIndexCountsRegistrations(t *testing.T) {
	t.Parallel()
	x := newScopeIndex[int]()
	// Two handlers (or the old and new config of a reload) on one value.
	x.add("stripe", 1)
	x.add("stripe", 1)
	x.add("stripe", 2)
	x.add("github", 1)
	require.ElementsMatch(t, []int{1, 2}, x.lookup("stripe")["stripe"])
	require.Len(t, x.lookup(""), 2, "every scope")
	require.Empty(t, x.lookup("shopify"))

	x.remove("stripe", 1)
	require.ElementsMatch(t, []int{1, 2}, x.lookup("stripe")["stripe"], "one registration of 1 is left")
	x.remove("stripe", 1)
	x.remove("stripe", 2)
	require.Empty(t, x.lookup("stripe"), "the scope leaves with its last value")
	require.Equal(t, []int{1}, x.lookup("github")["github"])
	x.remove("github", 9) // never registered: a no-op
	require.Equal(t, []int{1}, x.lookup("")["github"])
}
