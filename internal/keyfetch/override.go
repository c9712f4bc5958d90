package keyfetch

import (
	"crypto/x509"
	"sync"
	"testing"
)

// TestOverride points every Fetcher at a local key server and replaces
// embedded trust anchors, for tests only. URLs keep the provider's host
// names, so the allowlist, the https rule and the redirect rule are checked
// exactly as in production; only the dial goes to Addr and only the TLS
// roots change.
//
// How it is guarded: no configuration can set it. The module's JSON and
// Caddyfile have no field for it, this package is internal (code outside
// this module cannot import it), and SetTestOverride panics unless the
// running binary is a test binary (testing.Testing), so even a code path
// inside the module that called it by mistake would stop a real server at
// start rather than trust a local key server.
type TestOverride struct {
	// Addr is the host:port dialled instead of the URL's host.
	Addr string
	// RootCAs are the roots trusted instead of the system's.
	RootCAs *x509.CertPool
	// ServerName is the name the key server's certificate carries.
	ServerName string
	// Anchor, when it returns non-nil, replaces the embedded trust anchor
	// name (see Anchor).
	Anchor func(name string) []byte
	// Publish receives what Publish is given: keys a test signer made.
	Publish func(key string, body []byte)
}

var (
	overrideMu  sync.Mutex
	override    *TestOverride
	overrideGen uint64
)

// SetTestOverride installs o (nil removes it) for the whole process and
// empties every Fetcher's cache. It panics outside a test binary.
func SetTestOverride(o *TestOverride) {
	if !testing.Testing() {
		panic("keyfetch: SetTestOverride called outside a test binary")
	}
	overrideMu.Lock()
	defer overrideMu.Unlock()
	override = o
	overrideGen++
}

func current() (*TestOverride, uint64) {
	overrideMu.Lock()
	defer overrideMu.Unlock()
	return override, overrideGen
}

// Anchor returns the trust anchor named name: embedded, or its test
// override.
func Anchor(name string, embedded []byte) []byte {
	o, _ := current()
	if o != nil && o.Anchor != nil {
		if b := o.Anchor(name); b != nil {
			return b
		}
	}
	return embedded
}

// Publish hands a key a test signer made to the local key server (key is
// its URL, or a name the server understands: see keyfetchtest) and empties
// every Fetcher's cache so the next fetch sees it. Without a test override
// it does nothing: in production a signed delivery names a key only the
// provider can serve.
func Publish(key string, body []byte) {
	o, _ := current()
	if o == nil || o.Publish == nil {
		return
	}
	o.Publish(key, body)
	overrideMu.Lock()
	overrideGen++
	overrideMu.Unlock()
}
