//go:build benchretention

package caddymodule

import "time"

// A Caddy built with -tags benchretention (make bench-sweep) accepts a
// retention down to one minute, so that a route's sweep can be watched
// keeping up within minutes instead of days. Never a release build.
func init() { minRetention = time.Minute }
