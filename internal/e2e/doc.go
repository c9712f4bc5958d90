// Package e2e drives the real gateway: the repository's custom Caddy binary
// (./xcaddy) started as separate processes on 127.0.0.1, with generated
// Caddyfiles, in front of a counting upstream that lives in the calling
// process, on the real PostgreSQL.
//
// The helpers here are shared by the fault tests of this package and by the
// soak (./soak, `make soak`). They never mock the store: every gateway talks
// to a database of its own, created for the run and dropped afterwards.
package e2e
