package analytics

import "sync/atomic"

// Stats is a snapshot of a client's counters.
type Stats struct {
	Queued    int   // messages waiting for a batch
	InFlight  int   // messages in batches being sent or retried
	Accepted  int64 // calls that passed validation and were queued
	Delivered int64 // messages acknowledged by the server
	Failed    int64 // accepted messages dropped while sending (4xx, retries exhausted, Close timeout)
	QueueFull int64 // calls refused with ErrQueueFull (dropped at call time)
	Waited    int64 // calls that found the queue full and waited for room while the daemon drained it
	Requests  int64 // HTTP requests made, retries included
	Retries   int64 // HTTP requests that were retries
}

// Dropped is every message lost: refused for a full queue or failed while
// sending. Each drop is also logged.
func (s Stats) Dropped() int64 { return s.QueueFull + s.Failed }

type counters struct {
	accepted, delivered, failed, queueFull, waited, requests, retries atomic.Int64
}

// Stats returns the client's counters; safe to call at any time.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	queued, held := c.q.len(), c.q.held
	c.mu.Unlock()
	return Stats{
		Queued:    queued,
		InFlight:  held - queued,
		Accepted:  c.stats.accepted.Load(),
		Delivered: c.stats.delivered.Load(),
		Failed:    c.stats.failed.Load(),
		QueueFull: c.stats.queueFull.Load(),
		Waited:    c.stats.waited.Load(),
		Requests:  c.stats.requests.Load(),
		Retries:   c.stats.retries.Load(),
	}
}
