package e2e

import (
	"syscall"
	"time"
)

// Stop asks Caddy to shut down (SIGTERM) and kills its process group if it
// has not exited within 10s.
func (g *Gateway) Stop() {
	select {
	case <-g.exited:
		return
	default:
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.exited:
	case <-time.After(10 * time.Second):
		g.Kill()
	}
}

// LogPath is the file that receives the gateway's stdout and stderr.
func (g *Gateway) LogPath() string { return g.logPath }
