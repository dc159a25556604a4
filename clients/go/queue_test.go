package analytics

import (
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestQueueBoundIncludesInFlight(t *testing.T) {
	arrived, release := make(chan struct{}, 10), make(chan struct{})
	s := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		arrived <- struct{}{}
		<-release
		ok(w)
	})
	c, logs := newTestClient(t, s)
	c.Size = 1
	c.MaxConcurrentRequests = 1
	c.MaxQueueSize = 5

	for i := range 5 {
		mustNil(t, c.Track(track(i)))
	}
	<-arrived // one message is in flight, four queued: five held
	for range 2 {
		if err := c.Track(track(99)); !errors.Is(err, ErrQueueFull) {
			t.Fatalf("call past MaxQueueSize = %v, want ErrQueueFull", err)
		}
	}
	st := c.Stats()
	if st.QueueFull != 2 || st.Dropped() != 2 || st.Accepted != 5 || st.Queued+st.InFlight != 5 {
		t.Fatalf("stats %+v", st)
	}
	logs.mustContain(t, "queue full (MaxQueueSize 5, MaxQueueBytes 33554432): dropped 1 call(s)")

	close(release)
	// The refused calls got their error, and Close tells them again.
	if err := c.Close(); !errors.Is(err, ErrQueueFull) || errors.Is(err, ErrNotDelivered) ||
		!strings.Contains(err.Error(), "2 call(s) refused since the client started") {
		t.Fatalf("Close = %v", err)
	}
	if st := c.Stats(); st.Delivered != 5 {
		t.Fatalf("stats %+v", st)
	}
	// The second refusal came within a second of the first: it is reported
	// a second later, or at Close, rather than on its own line.
	logs.mustContain(t, "MaxQueueBytes 33554432): dropped 1 call(s)\n")
	if n := strings.Count(logs.String(), "queue full"); n != 2 {
		t.Errorf("%d queue-full log lines, want 2:\n%s", n, logs)
	}
}

func TestQueueBoundByBytes(t *testing.T) {
	release := make(chan struct{})
	s := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		<-release
		ok(w)
	})
	c, logs := newTestClient(t, s)
	c.Size = 1
	c.MaxQueueBytes = 100 << 10 // raised to one 32 KiB message at least; here ~3 of 30 KB

	blob := strings.Repeat("x", 30000)
	msg := &Track{UserId: "u", Event: "e", Properties: map[string]interface{}{"blob": blob}}
	accepted := 0
	var err error
	for accepted < 10 {
		if err = c.Track(msg); err != nil {
			break
		}
		accepted++
	}
	if !errors.Is(err, ErrQueueFull) || accepted != 3 {
		t.Fatalf("accepted %d messages of 30 KB under 100 KiB, then %v", accepted, err)
	}
	logs.mustContain(t, "queue full")
	close(release)
	if err := c.Close(); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("Close = %v, want the refusal reported", err)
	}
	if st := c.Stats(); st.Delivered != 3 || st.QueueFull != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// While requests succeed, a call that finds the queue full waits for room
// instead of being refused; once they fail, calls are refused at once.
func TestFullQueueWaitsOnlyWhileDraining(t *testing.T) {
	release := make(chan struct{})
	var fail atomic.Bool
	s := newServer(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 2 {
			<-release // the second request is slow, not stalled
		}
		if fail.Load() {
			status(503, `{}`)(w)
			return
		}
		ok(w)
	})
	c, _ := newTestClient(t, s)
	c.Size = 1
	c.MaxConcurrentRequests = 1
	c.MaxQueueSize = 3
	c.backoffMin, c.backoffMax = time.Hour, time.Hour
	c.CloseTimeout = 100 * time.Millisecond // the failing batches are abandoned

	mustNil(t, c.Track(track(0)))
	s.next(t) // one request has succeeded: the daemon is draining
	for i := range 3 {
		mustNil(t, c.Track(track(i))) // held: in the second request, or queued
	}
	s.next(t)
	done := make(chan error, 1)
	go func() { done <- c.Track(track(9)) }() // full: waits for room
	close(release)
	select {
	case err := <-done:
		mustNil(t, err)
	case <-time.After(wait):
		t.Fatal("the waiting call never returned")
	}
	if st := c.Stats(); st.Waited < 1 || st.QueueFull != 0 {
		t.Fatalf("stats %+v", st)
	}

	fail.Store(true) // from now on every attempt fails and is retried an hour later
	for i := 0; ; i++ {
		err := c.Track(track(i))
		if errors.Is(err, ErrQueueFull) {
			break
		}
		mustNil(t, err)
		if i > 100 {
			t.Fatal("calls are still accepted with every request failing")
		}
	}
}

// A burst of refusals is logged as one line at once and one line for the
// rest within a second, not a line per call.
func TestRefusalsLoggedOncePerSecond(t *testing.T) {
	s := newServer(t, func(_ int, _ http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answers
	})
	c, logs := newTestClient(t, s)
	c.Size = 1
	c.MaxQueueSize = 1
	c.CloseTimeout = 100 * time.Millisecond
	mustNil(t, c.Track(track(0)))
	s.next(t) // sent, and never answered: the first refusal comes once the
	// client stops taking the queue for draining, the rest at once
	for range 1000 {
		if err := c.Track(track(1)); !errors.Is(err, ErrQueueFull) {
			t.Fatalf("call past the bound: %v", err)
		}
	}
	for deadline := time.Now().Add(wait); !strings.Contains(logs.String(), "dropped 999 call(s)"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the rest of the burst was never logged:\n%s", logs)
		}
	}
	if n := strings.Count(logs.String(), "queue full"); n != 2 {
		t.Fatalf("%d queue-full lines for 1000 refusals, want 2:\n%s", n, logs)
	}
	err := c.Close()
	if !errors.Is(err, ErrQueueFull) || !errors.Is(err, ErrNotDelivered) || !strings.Contains(err.Error(), "1000 call(s) refused") {
		t.Fatalf("Close = %v", err)
	}
	if n := strings.Count(logs.String(), "queue full"); n != 2 {
		t.Errorf("Close logged refusals already reported:\n%s", logs)
	}
}
