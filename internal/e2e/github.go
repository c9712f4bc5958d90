package e2e

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// The spool tests play GitHub, which does not redeliver a failed delivery
// on its own: a delivery is identified by its X-GitHub-Delivery header and
// signed with X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>.
// The body carries the delivery ID as "id" too, which is what the
// Upstream counts calls by.

// GitHubBody is the body of a GitHub delivery with the given ID.
func GitHubBody(deliveryID string) []byte {
	return fmt.Appendf(nil, `{"id":%q,"action":"opened","issue":{"number":1347,"title":"Found a bug"},"repository":{"full_name":"octocat/Hello-World"}}`,
		deliveryID)
}

// GitHubSignature is the X-Hub-Signature-256 header of body.
func GitHubSignature(secret string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// DeliverGitHub posts one GitHub-signed delivery of deliveryID to url.
func DeliverGitHub(ctx context.Context, c *http.Client, url, secret, deliveryID string) (Result, error) {
	body := GitHubBody(deliveryID)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return Result{}, err
	}
	sig := GitHubSignature(secret, body)
	recordSignature("v1=" + sig[len("sha256="):]) // looked for in the logs (CheckNoLeaks)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "GitHub-Hookshot/044aadd")
	req.Header.Set("X-GitHub-Event", "issues")
	req.Header.Set("X-GitHub-Delivery", deliveryID)
	req.Header.Set("X-Hub-Signature-256", sig)
	res := Result{Start: time.Now()}
	resp, err := c.Do(req)
	if err != nil {
		res.End = time.Now()
		return res, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	res.End = time.Now()
	res.Status = resp.StatusCode
	res.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	res.RetryAfter = resp.Header.Get("Retry-After")
	res.Body = string(b)
	return res, err
}

// GitHubHandler returns the lines of a webhook_idempotency block for
// GitHub on PostgreSQL, followed by extra lines.
func GitHubHandler(secret, dsn string, extra ...string) []string {
	lines := []string{
		"provider github",
		"secret " + strconv.Quote(secret),
		"storage postgres " + strconv.Quote(dsn),
	}
	return append(lines, extra...)
}
