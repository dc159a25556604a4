package analytics

import (
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"
)

func TestCloseDrainsQueue(t *testing.T) {
	s := newServer(t, nil)
	c, _ := newTestClient(t, s) // FlushAfter is an hour: only Close sends the tail
	for i := range 55 {
		mustNil(t, c.Track(track(i)))
	}
	mustNil(t, c.Close())
	if got := len(s.messages()); got != 55 {
		t.Fatalf("delivered %d of 55 (batch sizes %v)", got, s.batchSizes())
	}
	st := c.Stats()
	if st.Delivered != 55 || st.Queued != 0 || st.InFlight != 0 || st.Failed != 0 {
		t.Fatalf("stats after Close %+v", st)
	}
}

func TestCloseWaitsForInFlight(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	s := newServer(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			close(arrived)
			<-release
		}
		ok(w)
	})
	c, _ := newTestClient(t, s)
	c.Size = 1
	mustNil(t, c.Track(track(1)))
	<-arrived

	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a request was in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	select {
	case err := <-closed:
		mustNil(t, err)
	case <-time.After(wait):
		t.Fatal("Close did not return after the request completed")
	}
	if st := c.Stats(); st.Delivered != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCloseIsBounded(t *testing.T) {
	for _, name := range []string{"hung request", "retry backoff"} {
		t.Run(name, func(t *testing.T) {
			s := newServer(t, func(_ int, w http.ResponseWriter, r *http.Request) {
				if name == "hung request" {
					<-r.Context().Done() // never answers
					return
				}
				status(503, `{}`)(w)
			})
			c, logs := newTestClient(t, s)
			c.FlushAt = 2
			c.CloseTimeout = 200 * time.Millisecond
			c.backoffMin, c.backoffMax = time.Hour, time.Hour // a retry would wait an hour
			for i := range 3 {
				mustNil(t, c.Track(track(i)))
			}
			s.next(t)

			start := time.Now()
			err := c.Close()
			if took := time.Since(start); took > 5*time.Second {
				t.Fatalf("Close took %s with CloseTimeout 200ms", took)
			}
			if !errors.Is(err, ErrNotDelivered) {
				t.Fatalf("Close = %v, want ErrNotDelivered", err)
			}
			if st := c.Stats(); st.Failed != 3 || st.Delivered != 0 || st.InFlight != 0 || st.Queued != 0 {
				t.Fatalf("every abandoned message must be counted: %+v", st)
			}
			logs.mustContain(t, "CloseTimeout (200ms) reached", "dropped ")
		})
	}
}

func TestCloseTwiceAndConcurrently(t *testing.T) {
	s := newServer(t, nil)
	c, _ := newTestClient(t, s)
	mustNil(t, c.Track(track(1)))
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for range 10 {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- c.Close() }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		mustNil(t, err)
	}
	mustNil(t, c.Close())
	if got := len(s.messages()); got != 1 {
		t.Fatalf("%d messages delivered, want 1", got)
	}
}

func TestSecondCloseRepeatsTheResult(t *testing.T) {
	s := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) { status(400, `{}`)(w) })
	c, _ := newTestClient(t, s)
	mustNil(t, c.Track(track(1)))
	first, second := c.Close(), c.Close()
	if !errors.Is(first, ErrNotDelivered) || first != second {
		t.Fatalf("Close = %v then %v", first, second)
	}
}

func TestCallsAfterCloseFail(t *testing.T) {
	s := newServer(t, nil)
	c, _ := newTestClient(t, s)
	mustNil(t, c.Close()) // Close before any call is fine too
	calls := map[string]error{
		"identify": c.Identify(&Identify{UserId: "u"}),
		"track":    c.Track(track(1)),
		"page":     c.Page(&Page{UserId: "u"}),
		"group":    c.Group(&Group{UserId: "u", GroupId: "g"}),
		"alias":    c.Alias(&Alias{UserId: "u", PreviousId: "p"}),
	}
	for name, err := range calls {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", name, err)
		}
	}
	if n := len(s.requests()); n != 0 {
		t.Errorf("%d requests sent", n)
	}
}
