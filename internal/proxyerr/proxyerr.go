// Package proxyerr classifies how a request to an upstream failed: whether
// the upstream may have received it (the outcome is ambiguous) or surely did
// not. The synchronous forward (reverse_proxy) and the async dispatcher
// (net/http's client) read their errors through the same table, documented
// in the README's Guarantees section.
package proxyerr

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// Ambiguous reports whether an error of the next handler
// (normally reverse_proxy: a caddyhttp.HandlerError around the error of
// net/http's transport) leaves it unknown whether the upstream received the
// request. It is the one place proxy errors are classified; the README's
// "Guarantees" table documents it.
//
// Not ambiguous (the request never reached the upstream, release):
// reverse_proxy's DialError, a *net.OpError whose Op is "dial", a
// *net.DNSError, ECONNREFUSED, a TLS handshake failure (certificate
// verification, alerts, "TLS handshake timeout", a non-TLS server), and
// "no upstreams available".
//
// Ambiguous (the request may have been written): everything else, among it
// a connection reset (ECONNRESET, EPIPE), io.EOF or io.ErrUnexpectedEOF
// before the status line ("server closed idle connection", "transport
// connection broken"), "timeout awaiting response headers", and
// context.DeadlineExceeded. net/http does not tell callers whether a failed
// request was written, so an error it does not name as a connect failure
// counts as ambiguous: holding by mistake costs an operator's decision,
// releasing by mistake may run the upstream twice.
func Ambiguous(err error) bool {
	if err == nil {
		return false
	}
	var (
		dialErr  reverseproxy.DialError
		opErr    *net.OpError
		dnsErr   *net.DNSError
		certErr  *tls.CertificateVerificationError
		alertErr tls.AlertError
		recErr   tls.RecordHeaderError
		authErr  x509.UnknownAuthorityError
		hostErr  x509.HostnameError
		invErr   x509.CertificateInvalidError
	)
	switch {
	case errors.As(err, &dialErr),
		errors.As(err, &opErr) && opErr.Op == "dial",
		errors.As(err, &dnsErr),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.As(err, &certErr), errors.As(err, &alertErr), errors.As(err, &recErr),
		errors.As(err, &authErr), errors.As(err, &hostErr), errors.As(err, &invErr):
		return false
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, context.DeadlineExceeded):
		return true
	}
	// Errors net/http and reverse_proxy return as unexported values, known
	// by their text only.
	msg := err.Error()
	for _, s := range []string{"TLS handshake timeout", "no upstreams available"} {
		if strings.Contains(msg, s) {
			return false
		}
	}
	return true
}
