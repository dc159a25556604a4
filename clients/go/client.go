package analytics

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Client batches messages and sends them to efd in the background. Set its
// exported fields after New and before the first call; the first call (or
// Close) freezes them, and later changes are ignored. A Client is safe for
// concurrent use by many goroutines.
type Client struct {
	// Endpoint is the daemon's base URL; requests go to Endpoint+"/v1/batch".
	Endpoint string

	// FlushAt and Size (the v2 name) are one setting, the flush count: a
	// flush starts once this many messages are queued, and its request
	// carries everything then queued, up to MaxBatchMessages and
	// MaxBatchBytes. New sets both to 20. Change either; if both are changed
	// to different values, the smaller wins.
	FlushAt int
	Size    int

	// FlushAfter and Interval (the v2 name) bound how long a message waits:
	// the queue is flushed when this long has passed since the last flush.
	// New sets both to 5s; they combine like FlushAt and Size (the shorter
	// wins).
	FlushAfter time.Duration
	Interval   time.Duration

	// Verbose logs buffering, flushes, requests and responses, as does
	// DEBUG=analytics in the environment.
	Verbose bool
	// Logger receives all logs; New writes to stderr.
	Logger *log.Logger

	// Client makes the HTTP requests. A zero Timeout means DefaultTimeout,
	// and a nil Transport means one of the client's own.
	Client http.Client

	// MaxQueueSize and MaxQueueBytes bound the messages held in memory,
	// queued or in flight, by count and by encoded size; past either, calls
	// return ErrQueueFull.
	MaxQueueSize  int
	MaxQueueBytes int
	// MaxRetries is how many times a batch is retried after its first
	// attempt fails with a network error, 429 or 5xx; 0 disables retries.
	MaxRetries int
	// MaxConcurrentRequests bounds the requests in flight; more than one goes
	// out only while another flush's worth is queued.
	MaxConcurrentRequests int
	// CloseTimeout bounds how long Close waits for queued and in-flight
	// messages; what is still unsent then is dropped, logged and counted.
	CloseTimeout time.Duration

	key string
	now func() time.Time
	// backoffMin and backoffMax shape retry delays; tests shorten them.
	backoffMin, backoffMax time.Duration

	startOnce sync.Once
	cfg       config
	ctx       context.Context // cancelled when CloseTimeout expires
	cancel    context.CancelFunc
	wake      chan struct{} // a full batch is waiting
	closing   chan struct{} // Close was called: flush everything and stop
	done      chan struct{} // batcher and senders have exited
	batches   chan []item
	idle      chan struct{} // one token per free sender

	closeOnce sync.Once
	closeErr  error
	isClosed  atomic.Bool // fast path; mu-guarded closed is authoritative

	mu      sync.Mutex
	closed  bool
	q       queue
	refused refusals
	flow    flow

	stats counters
}

// New returns a client for the source with the given write key, with every
// setting at its default.
func New(writeKey string) *Client {
	return &Client{
		Endpoint:              Endpoint,
		FlushAt:               DefaultFlushAt,
		Size:                  DefaultFlushAt,
		FlushAfter:            DefaultFlushAfter,
		Interval:              DefaultFlushAfter,
		Logger:                newDefaultLogger(),
		Client:                http.Client{Timeout: DefaultTimeout},
		MaxQueueSize:          DefaultMaxQueueSize,
		MaxQueueBytes:         DefaultMaxQueueBytes,
		MaxRetries:            DefaultMaxRetries,
		MaxConcurrentRequests: DefaultMaxConcurrentRequests,
		CloseTimeout:          DefaultCloseTimeout,
		key:                   writeKey,
	}
}

