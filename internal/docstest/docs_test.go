package docstest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"

	// The modules of the custom binary (what ./xcaddy builds).
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/webhook-idempotency/caddy-webhook-idempotency"
)

const root = "../.."

// block is a fenced code block of a Markdown page.
type block struct {
	file string
	line int // of the opening fence
	lang string
	text string
}

func (b block) String() string { return b.file + ":" + strconv.Itoa(b.line) }

// pages are the Markdown files users read: the README, docs/, and the other
// top-level pages.
func pages(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, pattern := range []string{"*.md", "docs/*.md"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		require.NoError(t, err)
		out = append(out, m...)
	}
	require.NotEmpty(t, out)
	return out
}

func blocks(t *testing.T, lang string) []block {
	t.Helper()
	var out []block
	for _, p := range pages(t) {
		raw, err := os.ReadFile(p)
		require.NoError(t, err)
		rel, _ := filepath.Rel(root, p)
		var cur *block
		for i, line := range strings.Split(string(raw), "\n") {
			trimmed := strings.TrimSpace(line)
			if !strings.HasPrefix(trimmed, "```") {
				if cur != nil {
					cur.text += line + "\n"
				}
				continue
			}
			if cur == nil {
				cur = &block{file: rel, line: i + 1, lang: strings.TrimPrefix(trimmed, "```")}
				continue
			}
			if cur.lang == lang {
				out = append(out, *cur)
			}
			cur = nil
		}
		require.Nil(t, cur, "%s: a code block is not closed", rel)
	}
	return out
}

// fragmentMarker opens a Caddyfile block that is a part of a site (a route,
// a handler, a log directive): the test wraps it in a site to adapt it.
const fragmentMarker = "# fragment"

func caddyfileOf(b block) (string, bool) {
	first, _, _ := strings.Cut(strings.TrimLeft(b.text, "\n"), "\n")
	if strings.TrimSpace(first) == fragmentMarker {
		return ":8080 {\n" + b.text + "}\n", true
	}
	return b.text, false
}

func adapt(t *testing.T, name, text string) []byte {
	t.Helper()
	out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(text), map[string]any{"filename": name})
	if err != nil {
		t.Errorf("%s does not adapt: %v", name, err)
		return nil
	}
	for _, w := range warnings {
		if strings.Contains(w.Message, "not formatted") {
			continue // the docs align comments with spaces
		}
		t.Errorf("%s: adapt warning: %s", name, w.String())
	}
	return out
}

// TestDocsCaddyfilesAdapt adapts every ```caddyfile block of the README, docs/
// and the other pages; a block whose first line is "# fragment" is wrapped in
// a site first.
func TestDocsCaddyfilesAdapt(t *testing.T) {
	bs := blocks(t, "caddyfile")
	require.GreaterOrEqual(t, len(bs), 10)
	for _, b := range bs {
		text, _ := caddyfileOf(b)
		adapt(t, b.String(), text)
	}
}

// TestReadmeFirstLines: the README opens with the two set-up commands, and a
// new user finds a complete Stripe Caddyfile and the build command within its
// first 60 lines.
func TestReadmeFirstLines(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	lines := strings.Split(string(raw), "\n")
	require.LessOrEqual(t, len(lines), 301, "the README stays short: details go to docs/")
	head := strings.Join(lines[:60], "\n")
	var cmds []string
	for _, l := range lines[:15] {
		if strings.HasPrefix(l, "make ") {
			cmds = append(cmds, strings.Fields(l)[1])
		}
	}
	require.Equal(t, []string{"run", "test"}, cmds, "the first lines hold exactly make run and make test")
	require.Contains(t, head, "make demo")
	require.Contains(t, head, "xcaddy build "+caddyVersion(t)+" --with github.com/webhook-idempotency/caddy-webhook-idempotency@v0.0.0=.")

	first := blocks(t, "caddyfile")[0]
	require.Equal(t, "README.md", first.file)
	require.Less(t, first.line, 60)
	text, fragment := caddyfileOf(first)
	require.False(t, fragment, "the first Caddyfile is complete")
	require.Contains(t, text, "provider stripe")
	out := adapt(t, "README Stripe", text)
	require.Contains(t, string(out), `"provider":"stripe"`)
	require.Contains(t, string(out), `"handler":"reverse_proxy"`)
}

// caddyVersion is the Caddy version of go.mod, which the build commands name.
func caddyVersion(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	m := regexp.MustCompile(`github.com/caddyserver/caddy/v2 (v\S+)`).FindSubmatch(raw)
	require.NotNil(t, m)
	return string(m[1])
}

