package analytics

import (
	"math"
	"math/rand/v2"
	"time"
)

// Backoff is a retry delay policy: base × factor^attempt, capped, with an
// optional jitter. It mirrors the policy type v2 exposed as analytics.Backo
// (from github.com/segmentio/backo-go), which this module cannot import: it
// has no dependencies.
type Backoff struct {
	base   time.Duration
	factor uint8
	jitter float64
	cap    time.Duration
}

// NewBacko returns a policy with the given base delay, growth factor, jitter
// (a fraction of the delay, 0 for none) and cap, as backo-go's constructor of
// the same name did.
func NewBacko(base time.Duration, factor uint8, jitter float64, cap time.Duration) *Backoff {
	return &Backoff{base: base, factor: factor, jitter: jitter, cap: cap}
}

// DefaultBacko returns v2's default policy: 100 ms doubling to 10 s, no
// jitter.
func DefaultBacko() *Backoff {
	return NewBacko(defaultBackoffMin, 2, 0, defaultBackoffMax)
}

// Backo is the retry policy a client takes at its first use, as in v2. The
// client uses its base, factor and cap, and always adds its own "equal
// jitter" (see the README, "Retries"), so retries from many processes spread
// out even with the default policy.
var Backo = DefaultBacko()

// Duration returns the delay before retry number attempt (0 is the first).
func (b *Backoff) Duration(attempt int) time.Duration {
	d := float64(b.base) * math.Pow(float64(b.factor), float64(attempt))
	if b.jitter != 0 {
		dev := math.Floor(rand.Float64() * b.jitter * d)
		if rand.IntN(2) == 0 {
			d -= dev
		} else {
			d += dev
		}
	}
	return time.Duration(math.Min(d, float64(b.cap)))
}

// Sleep waits Duration(attempt).
func (b *Backoff) Sleep(attempt int) {
	time.Sleep(b.Duration(attempt))
}
