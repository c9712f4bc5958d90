package dispatch

import (
	"net"
	"net/http"
	"strings"
)

// hopHeaders are not stored: they describe the provider's connection, not
// the delivery (the same list reverse_proxy drops).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// Header is the header a queued delivery of r is sent to the upstream
// with: r's headers without hop-by-hop ones and Content-Length (set from
// the body), plus X-Forwarded-For (clientIP, or r.RemoteAddr's host when
// it is ""), -Proto and -Host as reverse_proxy sets them.
func Header(r *http.Request, clientIP string) http.Header {
	h := r.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
	h.Del("Content-Length")
	if clientIP == "" {
		clientIP, _, _ = net.SplitHostPort(r.RemoteAddr)
	}
	if clientIP != "" {
		h.Set("X-Forwarded-For", clientIP)
	}
	proto := "http"
	if r.TLS != nil {
		proto = "https"
	}
	h.Set("X-Forwarded-Proto", proto)
	h.Set("X-Forwarded-Host", r.Host)
	return h
}
