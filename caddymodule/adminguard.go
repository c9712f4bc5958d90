package caddymodule

import (
	"crypto/x509"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// The admin API can undo deduplication (forget: the provider's next
// delivery is forwarded again) and lose acknowledged events (a queue purge).
// Caddy's admin endpoint has no authentication of its own on a TCP address:
// what protects it is where it listens (a unix socket and its file
// permissions) or Caddy's remote admin (mTLS with per-path access control);
// see the README's security section. On top of that, guardAdmin makes the
// destructive calls explicit and every change attributable:
//
//   - DELETE of a learned secret needs ?confirm=<the scope>.
//   - DELETE of one event (forget) or one queued event (purge) needs
//     ?confirm=<the event ID>; DELETE of a queue state needs ?confirm=<the
//     state>. Without it: 428 and nothing changes. A mistyped or replayed
//     URL, a script looping over IDs, or a request forged without knowing
//     the ID cannot destroy by accident.
//   - Every call other than GET is logged (logger admin.api.webhook_idempotency)
//     with its method, path, answer status, the caller's remote address and,
//     over mTLS, the client certificate's identity. release, complete and
//     retry change state an operator decided on (held or dead events only)
//     and are logged, not confirmed.

// guardAdmin wraps an admin route's handler as described above. logger
// returns the logger to write to.
func guardAdmin(logger func() *zap.Logger, next caddy.AdminHandlerFunc) caddy.AdminHandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			return next(w, r)
		}
		who := []zap.Field{
			zap.String("method", r.Method),
			zap.String("path", r.URL.EscapedPath()),
			zap.String("remote_addr", r.RemoteAddr),
		}
		if id := tlsIdentity(r); id != "" {
			who = append(who, zap.String("tls_client", id))
		}
		if want, what := confirmationFor(r); want != "" && r.URL.Query().Get("confirm") != want {
			logger().Warn("destructive admin call refused: no confirmation", who...)
			return apiErr(http.StatusPreconditionRequired,
				"this call destroys data: repeat it with ?confirm=<%s> (the %s again)", what, what)
		}
		err := next(w, r)
		status := http.StatusOK
		var ae caddy.APIError
		if errors.As(err, &ae) {
			status = ae.HTTPStatus
		} else if err != nil {
			status = http.StatusInternalServerError
		}
		logger().Info("admin call", append(who, zap.Int("status", status))...)
		return err
	}
}

// confirmationFor returns the confirm value a destructive call needs and
// what it names ("" when the call is not destructive, or too malformed for
// its handler not to refuse it anyway).
func confirmationFor(r *http.Request) (want, what string) {
	if r.Method != http.MethodDelete {
		return "", ""
	}
	path := r.URL.EscapedPath()
	if rest, ok := strings.CutPrefix(path, queueAdminPrefix); ok {
		parts := strings.Split(strings.TrimSuffix(rest, "/"), "/")
		switch {
		case len(parts) == 3 && parts[1] == "events":
			id, _ := url.PathUnescape(parts[2])
			return id, "event id"
		case len(parts) == 2 && parts[1] == "event":
			return r.URL.Query().Get("id"), "event id"
		case len(parts) == 2 && parts[1] == "events":
			return r.URL.Query().Get("state"), "state"
		}
		return "", ""
	}
	if path == adminPrefix+"secrets" {
		return r.URL.Query().Get("scope"), "scope"
	}
	if path == adminPrefix+"event" {
		return r.URL.Query().Get("id"), "event id"
	}
	if rest, ok := strings.CutPrefix(path, adminPrefix+"events/"); ok {
		parts := strings.Split(rest, "/")
		if len(parts) == 2 {
			id, _ := url.PathUnescape(parts[1])
			return id, "event id"
		}
	}
	return "", ""
}

// tlsIdentity names the client certificate of an mTLS admin call: its
// subject and SANs.
func tlsIdentity(r *http.Request) string {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return ""
	}
	return certIdentity(r.TLS.PeerCertificates[0])
}

func certIdentity(c *x509.Certificate) string {
	parts := []string{c.Subject.String()}
	parts = append(parts, c.DNSNames...)
	for _, u := range c.URIs {
		parts = append(parts, u.String())
	}
	parts = append(parts, c.EmailAddresses...)
	return strings.Join(parts, " ")
}

// queueAdminLogger is the logger of the queue admin API's calls.
func queueAdminLogger() *zap.Logger { return caddy.Log().Named("admin.api.webhook_idempotency_queue") }