// TestBuildCommandsMatchTheCheckedOne: every xcaddy build command of the docs
// names go.mod's Caddy version and the module with a local replacement, as
// scripts/xcaddy-check.sh (run by make test) builds it; none promises a
// published version.
func TestBuildCommandsMatchTheCheckedOne(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(root, "scripts", "xcaddy-check.sh"))
	require.NoError(t, err)
	require.Contains(t, string(script), `--with "$module@v0.0.0=."`)
	n := 0
	for _, p := range pages(t) {
		raw, err := os.ReadFile(p)
		require.NoError(t, err)
		for _, m := range regexp.MustCompile(`xcaddy build[^\n]*(?:\\\n[^\n]*)*`).FindAllString(string(raw), -1) {
			if !strings.Contains(m, "--with") {
				continue
			}
			n++
			require.Contains(t, m, "xcaddy build "+caddyVersion(t), "%s: %s", p, m)
			require.Regexp(t, `github\.com/webhook-idempotency/caddy-webhook-idempotency@v0\.0\.0=\S+`, m, "%s: a checkout, not a released version", p)
		}
	}
	require.Positive(t, n)

	// The xcaddy the README installs is the one the tests pin.
	tools, err := os.ReadFile(filepath.Join(root, "scripts", "tools.sh"))
	require.NoError(t, err)
	pin := regexp.MustCompile(`XCADDY_VERSION=(v\S+)`).FindSubmatch(tools)
	require.NotNil(t, pin)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	require.Contains(t, string(readme), "go install github.com/caddyserver/xcaddy/cmd/xcaddy@"+string(pin[1]))
}

// TestExamplesLoad adapts every Caddyfile under examples/ and decodes every
// JSON config there as a Caddy config.
func TestExamplesLoad(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(root, "examples", "*"))
	require.NoError(t, err)
	n := 0
	for _, f := range files {
		switch {
		case strings.HasSuffix(f, "Caddyfile"):
			raw, err := os.ReadFile(f)
			require.NoError(t, err)
			adapt(t, f, string(raw))
			n++
		case strings.HasSuffix(f, ".json"):
			raw, err := os.ReadFile(f)
			require.NoError(t, err)
			var cfg caddy.Config
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.DisallowUnknownFields()
			require.NoError(t, dec.Decode(&cfg), f)
			n++
		}
	}
	require.GreaterOrEqual(t, n, 5)
}

// TestDocsCaddyfilesProvision provisions (caddy validate) every Caddyfile of
// the pages (fragments wrapped in a site) and of examples/: the handler's own
// checks run and its store opens, so an example that adapts but would not
// load fails. Secrets are test values of the right shape, DSNs the test
// database, {file.…} a file holding a test secret.
func TestDocsCaddyfilesProvision(t *testing.T) {
	if testing.Short() {
		t.Skip("opens stores")
	}
	dsn := os.Getenv("TEST_DATABASE_URL")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	secretFile := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secretFile, []byte("docs_test_secret"), 0o600))
	// SendGrid's secret is its ECDSA verification key (base64 DER).
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	require.NoError(t, err)

	var configs []block
	for _, b := range blocks(t, "caddyfile") {
		text, _ := caddyfileOf(b)
		b.text = text
		configs = append(configs, b)
	}
	files, err := filepath.Glob(filepath.Join(root, "examples", "*Caddyfile"))
	require.NoError(t, err)
	for _, f := range files {
		raw, err := os.ReadFile(f)
		require.NoError(t, err)
		configs = append(configs, block{file: f, text: string(raw)})
	}
	envRef := regexp.MustCompile(`\{env\.([A-Z0-9_]+)\}`)
	fileRef := regexp.MustCompile(`\{file\.[^}]+\}`)
	for _, c := range configs {
		for _, m := range envRef.FindAllStringSubmatch(c.text, -1) {
			v := "docs_test_secret"
			switch {
			case strings.Contains(m[1], "DATABASE_URL"):
				v = dsn
			case strings.HasPrefix(m[1], "SENDGRID"):
				v = base64.StdEncoding.EncodeToString(der)
			}
			t.Setenv(m[1], v)
		}
		text := fileRef.ReplaceAllString(c.text, "{file."+secretFile+"}")
		cfgJSON := adapt(t, c.String(), text)
		if cfgJSON == nil {
			continue // reported by adapt
		}
		var cfg caddy.Config
		require.NoError(t, json.Unmarshal(cfgJSON, &cfg), c.String())
		// Validate provisions every module and cleans up; it starts no
		// listener and no admin endpoint.
		if err := caddy.Validate(&cfg); err != nil {
			t.Errorf("%s does not provision: %v", c, err)
		}
	}
}

