package analytics

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"sync/atomic"
	"testing"
	"time"
)

func status(code int, body string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = w.Write([]byte(body))
	}
}

// failFirst answers the first len(fails) requests with fails, then 200.
func failFirst(fails ...func(w http.ResponseWriter)) func(int, http.ResponseWriter, *http.Request) {
	return func(n int, w http.ResponseWriter, _ *http.Request) {
		if n <= len(fails) {
			fails[n-1](w)
			return
		}
		ok(w)
	}
}

func TestRetryOn5xxAnd429(t *testing.T) {
	for _, code := range []int{500, 502, 503, 429} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			s := newServer(t, failFirst(status(code, `{"success":false}`), status(code, `{"success":false}`)))
			c, _ := newTestClient(t, s)
			c.Size = 1
			var tick atomic.Int64 // a clock that moves a second per reading
			c.now = func() time.Time { return time.Unix(1_800_000_000+tick.Add(1), 0) }

			mustNil(t, c.Track(track(1)))
			a, b, d := s.next(t), s.next(t), s.next(t)
			if !reflect.DeepEqual(a.ids(), d.ids()) || !reflect.DeepEqual(b.ids(), d.ids()) {
				t.Errorf("retries must resend the same messages: %v %v %v", a.ids(), b.ids(), d.ids())
			}
			if a.Body.SentAt == d.Body.SentAt {
				t.Errorf("sentAt %s not restamped on retry", a.Body.SentAt)
			}
			mustNil(t, c.Close())
			st := c.Stats()
			if st.Requests != 3 || st.Retries != 2 || st.Delivered != 1 || st.Failed != 0 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

func TestRetryOnNetworkError(t *testing.T) {
	s := newServer(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 { // drop the connection without an answer
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		ok(w)
	})
	c, _ := newTestClient(t, s)
	c.Size = 1
	mustNil(t, c.Track(track(1)))
	s.next(t)
	s.next(t)
	mustNil(t, c.Close())
	if st := c.Stats(); st.Delivered != 1 || st.Retries != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestRetryOnTimeout(t *testing.T) {
	s := newServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			<-r.Context().Done() // never answer; the client's timeout ends it
			return
		}
		ok(w)
	})
	c, logs := newTestClient(t, s)
	c.Verbose = true
	c.Size = 1
	c.Client = http.Client{Timeout: 100 * time.Millisecond}
	mustNil(t, c.Track(track(1)))
	s.next(t)
	s.next(t)
	mustNil(t, c.Close())
	if st := c.Stats(); st.Delivered != 1 || st.Retries != 1 {
		t.Fatalf("stats %+v", st)
	}
	logs.mustContain(t, "Client.Timeout exceeded")
}

func TestNoRetryOn4xx(t *testing.T) {
	cases := []struct {
		code int
		body string
		log  string
	}{
		{400, `{"success":false,"code":"missing_field","message":"track needs event"}`, `code=missing_field message="track needs event"`},
		{401, `{"success":false,"code":"unknown_write_key","message":"unknown write key"}`, "unknown_write_key"},
		{413, `request too large`, "413"},
		{404, ``, "404"},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.code), func(t *testing.T) {
			s := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) { status(tc.code, tc.body)(w) })
			c, logs := newTestClient(t, s)
			c.FlushAt = 2
			mustNil(t, c.Track(track(1)))
			mustNil(t, c.Track(track(2)))
			ids := s.next(t).ids()

			err := c.Close()
			if !errors.Is(err, ErrNotDelivered) {
				t.Fatalf("Close = %v, want ErrNotDelivered", err)
			}
			st := c.Stats()
			if st.Requests != 1 || st.Retries != 0 || st.Failed != 2 || st.Dropped() != 2 {
				t.Errorf("a %d must not be retried; stats %+v", tc.code, st)
			}
			logs.mustContain(t, "dropped 2 message(s)", ids[0], ids[1], tc.log)
		})
	}
}

func TestRetriesExhausted(t *testing.T) {
	s := newServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		status(503, `{"success":false,"code":"storage_unavailable"}`)(w)
	})
	c, logs := newTestClient(t, s)
	c.Size = 1
	c.MaxRetries = 2
	mustNil(t, c.Track(track(1)))
	err := c.Close()
	if !errors.Is(err, ErrNotDelivered) {
		t.Fatalf("Close = %v, want ErrNotDelivered", err)
	}
	if st := c.Stats(); st.Requests != 3 || st.Failed != 1 {
		t.Fatalf("want 1 attempt + 2 retries then a drop; stats %+v", st)
	}
	logs.mustContain(t, "giving up after 3 attempt(s)", "storage_unavailable")
}

func TestRetryAfterHonoured(t *testing.T) {
	s := newServer(t, failFirst(func(w http.ResponseWriter) {
		w.Header().Set("Retry-After", "1")
		status(429, `{"success":false}`)(w)
	}))
	c, _ := newTestClient(t, s)
	c.Size = 1
	c.backoffMax = 3 * time.Second
	mustNil(t, c.Track(track(1)))
	first, second := s.next(t), s.next(t)
	if gap := second.At.Sub(first.At); gap < time.Second {
		t.Fatalf("retried after %s despite Retry-After: 1", gap)
	}
}

func TestBackoffGrowsWithJitter(t *testing.T) {
	c := &Client{cfg: config{backoffMin: 100 * time.Millisecond, backoffMax: 10 * time.Second}}
	for attempt := range 12 {
		base := min(100*time.Millisecond<<attempt, 10*time.Second)
		seen := map[time.Duration]bool{}
		for range 50 {
			d := c.backoff(attempt, 0)
			if d < base/2 || d > base {
				t.Fatalf("attempt %d: backoff %s outside [%s, %s]", attempt, d, base/2, base)
			}
			seen[d] = true
		}
		if len(seen) < 2 {
			t.Fatalf("attempt %d: no jitter, always %v", attempt, seen)
		}
	}
	if d := c.backoff(0, 5*time.Second); d != 5*time.Second {
		t.Errorf("Retry-After 5s gave %s", d)
	}
	if d := c.backoff(0, time.Hour); d != 10*time.Second {
		t.Errorf("Retry-After beyond the cap gave %s", d)
	}
}

// analytics.Backo, as set before the client's first use, shapes its retries.
func TestBackoPolicyIsUsed(t *testing.T) {
	saved := Backo
	t.Cleanup(func() { Backo = saved })
	Backo = NewBacko(time.Second, 3, 0, 30*time.Second)
	c := New("k")
	c.cfg = c.resolve()
	if c.cfg.backoffMin != time.Second || c.cfg.backoffMax != 30*time.Second || c.cfg.backoffFactor != 3 {
		t.Fatalf("config from Backo: min %s max %s factor %v", c.cfg.backoffMin, c.cfg.backoffMax, c.cfg.backoffFactor)
	}
	for range 20 {
		if d := c.backoff(2, 0); d < 4500*time.Millisecond || d > 9*time.Second {
			t.Fatalf("third retry waits %s, want within [4.5s, 9s] (1s × 3², equal jitter)", d)
		}
	}
}