// start freezes the configuration and starts the batcher and senders. It
// runs once, on the first call or Close, so fields set after New count.
func (c *Client) start() {
	c.cfg = c.resolve()
	if c.now == nil {
		c.now = time.Now
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.flow.progress = time.Now()
	c.wake = make(chan struct{}, 1)
	c.closing = make(chan struct{})
	c.done = make(chan struct{})
	c.batches = make(chan []item)
	c.idle = make(chan struct{}, c.cfg.concurrency)

	var wg sync.WaitGroup
	wg.Add(1 + c.cfg.concurrency)
	go func() { defer wg.Done(); c.loop() }()
	for range c.cfg.concurrency {
		go func() { defer wg.Done(); c.sender() }()
	}
	go func() { wg.Wait(); close(c.done) }()

	if c.cfg.urlErr != nil {
		c.errorf("%v: nothing can be delivered", c.cfg.urlErr)
	}
	c.debugf("start: endpoint=%s flushAt=%d flushAfter=%s maxQueue=%d maxQueueBytes=%d maxRetries=%d concurrency=%d",
		c.cfg.url, c.cfg.flushAt, c.cfg.flushAfter, c.cfg.maxQueue, c.cfg.maxQueueBytes, c.cfg.maxRetries, c.cfg.concurrency)
}

// Identify queues an identify message.
func (c *Client) Identify(msg *Identify) error {
	if msg == nil {
		return invalid("identify", "message is nil")
	}
	if err := validateIdentify(msg); err != nil {
		return err
	}
	return c.enqueue(&wire{typ: "identify", msg: &msg.Message, context: msg.Context, integrations: msg.Integrations,
		bodyKey: "traits", body: msg.Traits, anonymousID: msg.AnonymousId, userID: msg.UserId})
}

// Track queues a track message.
func (c *Client) Track(msg *Track) error {
	if msg == nil {
		return invalid("track", "message is nil")
	}
	if err := validateTrack(msg); err != nil {
		return err
	}
	return c.enqueue(&wire{typ: "track", msg: &msg.Message, context: msg.Context, integrations: msg.Integrations,
		bodyKey: "properties", body: msg.Properties, anonymousID: msg.AnonymousId, userID: msg.UserId, event: msg.Event})
}

// Page queues a page message.
func (c *Client) Page(msg *Page) error {
	if msg == nil {
		return invalid("page", "message is nil")
	}
	if err := validatePage(msg); err != nil {
		return err
	}
	return c.enqueue(&wire{typ: "page", msg: &msg.Message, context: msg.Context, integrations: msg.Integrations,
		bodyKey: "properties", body: msg.Traits, anonymousID: msg.AnonymousId, userID: msg.UserId,
		name: msg.Name, category: msg.Category})
}

// Group queues a group message.
func (c *Client) Group(msg *Group) error {
	if msg == nil {
		return invalid("group", "message is nil")
	}
	if err := validateGroup(msg); err != nil {
		return err
	}
	return c.enqueue(&wire{typ: "group", msg: &msg.Message, context: msg.Context, integrations: msg.Integrations,
		bodyKey: "traits", body: msg.Traits, anonymousID: msg.AnonymousId, userID: msg.UserId, groupID: msg.GroupId})
}

// Alias queues an alias message.
func (c *Client) Alias(msg *Alias) error {
	if msg == nil {
		return invalid("alias", "message is nil")
	}
	if err := validateAlias(msg); err != nil {
		return err
	}
	return c.enqueue(&wire{typ: "alias", msg: &msg.Message, userID: msg.UserId, previousID: msg.PreviousId})
}

// scratch buffers for encoding, so a call allocates nothing of its own once
// warm. Oversized ones are dropped rather than kept.
var scratchPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// enqueue encodes a validated message on the caller's goroutine, so the
// caller may change its maps as soon as the call returns, and queues it.
func (c *Client) enqueue(w *wire) error {
	c.startOnce.Do(c.start)
	if c.isClosed.Load() {
		return ErrClosed
	}
	bp := scratchPool.Get().(*[]byte)
	data, idStart, idEnd, err := encodeMessage((*bp)[:0], w, c.cfg.context, c.now())
	if err == nil {
		err = c.push(w.typ, data, idStart, idEnd)
	}
	if cap(data) <= 64<<10 {
		*bp = data[:0]
		scratchPool.Put(bp)
	}
	return err
}

// push copies an encoded message into the queue. When the queue is full it
// waits for room only while the daemon is visibly draining it (see flow);
// otherwise, or once that stops, the call is refused at once.
func (c *Client) push(typ string, data []byte, idStart, idEnd int) error {
	c.mu.Lock()
	waited := false
	for {
		if c.closed {
			c.mu.Unlock()
			return ErrClosed
		}
		if c.q.fits(len(data), c.cfg.maxQueue, c.cfg.maxQueueBytes) {
			break
		}
		room, left := c.flow.wait(time.Now())
		if room == nil {
			report, later := c.refused.add(time.Now())
			c.mu.Unlock()
			c.stats.queueFull.Add(1)
			if report > 0 {
				c.logRefused(report)
			}
			if later > 0 {
				time.AfterFunc(later, c.reportRefusals)
			}
			return fmt.Errorf("%w (MaxQueueSize %d or MaxQueueBytes %d reached)", ErrQueueFull, c.cfg.maxQueue, c.cfg.maxQueueBytes)
		}
		c.mu.Unlock()
		if !waited {
			waited = true
			c.stats.waited.Add(1)
		}
		t := time.NewTimer(left)
		select {
		case <-room:
		case <-t.C:
		}
		t.Stop()
		c.mu.Lock()
	}
	it := c.q.push(data, idStart, idEnd)
	queued, wake := c.q.len(), c.q.ready(c.cfg.flushAt)
	c.mu.Unlock()

	c.stats.accepted.Add(1)
	if c.cfg.verbose {
		c.debugf("buffer: %s %s (%d/%d queued)", typ, it.id(), queued, c.cfg.flushAt)
	}
	if wake {
		select {
		case c.wake <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
	return nil
}

// Close sends everything queued and waits for it, up to CloseTimeout. It
// returns an error wrapping ErrNotDelivered if any accepted message was
// dropped during the client's life. Later calls return ErrClosed; calling
// Close again is safe and returns the same result.
func (c *Client) Close() error {
	c.startOnce.Do(c.start)
	c.closeOnce.Do(func() { c.closeErr = c.shutdown() })
	return c.closeErr
}

func (c *Client) shutdown() error {
	c.mu.Lock()
	c.closed = true
	c.isClosed.Store(true)
	c.flow.wakeAll() // waiting calls return ErrClosed
	queued := c.q.len()
	unreported := c.refused.flush()
	c.mu.Unlock()
	if unreported > 0 {
		c.logRefused(unreported)
	}
	c.debugf("close: flushing %d queued messages", queued)

	close(c.closing)
	timer := time.NewTimer(c.cfg.closeTimeout)
	defer timer.Stop()
	timedOut := false
	select {
	case <-c.done:
	case <-timer.C:
		timedOut = true
		c.errorf("close: CloseTimeout (%s) reached, abandoning unsent messages", c.cfg.closeTimeout)
		c.cancel() // aborts requests and backoff waits, so done comes promptly
		<-c.done
	}
	c.cancel()
	if c.cfg.ownTransport != nil {
		c.cfg.ownTransport.CloseIdleConnections()
	}

	s := c.Stats()
	c.debugf("close: done: %d delivered, %d failed, %d refused (queue full)", s.Delivered, s.Failed, s.QueueFull)
	var errs []error
	if s.Failed > 0 {
		if timedOut {
			errs = append(errs, fmt.Errorf("%w: %d message(s) dropped (close timed out after %s); see the log", ErrNotDelivered, s.Failed, c.cfg.closeTimeout))
		} else {
			errs = append(errs, fmt.Errorf("%w: %d message(s) dropped; see the log", ErrNotDelivered, s.Failed))
		}
	}
	if s.QueueFull > 0 {
		// Told again here for programs that ignore the calls' errors, as v2
		// programs do.
		errs = append(errs, fmt.Errorf("%w: %d call(s) refused since the client started (MaxQueueSize %d, MaxQueueBytes %d)",
			ErrQueueFull, s.QueueFull, c.cfg.maxQueue, c.cfg.maxQueueBytes))
	}
	return errors.Join(errs...)
}

// flow is what push knows of the senders' progress (guarded by Client.mu).
// A full queue is taken to be draining, and a call waits for room, only
// while the last request attempt succeeded and one succeeded (or the client
// started: callers can fill the queue before a sender is even scheduled)
// within the last few request times: a tight loop against a
// healthy daemon is slowed to the daemon's pace instead of losing messages,
// while a daemon that stalls, fails or refuses makes calls fail fast, with
// memory still bounded.
type flow struct {
	failing  bool          // the last attempt failed: refuse at once
	progress time.Time     // last success, or the client's start
	latency  time.Duration // moving average of successful requests
	room     chan struct{} // closed when held messages are released
}

// window is how long after the last progress the queue is still taken to be
// draining: eight request times, and at least a second, as a loaded machine
// can hold a sender back for a tenth of one; at most 5 s. It is also the
// longest a call can wait, once, when the daemon stops answering.
func (f *flow) window() time.Duration {
	return min(max(time.Second, 8*f.latency), 5*time.Second)
}

// wait returns a channel closed when room may have been made and how long to
// wait for it at most, or nil when the call must be refused now.
func (f *flow) wait(now time.Time) (<-chan struct{}, time.Duration) {
	if f.failing {
		return nil, 0
	}
	left := f.progress.Add(f.window()).Sub(now)
	if left <= 0 {
		return nil, 0
	}
	if f.room == nil {
		f.room = make(chan struct{})
	}
	return f.room, left
}

// wakeAll lets every waiting call look at the queue again.
func (f *flow) wakeAll() {
	if f.room != nil {
		close(f.room)
		f.room = nil
	}
}

// noteAttempt feeds flow from the senders.
func (c *Client) noteAttempt(ok bool, took time.Duration) {
	c.mu.Lock()
	c.flow.failing = !ok
	if ok {
		c.flow.progress = time.Now()
		if c.flow.latency == 0 {
			c.flow.latency = took
		} else {
			c.flow.latency += (took - c.flow.latency) / 8
		}
	}
	c.mu.Unlock()
}

// refusals aggregates ErrQueueFull logging: a full queue under load would
// otherwise log thousands of lines a second. Each refusal is counted; the
// first is logged at once, the rest at most once a second, and what is left
// at Close then.
type refusals struct {
	pending int64
	last    time.Time
	armed   bool // a report is scheduled
}

// add counts a refusal. It returns how many to log now, or how long until a
// report must be made (once per burst), or neither.
func (r *refusals) add(now time.Time) (report int64, later time.Duration) {
	r.pending++
	if now.Sub(r.last) >= time.Second {
		r.last = now
		return r.flush(), 0
	}
	if !r.armed {
		r.armed = true
		return 0, r.last.Add(time.Second).Sub(now)
	}
	return 0, 0
}

func (r *refusals) flush() int64 {
	n := r.pending
	r.pending = 0
	return n
}

// reportRefusals logs the refusals of the last second, if any.
func (c *Client) reportRefusals() {
	c.mu.Lock()
	c.refused.armed = false
	n := c.refused.flush()
	if n > 0 {
		c.refused.last = time.Now()
	}
	c.mu.Unlock()
	if n > 0 {
		c.logRefused(n)
	}
}

func (c *Client) logRefused(n int64) {
	c.errorf("queue full (MaxQueueSize %d, MaxQueueBytes %d): dropped %d call(s)", c.cfg.maxQueue, c.cfg.maxQueueBytes, n)
}
