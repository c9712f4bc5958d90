package pgschema

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Unreachable reports whether err, met while connecting to PostgreSQL or
// migrating on a new connection, says only that no server took the
// connection now: refused, reset or closed, timed out, a name lookup that
// failed for a reason other than "no such host", a server starting up,
// shutting down, read-only (a standby of a multi-host DSN) or out of
// connections (SQLSTATE class 08, 25006, 53300, 57P01-57P03). Those end by
// themselves, so a gateway starts and keeps trying.
//
// It is false for what only an operator fixes: a server that answered and
// refused (authentication failed, SQLSTATE class 28; the database does not
// exist, 3D000; any other server error), a host name that does not exist,
// a TLS handshake or certificate failure, and anything it does not know.
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") || serverGoneCodes[pgErr.Code] || pgErr.Code == "53300"
	}
	var (
		dnsErr   *net.DNSError
		certErr  *tls.CertificateVerificationError
		authErr  x509.UnknownAuthorityError
		hostErr  x509.HostnameError
		invalErr x509.CertificateInvalidError
		recErr   tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &dnsErr):
		return !dnsErr.IsNotFound
	case errors.As(err, &certErr), errors.As(err, &authErr), errors.As(err, &hostErr),
		errors.As(err, &invalErr), errors.As(err, &recErr),
		strings.Contains(err.Error(), "server refused TLS connection"):
		return false
	}
	var netErr net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) || pgconn.SafeToRetry(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
