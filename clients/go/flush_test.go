package analytics

import (
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestFlushByCount(t *testing.T) {
	s := newServer(t, nil)
	c, _ := newTestClient(t, s) // FlushAfter is an hour: only the count can flush
	c.FlushAt = 3

	for i := range 3 {
		mustNil(t, c.Track(track(i)))
	}
	if got := len(s.next(t).Body.Batch); got != 3 {
		t.Fatalf("first request holds %d messages, want 3", got)
	}
	for i := range 2 {
		mustNil(t, c.Track(track(i)))
	}
	mustNil(t, c.Close())
	if got := s.batchSizes(); !reflect.DeepEqual(got, []int{3, 2}) {
		t.Fatalf("batch sizes %v, want [3 2]: the 2 must wait for Close", got)
	}
}

func TestSizeOneFlushesEveryMessage(t *testing.T) {
	s := newServer(t, nil)
	c, _ := newTestClient(t, s)
	c.Size = 1 // the v2 way (spec 4.5)

	for i := range 3 {
		mustNil(t, c.Track(track(i)))
		if got := len(s.next(t).Body.Batch); got != 1 {
			t.Fatalf("request %d holds %d messages, want 1", i, got)
		}
	}
}

func TestFlushByTime(t *testing.T) {
	s := newServer(t, nil)
	c, logs := newTestClient(t, s)
	c.Verbose = true
	c.FlushAt = 100
	c.FlushAfter = 100 * time.Millisecond

	start := time.Now()
	mustNil(t, c.Track(track(1)))
	mustNil(t, c.Track(track(2)))
	r := s.next(t) // no Close: only the timer can have sent it
	if len(r.Body.Batch) != 2 {
		t.Fatalf("request holds %d messages, want 2", len(r.Body.Batch))
	}
	if waited := r.At.Sub(start); waited < 90*time.Millisecond {
		t.Errorf("flushed after %s, before FlushAfter", waited)
	}
	logs.mustContain(t, "flush (interval): 2 messages")
}

func TestIntervalIsFlushAfterAlias(t *testing.T) {
	s := newServer(t, nil)
	c, _ := newTestClient(t, s)
	c.FlushAfter = DefaultFlushAfter // as New left it
	c.Interval = 50 * time.Millisecond
	mustNil(t, c.Track(track(1)))
	if got := len(s.next(t).Body.Batch); got != 1 {
		t.Fatalf("got %d messages", got)
	}
}

func TestFlushBySize(t *testing.T) {
	s := newServer(t, nil)
	c, logs := newTestClient(t, s)
	c.Verbose = true
	c.FlushAt = 1000            // the count never triggers; FlushAfter is an hour
	c.MaxConcurrentRequests = 1 // one sender keeps batches in order

	blob := strings.Repeat("x", 30000)
	for i := range 40 {
		mustNil(t, c.Track(&Track{UserId: "u", Event: "e", Properties: map[string]interface{}{"i": i, "blob": blob}}))
	}
	// 40 messages of ~30 KB are 1.2 MB: two full 500 KiB batches go out at
	// once, the rest waits for Close.
	first, second := s.next(t), s.next(t)
	for _, r := range []request{first, second} {
		if len(r.Raw) > MaxBatchBytes {
			t.Errorf("request of %d bytes exceeds %d", len(r.Raw), MaxBatchBytes)
		}
		if len(r.Raw) < MaxBatchBytes-31000 {
			t.Errorf("request of %d bytes: a size flush should fill the batch", len(r.Raw))
		}
	}
	mustNil(t, c.Close())
	got := s.messages()
	if len(got) != 40 {
		t.Fatalf("delivered %d messages, want 40", len(got))
	}
	for i, m := range got { // order is kept
		if m["properties"].(map[string]interface{})["i"] != float64(i) {
			t.Fatalf("message %d out of order: %v", i, m["properties"].(map[string]interface{})["i"])
		}
	}
	logs.mustContain(t, "flush (size)", "flush (close)")
}

func TestFlushAtAndSizeResolve(t *testing.T) {
	const d = DefaultFlushAt
	cases := []struct{ flushAt, size, want int }{
		{d, d, d},     // neither changed
		{0, 0, d},     // zero Client
		{1, d, 1},     // FlushAt changed
		{d, 1, 1},     // Size changed (v2)
		{100, d, 100}, // raising one works
		{d, 100, 100},
		{50, 10, 10}, // both changed: the smaller
		{10, 50, 10},
		{-5, 7, 7}, // non-positive counts as unset
	}
	for _, tc := range cases {
		if got := resolveAlias(tc.flushAt, tc.size, d); got != tc.want {
			t.Errorf("FlushAt=%d Size=%d: flush count %d, want %d", tc.flushAt, tc.size, got, tc.want)
		}
	}
	const dd = DefaultFlushAfter
	dcases := []struct{ flushAfter, interval, want time.Duration }{
		{dd, dd, dd}, {0, 0, dd}, {time.Second, dd, time.Second}, {dd, time.Minute, time.Minute},
		{time.Minute, time.Second, time.Second}, {-1, 2 * time.Second, 2 * time.Second},
	}
	for _, tc := range dcases {
		if got := resolveAlias(tc.flushAfter, tc.interval, dd); got != tc.want {
			t.Errorf("FlushAfter=%s Interval=%s: %s, want %s", tc.flushAfter, tc.interval, got, tc.want)
		}
	}
}

func TestFlushAtAndSizeBothSet(t *testing.T) {
	s := newServer(t, nil)
	c, _ := newTestClient(t, s) // FlushAfter is an hour: only the count can flush
	c.FlushAt = 50
	c.Size = 2
	for i := range 2 {
		mustNil(t, c.Track(track(i)))
	}
	// Two messages start a flush before Close: the smaller count wins.
	if got := len(s.next(t).Body.Batch); got != 2 {
		t.Fatalf("first request holds %d messages, want 2", got)
	}
}

// A flush starts at FlushAt, but a backlog goes out in requests as large as
// the limits allow rather than FlushAt at a time.
func TestBacklogGoesOutInFullRequests(t *testing.T) {
	arrived, release := make(chan struct{}, 10), make(chan struct{})
	s := newServer(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			arrived <- struct{}{}
			<-release
		}
		ok(w)
	})
	c, _ := newTestClient(t, s)
	c.FlushAt = 2
	c.MaxConcurrentRequests = 1
	mustNil(t, c.Track(track(0)))
	mustNil(t, c.Track(track(1)))
	<-arrived // the only sender is busy: what follows queues up
	for range 3000 {
		// Small enough that the count, not the 500 KiB, limits a request.
		mustNil(t, c.Track(&Track{UserId: "u", Event: "e"}))
	}
	close(release)
	if got := len(s.next(t).Body.Batch); got != 2 {
		t.Fatalf("first request holds %d messages, want 2", got)
	}
	if got := len(s.next(t).Body.Batch); got != MaxBatchMessages {
		t.Fatalf("second request holds %d messages, want the backlog up to %d", got, MaxBatchMessages)
	}
	mustNil(t, c.Close())
	if got := len(s.messages()); got != 3002 {
		t.Fatalf("delivered %d, want 3002", got)
	}
}

