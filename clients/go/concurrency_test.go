package analytics

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

func TestManyGoroutines(t *testing.T) {
	s := newServer(t, nil)
	c, _ := newTestClient(t, s)
	const goroutines, each = 50, 200

	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			user := fmt.Sprintf("user-%d", g)
			for i := range each {
				var err error
				switch i % 5 {
				case 0:
					err = c.Identify(&Identify{UserId: user, Traits: map[string]interface{}{"i": i}})
				case 1:
					err = c.Track(&Track{UserId: user, Event: "e", Properties: map[string]interface{}{"i": i}})
				case 2:
					err = c.Page(&Page{AnonymousId: user, Name: "p"})
				case 3:
					err = c.Group(&Group{UserId: user, GroupId: "g"})
				case 4:
					err = c.Alias(&Alias{UserId: user, PreviousId: "anon"})
				}
				if err != nil {
					t.Error(err)
					return
				}
				_ = c.Stats() // readers race with writers too
			}
		}()
	}
	wg.Wait()
	mustNil(t, c.Close())

	msgs := s.messages()
	seen := make(map[string]bool, len(msgs))
	for _, m := range msgs {
		seen[m["messageId"].(string)] = true
	}
	if len(msgs) != goroutines*each || len(seen) != len(msgs) {
		t.Fatalf("delivered %d messages (%d unique ids), want %d", len(msgs), len(seen), goroutines*each)
	}
	for _, r := range s.requests() {
		if len(r.Body.Batch) > MaxBatchMessages || len(r.Raw) > MaxBatchBytes {
			t.Fatalf("a request held %d messages in %d bytes, over the limits", len(r.Body.Batch), len(r.Raw))
		}
	}
	if st := c.Stats(); st.Delivered != goroutines*each || st.Dropped() != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// Close racing with callers loses nothing: every call that returned nil is
// delivered; the others got ErrClosed (or ErrQueueFull).
func TestCloseRacingCalls(t *testing.T) {
	s := newServer(t, nil)
	c, _ := newTestClient(t, s)
	var accepted atomic.Int64
	started := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				err := c.Track(track(i))
				if errors.Is(err, ErrClosed) {
					return
				}
				if errors.Is(err, ErrQueueFull) { // callers can outrun the senders
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				if accepted.Add(1) == 500 {
					once.Do(func() { close(started) })
				}
			}
		}()
	}
	<-started
	// Refusals, if any, are reported again by Close; nothing may be lost.
	if err := c.Close(); err != nil && (!errors.Is(err, ErrQueueFull) || errors.Is(err, ErrNotDelivered)) {
		t.Fatal(err)
	}
	wg.Wait()
	if got := int64(len(s.messages())); got != accepted.Load() {
		t.Fatalf("%d calls accepted, %d delivered", accepted.Load(), got)
	}
}
