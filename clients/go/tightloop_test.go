package analytics

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// loopCalls is how many calls the tight-loop tests make: 1,000,000, as in
// the README's comparison, or 100,000 under -race or -short (still ten full queues, so a
// client that cannot keep up refuses calls), or EFD_TIGHT_LOOP_CALLS.
func loopCalls(t *testing.T) int {
	if v := os.Getenv("EFD_TIGHT_LOOP_CALLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("EFD_TIGHT_LOOP_CALLS=%q", v)
		}
		return n
	}
	if raceEnabled || testing.Short() {
		return 100_000
	}
	return 1_000_000
}

// countingServer answers 200 at once and counts the messages it receives
// without decoding them: each carries "type":"track" once.
type countingServer struct {
	*httptest.Server
	got atomic.Int64
}

func newCountingServer(t testing.TB) *countingServer {
	s := &countingServer{}
	var pool = sync.Pool{New: func() any { return new(bytes.Buffer) }}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := pool.Get().(*bytes.Buffer)
		buf.Reset()
		_, _ = buf.ReadFrom(r.Body)
		s.got.Add(int64(bytes.Count(buf.Bytes(), []byte(`"type":"track"`))))
		pool.Put(buf)
		_, _ = io.WriteString(w, `{"success":true}`)
	}))
	t.Cleanup(s.Close)
	return s
}

var loopProps = map[string]interface{}{"revenue": 42.5, "currency": "EUR", "sku": "A-1"}

// A v2 program calling Track in a loop at the default settings, against a
// daemon that answers at once, loses nothing: no call is refused and every
// message arrives.
func TestTightLoopRefusesNothing(t *testing.T) {
	for _, goroutines := range []int{1, 2} {
		t.Run(strconv.Itoa(goroutines)+" goroutine(s)", func(t *testing.T) {
			s := newCountingServer(t)
			c, logs := newTestClient(t, &server{Server: s.Server})
			c.FlushAfter = DefaultFlushAfter // defaults throughout
			c.backoffMin, c.backoffMax = 0, 0
			calls := loopCalls(t) / goroutines * goroutines
			var refused atomic.Int64
			var wg sync.WaitGroup
			for range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					msg := &Track{UserId: "user-1", Event: "Order Completed", Properties: loopProps}
					for range calls / goroutines {
						if err := c.Track(msg); err != nil {
							refused.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			st := c.Stats()
			if refused.Load() != 0 || st.QueueFull != 0 {
				t.Errorf("%d of %d calls refused (stats %+v); log:\n%.2000s", refused.Load(), calls, st, logs)
			}
			if got := s.got.Load(); got != int64(calls) || st.Delivered != int64(calls) {
				t.Errorf("server received %d, client delivered %d, of %d calls", got, st.Delivered, calls)
			}
			t.Logf("%d calls: %d requests, %d calls waited for room", calls, st.Requests, st.Waited)
		})
	}
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// A daemon that never answers: memory stays bounded, calls past the bound are
// refused with ErrQueueFull, and Close reports both the refusals and the
// messages it had to abandon.
func TestHungServerBoundsMemoryAndRefuses(t *testing.T) {
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // so the server notices the client leave
		<-r.Context().Done()
	}))
	t.Cleanup(hung.Close)
	c, logs := newTestClient(t, &server{Server: hung})
	c.FlushAfter = DefaultFlushAfter
	c.CloseTimeout = 100 * 1e6 // 100 ms

	calls := loopCalls(t)
	before := heapInUse()
	msg := &Track{UserId: "user-1", Event: "Order Completed", Properties: loopProps}
	var refused int
	for range calls {
		err := c.Track(msg)
		switch {
		case errors.Is(err, ErrQueueFull):
			refused++
		case err != nil:
			t.Fatalf("call: %v", err)
		}
	}
	growth := int64(heapInUse()) - int64(before)
	st := c.Stats()
	const heapCap = 24 << 20 // the 10,000 held messages are ~3.5 MB encoded
	if growth > heapCap {
		t.Errorf("heap grew by %.1f MB holding %d messages, cap %d MB", float64(growth)/(1<<20), st.Queued+st.InFlight, heapCap>>20)
	}
	if held := st.Queued + st.InFlight; held > DefaultMaxQueueSize || refused != calls-held || int64(refused) != st.QueueFull {
		t.Errorf("%d refused of %d calls, %d held, stats %+v", refused, calls, held, st)
	}
	err := c.Close()
	if !errors.Is(err, ErrQueueFull) || !errors.Is(err, ErrNotDelivered) {
		t.Errorf("Close = %v, want it to report the refusals and the undelivered", err)
	}
	logs.mustContain(t, "queue full")
	t.Logf("heap growth %.1f MB; %d of %d calls refused; Close: %v", float64(growth)/(1<<20), refused, calls, err)
}
