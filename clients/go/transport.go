package analytics

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

var errAbandoned = errors.New("client closed (CloseTimeout reached) before the batch was delivered")

// sender sends batches until the batcher closes the channel. It announces
// itself free before each, so the batcher takes a batch only when it can go
// out at once, and takes it as large as the queue allows.
func (c *Client) sender() {
	for {
		c.idle <- struct{}{} // never blocks: one slot per sender
		batch, ok := <-c.batches
		if !ok {
			return
		}
		c.finish(batch, c.send(batch))
	}
}

// finish counts and releases a batch; a failed batch is logged with its
// message ids, so no drop is silent.
func (c *Client) finish(batch []item, err error) {
	n := len(batch)
	if err == nil {
		c.stats.delivered.Add(int64(n))
	} else {
		c.stats.failed.Add(int64(n))
		c.errorf("dropped %d message(s) %s: %v", n, ids(batch), err)
	}
	c.mu.Lock()
	c.q.release(batch)
	c.flow.wakeAll()
	c.mu.Unlock()
}

func ids(batch []item) string {
	const show = 10
	var b strings.Builder
	b.WriteString("[")
	for i, it := range batch {
		if i == show {
			fmt.Fprintf(&b, " +%d more", len(batch)-show)
			break
		}
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString(it.id())
	}
	b.WriteString("]")
	return b.String()
}

// send posts a batch, retrying network errors, 429 and 5xx with backoff.
func (c *Client) send(batch []item) error {
	for attempt := 0; ; attempt++ {
		if c.ctx.Err() != nil {
			return errAbandoned
		}
		if attempt > 0 {
			c.stats.retries.Add(1)
		}
		out := c.post(batch, attempt)
		if out.err == nil || !out.retry {
			return out.err
		}
		if attempt >= c.cfg.maxRetries {
			return fmt.Errorf("giving up after %d attempt(s): %w", attempt+1, out.err)
		}
		wait := c.backoff(attempt, out.retryAfter)
		c.debugf("retry: batch of %d in %s: %v", len(batch), wait.Round(time.Millisecond), out.err)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-c.ctx.Done():
			t.Stop()
			return fmt.Errorf("%w; last error: %v", errAbandoned, out.err)
		}
	}
}

type outcome struct {
	err        error
	retry      bool
	retryAfter time.Duration
}

// post makes one attempt. sentAt is stamped per attempt, because the daemon
// corrects clock skew with it.
func (c *Client) post(batch []item, attempt int) outcome {
	if c.cfg.urlErr != nil {
		return outcome{err: c.cfg.urlErr}
	}
	body := batchBody(batch, c.now())
	req, err := http.NewRequestWithContext(c.ctx, http.MethodPost, c.cfg.url, bytes.NewReader(body))
	if err != nil {
		return outcome{err: err}
	}
	req.SetBasicAuth(c.key, "")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", LibraryName+"/"+Version)

	c.stats.requests.Add(1)
	c.debugf("request: POST %s: %d messages, %d bytes (attempt %d)", c.cfg.url, len(batch), len(body), attempt+1)
	start := time.Now()
	resp, err := c.cfg.http.Do(req)
	took := time.Since(start).Round(time.Microsecond)
	c.noteAttempt(err == nil && resp.StatusCode >= 200 && resp.StatusCode < 300, took)
	if err != nil {
		if c.ctx.Err() != nil {
			return outcome{err: errAbandoned}
		}
		c.debugf("response: none after %s: %v", took, err)
		return outcome{err: fmt.Errorf("request failed: %w", err), retry: true}
	}
	snippet := readSnippet(resp.Body)
	c.debugf("response: %s in %s: %s", resp.Status, took, snippet)

	code := resp.StatusCode
	switch {
	case code >= 200 && code < 300:
		return outcome{}
	case code == http.StatusTooManyRequests || code >= 500:
		return outcome{err: statusError(resp.Status, snippet), retry: true,
			retryAfter: parseRetryAfter(resp.Header.Get("Retry-After"))}
	default:
		// 400 (invalid or too large), 401 (unknown write key), 413, ...:
		// sending the same bytes again cannot succeed.
		return outcome{err: statusError(resp.Status, snippet)}
	}
}

// readSnippet keeps the start of a response for logs and drains a bounded
// rest, so the connection can be reused.
func readSnippet(body io.ReadCloser) string {
	defer body.Close()
	b, _ := io.ReadAll(io.LimitReader(body, 1024))
	_, _ = io.Copy(io.Discard, io.LimitReader(body, 64<<10))
	return strings.TrimSpace(string(b))
}

// statusError names the daemon's error code and message when it sent them.
func statusError(status, body string) error {
	var e struct {
		Code    interface{} `json:"code"`
		Message string      `json:"message"`
	}
	if json.Unmarshal([]byte(body), &e) == nil && (e.Code != nil || e.Message != "") {
		return fmt.Errorf("server answered %s: code=%v message=%q", status, e.Code, e.Message)
	}
	return fmt.Errorf("server answered %s: %.200s", status, body)
}

// parseRetryAfter reads the delay-seconds form of Retry-After.
func parseRetryAfter(v string) time.Duration {
	s, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || s <= 0 {
		return 0
	}
	return time.Duration(s) * time.Second
}

// backoff is exponential from backoffMin (Backo's base, by its factor),
// capped at backoffMax, with "equal jitter" (half fixed, half random) so
// retries from many clients spread out yet never collapse to zero. A server's
// Retry-After is honoured up to the cap.
func (c *Client) backoff(attempt int, retryAfter time.Duration) time.Duration {
	factor := c.cfg.backoffFactor
	if factor == 0 {
		factor = 2
	}
	d := c.cfg.backoffMin
	for i := 0; i < attempt && d < c.cfg.backoffMax; i++ {
		d = time.Duration(float64(d) * factor)
	}
	d = min(d, c.cfg.backoffMax)
	d = d/2 + rand.N(d/2+1)
	if retryAfter > d {
		d = min(retryAfter, c.cfg.backoffMax)
	}
	return d
}