// webhookCommand is the CLI's webhook-idempotency command, as caddy builds it.
func webhookCommand(t *testing.T) *cobra.Command {
	t.Helper()
	c, ok := caddycmd.Commands()["webhook-idempotency"]
	require.True(t, ok)
	cmd := &cobra.Command{Use: c.Name}
	c.CobraFunc(cmd)
	return cmd
}

// TestDocsCLIExamples parses every "caddy webhook-idempotency ..." line of the
// docs' shell blocks with the real command: the subcommand and every flag
// exist and the arguments are accepted. "[...]" marks an optional part, kept.
func TestDocsCLIExamples(t *testing.T) {
	n := 0
	for _, b := range blocks(t, "sh") {
		for _, line := range strings.Split(b.text, "\n") {
			line, _, _ = strings.Cut(line, " #")
			fields := strings.Fields(strings.NewReplacer("[", "", "]", "").Replace(line))
			if len(fields) < 2 || filepath.Base(fields[0]) != "caddy" || fields[1] != "webhook-idempotency" {
				continue
			}
			n++
			root := webhookCommand(t)
			sub, rest, err := root.Find(fields[2:])
			require.NoError(t, err, "%s: %s", b, line)
			require.NotEqual(t, root, sub, "%s: no subcommand in %q", b, line)
			require.NoError(t, sub.ParseFlags(rest), "%s: %s", b, line)
			require.NoError(t, sub.ValidateArgs(sub.Flags().Args()), "%s: %s", b, line)
		}
	}
	require.GreaterOrEqual(t, n, 15)
}

// TestDocsMakeAndSendExamples: every make target the docs run exists, and
// every flag given to go run ./examples/send is one it defines.
func TestDocsMakeAndSendExamples(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	require.NoError(t, err)
	send, err := os.ReadFile(filepath.Join(root, "examples", "send", "main.go"))
	require.NoError(t, err)
	n := 0
	for _, p := range pages(t) {
		raw, err := os.ReadFile(p)
		require.NoError(t, err)
		for _, m := range regexp.MustCompile("(?m)`make ([a-z-]+)`|^make ([a-z-]+)").FindAllStringSubmatch(string(raw), -1) {
			target := m[1] + m[2]
			n++
			require.Regexp(t, "(?m)^"+regexp.QuoteMeta(target)+":", string(mk), "%s: make %s", p, target)
		}
		for _, m := range regexp.MustCompile(`go run \./examples/send([^\n`+"`"+`]*)`).FindAllStringSubmatch(string(raw), -1) {
			for _, f := range strings.Fields(m[1]) {
				if strings.HasPrefix(f, "-") {
					require.Contains(t, string(send), `flag.`, p)
					require.Regexp(t, `flag\.[A-Za-z]+\("`+regexp.QuoteMeta(strings.TrimLeft(f, "-"))+`"`, string(send), "%s: go run ./examples/send %s", p, f)
				}
			}
		}
	}
	require.Positive(t, n)
}

// TestLogFilterOutputShown: the log filters the docs show are what
// log-filter prints for the command shown with them, so a pasted filter
// deletes what the command would (a renamed header included).
func TestLogFilterOutputShown(t *testing.T) {
	sec, err := os.ReadFile(filepath.Join(root, "docs", "security.md"))
	require.NoError(t, err)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	for _, c := range []struct {
		args []string
		page []byte
	}{
		{[]string{"log-filter", "--provider", "stripe,github,gitlab"}, sec},
		{[]string{"log-filter", "--provider", "stripe", "--header", "X-Relayed-Stripe-Signature", "--site"}, sec},
		{[]string{"log-filter", "--provider", "github"}, readme},
	} {
		cmd := webhookCommand(t)
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs(c.args)
		require.NoError(t, cmd.Execute())
		want := out.String()
		if strings.Contains(strings.Join(c.args, " "), "github") && !strings.Contains(strings.Join(c.args, " "), "gitlab") {
			// The README shows the filter inside a complete Caddyfile.
			want = strings.TrimSuffix(want, "\n")
		}
		require.Contains(t, string(c.page), want, "log-filter %v", c.args)
	}
}

// pendingPages are linked from the docs but written on other branches of the
// same change (the generated provider table, the development guide): their
// links are checked once they exist. Empty this list after they are merged.
var pendingPages = map[string]bool{"docs/providers.md": true, "docs/development.md": true}

