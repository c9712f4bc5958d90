package pgschema

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// Which errors of a start let the gateway start and wait, which fail its
// load: a server that could not be reached now waits, one that answered and
// refused (or a name that does not exist) fails.
func TestUnreachable(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"timeout", fmt.Errorf("dial: %w", context.DeadlineExceeded), true},
		{"eof", fmt.Errorf("receive message: %w", io.ErrUnexpectedEOF), true},
		{"starting up", &pgconn.PgError{Code: "57P03", Message: "the database system is starting up"}, true},
		{"too many connections", &pgconn.PgError{Code: "53300"}, true},
		{"dns temporary", &net.DNSError{Err: "server misbehaving", Name: "db", IsTemporary: true}, true},
		{"wrong password", &pgconn.PgError{Code: "28P01", Message: "password authentication failed"}, false},
		{"unknown role", &pgconn.PgError{Code: "28000"}, false},
		{"no database", &pgconn.PgError{Code: "3D000"}, false},
		{"unknown host", &net.DNSError{Err: "no such host", Name: "db.invalid", IsNotFound: true}, false},
		{"no tls", errors.New("server refused TLS connection"), false},
		{"unknown", errors.New("something else"), false},
		{"nil", nil, false},
		{"multi-host, one refused one refusing", errors.Join(
			&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED},
			&pgconn.PgError{Code: "28P01"}), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, Unreachable(c.err))
		})
	}
}

// The real thing: a port nobody listens on.
func TestUnreachableClosedPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = pgx.Connect(ctx, "postgres://postgres@"+addr+"/x?sslmode=disable")
	require.Error(t, err)
	require.True(t, Unreachable(err), "%v", err)
}
