package analytics

import (
	"fmt"
	"log"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Defaults applied by New (and to zero or negative fields at first use).
const (
	DefaultEndpoint              = "http://localhost:8088"
	DefaultFlushAt               = 20
	DefaultFlushAfter            = 5 * time.Second
	DefaultMaxQueueSize          = 10000
	DefaultMaxQueueBytes         = 32 << 20 // 32 MiB: at least 1,024 messages of the 32 KiB maximum
	DefaultMaxRetries            = 10
	DefaultMaxConcurrentRequests = 4
	DefaultTimeout               = 10 * time.Second
	DefaultCloseTimeout          = 10 * time.Second

	defaultBackoffMin = 100 * time.Millisecond
	defaultBackoffMax = 10 * time.Second
)

// Endpoint is the Endpoint New gives a client. It is a constant, as in v2.1,
// so programs may use it in constant expressions; set Client.Endpoint to send
// elsewhere.
const Endpoint = DefaultEndpoint

// DefaultContext is merged into the context of every message, under the
// message's own keys, as v2 merged it into every batch. It is read once, at
// a client's first use; "library" always names this client.
var DefaultContext = map[string]interface{}{
	"library": map[string]interface{}{"name": LibraryName, "version": Version},
}

// config is the Client's settings frozen at first use; the background
// goroutines read only this, never the exported fields.
type config struct {
	url           string
	urlErr        error
	flushAt       int
	flushAfter    time.Duration
	maxQueue      int
	maxQueueBytes int
	maxRetries    int
	concurrency   int
	closeTimeout  time.Duration
	backoffMin    time.Duration
	backoffMax    time.Duration
	backoffFactor float64
	http          http.Client
	ownTransport  *http.Transport
	logger        *log.Logger
	verbose       bool
	context       map[string]interface{} // DefaultContext without library
}

// resolveAlias reconciles two names for one setting: FlushAt and Size (the
// flush count), FlushAfter and Interval (the flush interval). New sets both
// to the default, so a field still at the default (or <= 0) counts as unset.
// If only one was changed it wins; if both were changed to different values
// the smaller wins, so each stays an upper bound and setting either to 1
// always flushes every message.
func resolveAlias[T int | time.Duration](a, b, def T) T {
	setA := a > 0 && a != def
	setB := b > 0 && b != def
	switch {
	case setA && setB:
		return min(a, b)
	case setA:
		return a
	case setB:
		return b
	}
	return def
}

func positive[T int | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

func (c *Client) resolve() config {
	policy := DefaultBacko()
	if Backo != nil && Backo.base > 0 && Backo.cap > 0 {
		policy = Backo
	}
	cfg := config{
		flushAt:       resolveAlias(c.FlushAt, c.Size, DefaultFlushAt),
		flushAfter:    resolveAlias(c.FlushAfter, c.Interval, DefaultFlushAfter),
		maxQueue:      positive(c.MaxQueueSize, DefaultMaxQueueSize),
		maxQueueBytes: max(positive(c.MaxQueueBytes, DefaultMaxQueueBytes), MaxMessageBytes),
		maxRetries:    max(c.MaxRetries, 0),
		concurrency:   positive(c.MaxConcurrentRequests, DefaultMaxConcurrentRequests),
		closeTimeout:  positive(c.CloseTimeout, DefaultCloseTimeout),
		backoffMin:    positive(c.backoffMin, policy.base),
		backoffMax:    positive(c.backoffMax, policy.cap),
		backoffFactor: max(float64(policy.factor), 1),
		http:          c.Client,
		logger:        c.Logger,
		verbose:       c.Verbose || debugEnv(os.Getenv("DEBUG")),
	}
	// A flush count the queue or the daemon (2,500 messages a request) could
	// never reach would leave only the timer to flush.
	cfg.flushAt = min(cfg.flushAt, cfg.maxQueue, MaxBatchMessages)
	for k, v := range DefaultContext {
		if k != "library" {
			if cfg.context == nil {
				cfg.context = map[string]interface{}{}
			}
			cfg.context[k] = v
		}
	}
	if cfg.logger == nil {
		cfg.logger = newDefaultLogger()
	}
	cfg.url, cfg.urlErr = batchURL(positiveString(c.Endpoint, DefaultEndpoint))
	if cfg.http.Timeout <= 0 {
		// A request must never hang a sender forever.
		cfg.http.Timeout = DefaultTimeout
	}
	if cfg.http.Transport == nil {
		// http.DefaultTransport keeps 2 idle connections per host; keep one
		// per sender so concurrent batches reuse connections.
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = cfg.concurrency
		cfg.http.Transport = t
		cfg.ownTransport = t
	}
	return cfg
}

func positiveString(s, def string) string {
	if strings.TrimSpace(s) == "" {
		return def
	}
	return s
}

func batchURL(endpoint string) (string, error) {
	u, err := url.Parse(strings.TrimRight(endpoint, "/") + "/v1/batch")
	if err != nil {
		return "", fmt.Errorf("invalid Endpoint %q: %w", endpoint, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("invalid Endpoint %q: want http(s)://host[:port]", endpoint)
	}
	return u.String(), nil
}
