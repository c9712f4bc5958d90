package postgres

import (
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/pgschema"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// interpretError maps driver errors at the store's edge: callers never see
// pgx.ErrNoRows (it becomes store.ErrNotFound), *pgconn.PgError or other
// driver types (see pgschema.MapError).
func interpretError(err error) error { return pgschema.MapError(err, store.ErrNotFound) }

var (
	urlPasswordRE  = regexp.MustCompile(`://[^:@/]*:(.*)@`)
	urlPasswordRE2 = regexp.MustCompile(`://[^:@/]*:([^@]*)@`)
	kvQuotedRE     = regexp.MustCompile(`password\s*=\s*'((?:[^'\\]|\\.)*)'`)
	kvPlainRE      = regexp.MustCompile(`password\s*=\s*([^'\s]\S*)`)
	msgURLRE       = regexp.MustCompile(`(://[^:@/\s]*:)[^@\s]*@`)
	msgKVRE        = regexp.MustCompile(`(password\s*=\s*)('[^']*'|\S+)`)
)

// redact removes the DSN's password from msg. It looks for the password the
// ways a DSN can carry it (URL userinfo, password= query parameter or
// keyword, plain or escaped) and replaces every occurrence, then blanks
// anything in msg that still looks like userinfo or a password= pair.
func redact(dsn, msg string) string {
	var secrets []string
	add := func(s string) {
		if s == "" {
			return
		}
		secrets = append(secrets, s, url.QueryEscape(s), url.PathEscape(s))
		if u, err := url.PathUnescape(s); err == nil {
			secrets = append(secrets, u)
		}
	}
	if u, err := url.Parse(dsn); err == nil {
		if pw, ok := u.User.Password(); ok {
			add(pw)
		}
		add(u.Query().Get("password"))
	}
	for _, re := range []*regexp.Regexp{urlPasswordRE, urlPasswordRE2, kvQuotedRE, kvPlainRE} {
		for _, m := range re.FindAllStringSubmatch(dsn, -1) {
			add(m[1])
		}
	}
	// Longest first, so a password is not left half-replaced by one of its
	// substrings.
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	for _, s := range secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
		}
	}
	msg = msgURLRE.ReplaceAllString(msg, "${1}xxxxx@")
	msg = msgKVRE.ReplaceAllString(msg, "${1}xxxxx")
	return msg
}
