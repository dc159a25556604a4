package analytics

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

// Run with: go test -run '^$' -bench . -benchmem

func benchServer(b *testing.B) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, `{"success":true}`)
	}))
	b.Cleanup(srv.Close)
	return srv
}

func benchClient(b *testing.B, url string, flushAt int) *Client {
	b.Setenv("DEBUG", "")
	c := New("wk_bench")
	c.Endpoint = url
	c.FlushAt = flushAt
	c.MaxQueueSize = b.N + 1 // measure the client, not refusals
	c.MaxQueueBytes = 1 << 40
	c.Logger = log.New(io.Discard, "", 0)
	return c
}

var benchProps = map[string]interface{}{"revenue": 42.5, "currency": "EUR", "sku": "A-1"}

// isolated returns a client that sends nothing until Close, so a benchmark
// measures the call alone and not the senders sharing the CPU.
func isolated(b *testing.B) *Client {
	c := benchClient(b, benchServer(b).URL, 1<<30)
	c.FlushAfter = time.Hour
	return c
}

// BenchmarkTrack is the cost of one call as the caller sees it: validate,
// encode, queue.
func BenchmarkTrack(b *testing.B) {
	c := isolated(b)
	msg := &Track{UserId: "user-1", Event: "Order Completed", Properties: benchProps}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := c.Track(msg); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := c.Close(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkTrackParallel is the same call from many goroutines at once, as
// in a busy web server.
func BenchmarkTrackParallel(b *testing.B) {
	c := isolated(b)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		msg := &Track{UserId: "user-1", Event: "Order Completed", Properties: benchProps}
		for pb.Next() {
			if err := c.Track(msg); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	if err := c.Close(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkThroughput is sustained delivery: b.N events from call to a 200
// from a local server, Close included, reported as events/s.
func BenchmarkThroughput(b *testing.B) {
	for _, flushAt := range []int{DefaultFlushAt, 100} {
		b.Run("FlushAt="+strconv.Itoa(flushAt), func(b *testing.B) {
			c := benchClient(b, benchServer(b).URL, flushAt)
			msg := &Track{UserId: "user-1", Event: "Order Completed", Properties: benchProps}
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				if err := c.Track(msg); err != nil {
					b.Fatal(err)
				}
			}
			if err := c.Close(); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
			if st := c.Stats(); st.Delivered != int64(b.N) {
				b.Fatalf("delivered %d of %d", st.Delivered, b.N)
			}
		})
	}
}
