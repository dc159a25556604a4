package analytics

import "time"

// loop decides when batches go out: when FlushAt messages (or a full request
// body) are queued, when FlushAfter has passed since the last flush, and
// finally on Close. A batch is taken only once a sender is free, and then
// carries everything queued, up to one request's limits (MaxBatchMessages,
// MaxBatchBytes). So a trickle goes out FlushAt at a time, while a backlog
// goes out in full requests and, as long as a flush's worth is still queued,
// on more senders at once: throughput grows with the backlog, and callers
// are not refused for want of it. While every sender is busy the queue
// absorbs the calls; the loop never blocks them.
func (c *Client) loop() {
	defer close(c.batches)
	timer := time.NewTimer(c.cfg.flushAfter)
	defer timer.Stop()
	for {
		select {
		case <-c.wake:
			if c.flush(false, "count") {
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

// flush hands batches to free senders while a flush is due (or, with all,
// while anything is queued) and reports whether it handed any.
func (c *Client) flush(all bool, why string) bool {
	flushed := false
	for {
		c.mu.Lock()
		due := c.q.len() > 0 && (all || c.q.ready(c.cfg.flushAt))
		c.mu.Unlock()
		if !due {
			return flushed
		}
		select {
		case <-c.idle:
		case <-c.ctx.Done():
			c.abandonQueued()
			return true
		}
		c.mu.Lock()
		batch, bySize := c.q.take(MaxBatchMessages)
		left := c.q.len()
		c.mu.Unlock()
		flushed = true
		reason := why
		if bySize {
			reason = "size"
		}
		c.debugf("flush (%s): %d messages, %d still queued", reason, len(batch), left)
		c.batches <- batch // to the sender whose token was just taken
	}
}

// abandonQueued drops what is still queued once CloseTimeout has passed.
func (c *Client) abandonQueued() {
	for {
		c.mu.Lock()
		batch, _ := c.q.take(MaxBatchMessages)
		c.mu.Unlock()
		if batch == nil {
			return
		}
		c.finish(batch, errAbandoned)
	}
}