func TestFlushAtCappedByQueueAndDaemon(t *testing.T) {
	for _, tc := range []struct{ flushAt, maxQueue, want int }{
		{50, 10, 10},                      // a count the queue can never reach
		{10000, 100000, MaxBatchMessages}, // the daemon's per-request limit
		{20, 10000, 20},
	} {
		c := New("k")
		c.FlushAt, c.MaxQueueSize = tc.flushAt, tc.maxQueue
		if got := c.resolve().flushAt; got != tc.want {
			t.Errorf("FlushAt %d with MaxQueueSize %d: %d, want %d", tc.flushAt, tc.maxQueue, got, tc.want)
		}
	}
}

func TestFieldsFrozenAtFirstUse(t *testing.T) {
	s := newServer(t, nil)
	c, _ := newTestClient(t, s)
	c.FlushAt = 2
	mustNil(t, c.Track(track(1)))
	c.FlushAt = 1 // too late: ignored, and not a data race
	mustNil(t, c.Track(track(2)))
	if got := len(s.next(t).Body.Batch); got != 2 {
		t.Fatalf("got %d messages, want 2", got)
	}
}

func TestQueueTakeKeepsOrderAndLimits(t *testing.T) {
	var q queue
	for i := range 7 {
		q.push([]byte(string(rune('a'+i))+"}"), 0, 1) // the id is the first byte
	}
	var taken [][]item
	take := func() []item {
		b, _ := q.take(3)
		if b != nil {
			taken = append(taken, b)
		}
		return b
	}
	if b := take(); len(b) != 3 || b[0].id() != "a" || b[2].id() != "c" {
		t.Fatalf("first take %v", b)
	}
	if b := take(); len(b) != 3 || b[0].id() != "d" {
		t.Fatalf("second take %v", b)
	}
	if b := take(); len(b) != 1 || b[0].id() != "g" {
		t.Fatalf("final take %v", b)
	}
	if b := take(); b != nil {
		t.Fatalf("take from an empty queue: %v", b)
	}
	if q.len() != 0 || q.bytes != 0 || q.held != 7 || q.heldBytes != 14 {
		t.Fatalf("queue after takes: len %d bytes %d held %d/%d bytes", q.len(), q.bytes, q.held, q.heldBytes)
	}
	for _, b := range taken {
		q.release(b)
	}
	if q.held != 0 || q.heldBytes != 0 {
		t.Fatalf("held %d/%d bytes after release", q.held, q.heldBytes)
	}
}
