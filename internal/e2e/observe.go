package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// Metric reads one sample from the gateway's /metrics (admin endpoint):
// series is the metric name with its labels as exposed, e.g.
// `caddy_webhook_idempotency_claims_in_flight{scope="stripe"}`. A series
// not exposed is an error.
func (g *Gateway) Metric(ctx context.Context, series string) (float64, error) {
	status, body, err := g.AdminCall(ctx, http.MethodGet, "/metrics")
	if err != nil {
		return 0, err
	}
	if status != http.StatusOK {
		return 0, fmt.Errorf("e2e: /metrics answered %d", status)
	}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if ok && name == series {
			return strconv.ParseFloat(strings.TrimSpace(value), 64)
		}
	}
	return 0, fmt.Errorf("e2e: series %s not exposed", series)
}

// AdminCall makes one request to the gateway's admin endpoint and returns
// the status and body.
func (g *Gateway) AdminCall(ctx context.Context, method, path string) (int, string, error) {
	if g.AdminAddr == "" {
		return 0, "", fmt.Errorf("e2e: gateway %s has no admin endpoint (GatewayConfig.Admin)", g.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+g.AdminAddr+path, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// DeliveryLines returns the gateway's "delivery" log lines of one event,
// oldest first, each as its JSON fields.
func (g *Gateway) DeliveryLines(eventID string) ([]map[string]any, error) {
	b, err := os.ReadFile(g.logPath)
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for _, line := range bytes.Split(b, []byte("\n")) {
		if !bytes.Contains(line, []byte(`"msg":"delivery"`)) || !bytes.Contains(line, []byte(strconv.Quote(eventID))) {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			return nil, fmt.Errorf("e2e: delivery line is not JSON: %w", err)
		}
		if m["event_id"] == eventID {
			out = append(out, m)
		}
	}
	return out, nil
}
