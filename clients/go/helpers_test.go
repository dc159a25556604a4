package analytics

import (
	"bytes"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// wait bounds every channel wait in the tests; nothing here sleeps to assert.
const wait = 10 * time.Second

// request is one batch request as the test server saw it.
type request struct {
	Header   http.Header
	User     string
	Password string
	HasAuth  bool
	Method   string
	Path     string
	Raw      []byte
	At       time.Time
	Body     struct {
		Batch  []map[string]interface{} `json:"batch"`
		SentAt string                   `json:"sentAt"`
	}
}

func (r request) ids() []string {
	var out []string
	for _, m := range r.Body.Batch {
		out = append(out, m["messageId"].(string))
	}
	return out
}

// server records every request and answers with respond (200 by default).
// n is the 1-based number of the request.
type server struct {
	*httptest.Server
	reqs    chan request
	mu      sync.Mutex
	all     []request
	respond func(n int, w http.ResponseWriter, r *http.Request)
}

func newServer(t *testing.T, respond func(n int, w http.ResponseWriter, r *http.Request)) *server {
	t.Helper()
	s := &server{reqs: make(chan request, 100000), respond: respond}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		rec := request{Header: r.Header.Clone(), Method: r.Method, Path: r.URL.Path, Raw: raw, At: time.Now()}
		rec.User, rec.Password, rec.HasAuth = r.BasicAuth()
		if err := json.Unmarshal(raw, &rec.Body); err != nil {
			t.Errorf("request body is not JSON: %v: %.200s", err, raw)
		}
		s.mu.Lock()
		s.all = append(s.all, rec)
		n := len(s.all)
		s.mu.Unlock()
		s.reqs <- rec
		if s.respond != nil {
			s.respond(n, w, r)
			return
		}
		ok(w)
	}))
	t.Cleanup(s.Close)
	return s
}

func ok(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"success":true}`)
}

// next returns the next request or fails the test after wait.
func (s *server) next(t *testing.T) request {
	t.Helper()
	select {
	case r := <-s.reqs:
		return r
	case <-time.After(wait):
		t.Fatal("no request arrived")
		return request{}
	}
}

// requests returns every request received so far.
func (s *server) requests() []request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]request(nil), s.all...)
}

// messages returns every message received so far, across requests.
func (s *server) messages() []map[string]interface{} {
	var out []map[string]interface{}
	for _, r := range s.requests() {
		out = append(out, r.Body.Batch...)
	}
	return out
}

// batchSizes returns the sizes of the batches received, largest first:
// concurrent senders may deliver batches in any order.
func (s *server) batchSizes() []int {
	var out []int
	for _, r := range s.requests() {
		out = append(out, len(r.Body.Batch))
	}
	sort.Sort(sort.Reverse(sort.IntSlice(out)))
	return out
}

// logBuffer is a goroutine-safe log sink.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) mustContain(t *testing.T, subs ...string) {
	t.Helper()
	s := b.String()
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			t.Errorf("log lacks %q; log:\n%s", sub, s)
		}
	}
}

// newTestClient returns a client for s with a captured log, fast retries and
// no timer flushes unless the test sets FlushAfter. It is closed at cleanup.
func newTestClient(t *testing.T, s *server) (*Client, *logBuffer) {
	t.Helper()
	t.Setenv("DEBUG", "")
	logs := &logBuffer{}
	c := New("wk_test")
	c.Endpoint = s.URL
	c.Logger = log.New(logs, "", 0)
	c.FlushAfter = time.Hour
	c.backoffMin = time.Millisecond
	c.backoffMax = 5 * time.Millisecond
	t.Cleanup(func() { _ = c.Close() })
	return c, logs
}

func track(i int) *Track {
	return &Track{UserId: "u", Event: "e", Properties: map[string]interface{}{"i": i}}
}

func mustNil(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