// TestDocsLinksResolve: every relative link of the README, docs/ and the other
// pages names a file of the repository, and a #fragment names a heading of
// the page it points to; none leaves the repository.
func TestDocsLinksResolve(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		a := map[string]bool{}
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		inCode := false
		for _, l := range strings.Split(string(raw), "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "```") {
				inCode = !inCode
			}
			if inCode || !strings.HasPrefix(l, "#") {
				continue
			}
			a[slug(strings.TrimLeft(l, "# "))] = true
		}
		anchors[path] = a
		return a
	}
	n := 0
	for _, p := range pages(t) {
		raw, err := os.ReadFile(p)
		require.NoError(t, err)
		for _, m := range link.FindAllStringSubmatch(string(raw), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			n++
			file, frag, _ := strings.Cut(target, "#")
			path := p
			if file != "" {
				path = filepath.Join(filepath.Dir(p), file)
			}
			rel, err := filepath.Rel(root, path)
			require.NoError(t, err)
			require.False(t, strings.HasPrefix(rel, ".."), "%s links outside the repository: %s", p, target)
			if _, err := os.Stat(path); err != nil {
				if pendingPages[filepath.ToSlash(rel)] {
					continue
				}
				t.Errorf("%s: link to a missing file: %s", p, target)
				continue
			}
			if frag != "" && strings.HasSuffix(path, ".md") && !anchorsOf(path)[frag] {
				t.Errorf("%s: link to a missing heading: %s", p, target)
			}
		}
	}
	require.Greater(t, n, 30)
}

// slug is the anchor GitHub gives a heading.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 && r != '—' && r != '…':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestDocsNoOutsideFiles: no page cites a file outside the repository.
func TestDocsNoOutsideFiles(t *testing.T) {
	for _, p := range pages(t) {
		raw, err := os.ReadFile(p)
		require.NoError(t, err)
		require.NotContains(t, string(raw), "../shared", p)
		require.NotContains(t, string(raw), "/work/", p)
	}
}

// TestDocsAdminCurlExamples sends every curl example of the docs to a real
// admin API (an in-process Caddy with an async Stripe route, scope stripe, on
// PostgreSQL): each path and method is one the API serves. An answer about
// the example's made-up event ("event not found") is the API working; an
// unknown path, a refused method or refused parameters fail.
func TestDocsAdminCurlExamples(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Caddy on PostgreSQL")
	}
	dsn := os.Getenv("TEST_DATABASE_URL")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	schema := "docs_test_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	pool, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(context.Background(), "CREATE SCHEMA "+schema)
	require.NoError(t, err)
	defer func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") }()

	admin, listen := freeAddr(t), freeAddr(t)
	cfg := map[string]any{
		"admin": map[string]any{"listen": admin},
		"apps": map[string]any{"http": map[string]any{"servers": map[string]any{"docs": map[string]any{
			"listen": []string{listen},
			"routes": []any{map[string]any{"handle": []any{map[string]any{
				"handler": "webhook_idempotency", "provider": "stripe", "secrets": []string{"whsec_docs_test"},
				"storage":    map[string]any{"backend": "postgres", "dsn": dsn, "table": schema + ".webhook_events"},
				"mode":       "async",
				"deliver_to": "http://" + freeAddr(t),
			}}}},
		}}}},
	}
	raw, err := json.Marshal(cfg)
	require.NoError(t, err)
	require.NoError(t, caddy.Load(raw, true))
	defer func() { require.NoError(t, caddy.Stop()) }()

	curl := regexp.MustCompile(`^curl (.*)$`)
	client := &http.Client{Timeout: 10 * time.Second}
	n := 0
	for _, b := range blocks(t, "sh") {
		for _, line := range strings.Split(b.text, "\n") {
			line, _, _ = strings.Cut(line, " #")
			m := curl.FindStringSubmatch(strings.TrimSpace(line))
			if m == nil {
				continue
			}
			method, target := http.MethodGet, ""
			fields := strings.Fields(m[1])
			for i := 0; i < len(fields); i++ {
				switch f := strings.Trim(fields[i], "'"); {
				case f == "-X":
					i++
					method = fields[i]
				case strings.HasPrefix(f, "localhost:2019/"):
					target = "http://" + admin + strings.TrimPrefix(f, "localhost:2019")
				}
			}
			require.NotEmpty(t, target, "%s: %s", b, line)
			n++
			req, err := http.NewRequest(method, target, nil)
			require.NoError(t, err)
			resp, err := client.Do(req)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			// The gateway has no event of the examples, and no spool (its
			// route is stripe's): a 404 saying so is the right answer.
			ok := resp.StatusCode < 300 ||
				resp.StatusCode == http.StatusNotFound && (bytes.Contains(body, []byte("event not found")) ||
					bytes.Contains(body, []byte("no open spool has directory")))
			require.True(t, ok, "%s: %s %s answered %d %s", b, method, target, resp.StatusCode, body)
			t.Logf("%s %s: %d %s", method, strings.TrimPrefix(target, "http://"+admin), resp.StatusCode, bytes.TrimSpace(body))
		}
	}
	require.GreaterOrEqual(t, n, 13)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}
