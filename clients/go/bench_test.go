package analytics

import (
	"io"
	"log"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Run with: go test -run '^$' -bench . -benchmem
// (add -benchtime=1x for BenchmarkTightLoop alone: each op is 1,000,000 calls).
//
// Every benchmark uses the default settings against a local server that
// answers 200 at once, and counts what it receives.

func benchClient(b *testing.B, url string) *Client {
	b.Setenv("DEBUG", "")
	c := New("wk_bench")
	c.Endpoint = url
	c.Logger = log.New(io.Discard, "", 0)
	return c
}

func benchTrack() *Track {
	return &Track{UserId: "user-1", Event: "Order Completed", Properties: loopProps}
}

// BenchmarkTrack is one call as the caller sees it, at the defaults, with the
// client sending in the background: allocs/op counts the whole process, so
// the senders' (and the test server's) share is included.
func BenchmarkTrack(b *testing.B) {
	s := newCountingServer(b)
	c := benchClient(b, s.URL)
	msg := benchTrack()
	var refused int
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if c.Track(msg) != nil {
			refused++
		}
	}
	b.StopTimer()
	_ = c.Close()
	b.ReportMetric(float64(refused), "refused")
}

// BenchmarkTrackParallel is the same call from GOMAXPROCS goroutines, as in a
// busy web server.
func BenchmarkTrackParallel(b *testing.B) {
	s := newCountingServer(b)
	c := benchClient(b, s.URL)
	var refused atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		msg := benchTrack()
		for pb.Next() {
			if c.Track(msg) != nil {
				refused.Add(1)
			}
		}
	})
	b.StopTimer()
	_ = c.Close()
	b.ReportMetric(float64(refused.Load()), "refused")
}

// BenchmarkEncode is the per-call work alone: encoding the message.
func BenchmarkEncode(b *testing.B) {
	msg := benchTrack()
	w := &wire{typ: "track", msg: &msg.Message, bodyKey: "properties", body: msg.Properties, userID: msg.UserId, event: msg.Event}
	buf := make([]byte, 0, 1024)
	now := time.Now()
	b.ReportAllocs()
	for range b.N {
		var err error
		if buf, _, _, err = encodeMessage(buf[:0], w, nil, now); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkThroughput is sustained delivery: b.N events from the first call
// to Close's return, reported as events/s, every one counted at the server.
func BenchmarkThroughput(b *testing.B) {
	for _, flushAt := range []int{DefaultFlushAt, 250} {
		b.Run("FlushAt="+strconv.Itoa(flushAt), func(b *testing.B) {
			s := newCountingServer(b)
			c := benchClient(b, s.URL)
			c.FlushAt = flushAt
			msg := benchTrack()
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
			if got := s.got.Load(); got != int64(b.N) {
				b.Fatalf("server received %d of %d", got, b.N)
			}
		})
	}
}

// BenchmarkTightLoop is the README's tight loop: each op is 1,000,000 Track
// calls at the defaults from 1 or 2 goroutines; it reports the calls refused
// and the messages lost (accepted but not received).
func BenchmarkTightLoop(b *testing.B) {
	const calls = 1_000_000
	for _, g := range []int{1, 2} {
		b.Run("goroutines="+strconv.Itoa(g), func(b *testing.B) {
			var refused, lost int64
			start := time.Now()
			for range b.N {
				s := newCountingServer(b)
				c := benchClient(b, s.URL)
				var ref atomic.Int64
				var wg sync.WaitGroup
				for range g {
					wg.Add(1)
					go func() {
						defer wg.Done()
						msg := benchTrack()
						for range calls / g {
							if c.Track(msg) != nil {
								ref.Add(1)
							}
						}
					}()
				}
				wg.Wait()
				_ = c.Close()
				refused += ref.Load()
				lost += calls - ref.Load() - s.got.Load()
			}
			b.ReportMetric(float64(refused)/float64(b.N), "refused/op")
			b.ReportMetric(float64(lost)/float64(b.N), "lost/op")
			b.ReportMetric(float64(calls*b.N)/time.Since(start).Seconds(), "calls/s")
		})
	}
}
