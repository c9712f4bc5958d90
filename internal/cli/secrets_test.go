package cli

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"
)

// The secrets subcommands call the admin API with the scope as a query
// parameter (any scope, escaped), forget with its confirmation, and never
// send a secret (they have none to send).
func TestSecretsCommandCallsAdminAPI(t *testing.T) {
	t.Parallel()
	var (
		mu  sync.Mutex
		got []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.RequestURI())
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(srv.Close)
	admin := strings.TrimPrefix(srv.URL, "http://")

	run := func(args ...string) (string, error) {
		root := &cobra.Command{Use: "webhook-idempotency"}
		Configure(root)
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append(args, "--admin", admin))
		err := root.Execute()
		return out.String(), err
	}
	_, err := run("secrets", "list")
	require.NoError(t, err)
	_, err = run("secrets", "enroll", "--scope", "asana/a b", "--for", "10m")
	require.NoError(t, err)
	_, err = run("secrets", "forget", "--scope", "asana")
	require.NoError(t, err)
	_, err = run("secrets", "enroll", "--scope", "asana")
	require.ErrorContains(t, err, "--scope and --for are required")

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{
		"GET /webhook_idempotency/secrets",
		"POST /webhook_idempotency/secrets/enroll?for=10m&scope=asana%2Fa+b",
		"DELETE /webhook_idempotency/secrets?confirm=asana&scope=asana",
	}, got)
}
