package analytics

import "time"

// loop turns the queue into batches: when a full batch (by count or size)
// is waiting, when FlushAfter has passed since the last flush, and finally
// on Close. It hands batches to the senders; while they are all busy it
// blocks here, not in the callers, and the queue absorbs the backlog.
func (c *Client) loop() {
	defer close(c.batches)
	timer := time.NewTimer(c.cfg.flushAfter)
	defer timer.Stop()
	for {
		select {
		case <-c.wake:
			if c.flush(false, "") {
				timer.Reset(c.cfg.flushAfter)
			}
		case <-timer.C:
			if !c.flush(true, "interval") {
				c.debugf("flush (interval): nothing queued")
			}
			timer.Reset(c.cfg.flushAfter)
		case <-c.closing:
			c.flush(true, "close")
			return
		}
	}
}

// flush hands over every batch available and reports whether there was any.
func (c *Client) flush(all bool, why string) bool {
	flushed := false
	for {
		c.mu.Lock()
		batch, reason := c.q.take(c.cfg.flushAt, all)
		left := c.q.len()
		c.mu.Unlock()
		if batch == nil {
			return flushed
		}
		flushed = true
		if reason == "" {
			reason = why
		}
		c.debugf("flush (%s): %d messages, %d still queued", reason, len(batch), left)
		select {
		case c.batches <- batch:
		case <-c.ctx.Done():
			c.finish(batch, errAbandoned)
		}
	}
}
