//go:build v3compare

// Package compare measures clients/go side by side with segmentio
// analytics-go v3 (and, optionally, clients/go as it was at a base commit) in
// one test binary, in interleaved rounds. It is not part of the module's
// build: run.sh in this directory generates the go.mod that wires the
// clients together (see the README's "Compared with analytics-go v3").
package compare

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	efd "github.com/efd-dev/efd/clients/go"
	v3 "github.com/segmentio/analytics-go/v3"

	old "efd.local/oldclient"
)

// The message of every workload: a Track with three properties.
var props = map[string]interface{}{"revenue": 42.5, "currency": "EUR", "sku": "A-1"}

// client is what the workloads need from each library.
type client interface {
	track() error
	close() error
}

type lib struct {
	name string
	// open returns a client at its defaults, sending to url; batch > 0 sets
	// the flush count (FlushAt / BatchSize).
	open func(url string, batch int) client
}

var quiet = log.New(io.Discard, "", 0)

type efdClient struct{ c *efd.Client }

func (e efdClient) track() error {
	return e.c.Track(&efd.Track{UserId: "user-1", Event: "Order Completed", Properties: props})
}
func (e efdClient) close() error { return e.c.Close() }

type oldClient struct{ c *old.Client }

func (e oldClient) track() error {
	return e.c.Track(&old.Track{UserId: "user-1", Event: "Order Completed", Properties: props})
}
func (e oldClient) close() error { return e.c.Close() }

type v3Client struct{ c v3.Client }

func (e v3Client) track() error {
	return e.c.Enqueue(v3.Track{UserId: "user-1", Event: "Order Completed", Properties: props})
}
func (e v3Client) close() error { return e.c.Close() }

var libs = []lib{
	{"clients/go", func(url string, batch int) client {
		c := efd.New("wk_bench")
		c.Endpoint, c.Logger = url, quiet
		if batch > 0 {
			c.FlushAt = batch
		}
		return efdClient{c}
	}},
	{"analytics-go v3", func(url string, batch int) client {
		c, err := v3.NewWithConfig("wk_bench", v3.Config{Endpoint: url, BatchSize: batch, Logger: v3.StdLogger(quiet)})
		if err != nil {
			panic(err)
		}
		return v3Client{c}
	}},
	{"clients/go at base", func(url string, batch int) client {
		c := old.New("wk_bench")
		c.Endpoint, c.Logger = url, quiet
		if batch > 0 {
			c.FlushAt = batch
		}
		return oldClient{c}
	}},
}

// server answers 200 at once and counts the track messages it received; both
// libraries put "type":"track" once in each message.
type server struct {
	*httptest.Server
	got  atomic.Int64
	mode atomic.Int32 // 0: 200; 1: hang until the request ends; 2: 500
	pool sync.Pool
}

var trackKey = []byte(`"type":"track"`)

func newServer() *server {
	s := &server{}
	s.pool.New = func() any { b := make([]byte, 0, 1<<20); return &b }
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch s.mode.Load() {
		case 1:
			// Read the body, so the server notices the client leave, then
			// never answer.
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done()
			return
		case 2:
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(500)
			return
		}
		bp := s.pool.Get().(*[]byte)
		buf := bytes.NewBuffer((*bp)[:0])
		_, _ = buf.ReadFrom(r.Body)
		s.got.Add(int64(bytes.Count(buf.Bytes(), trackKey)))
		*bp = buf.Bytes()
		s.pool.Put(bp)
		_, _ = io.WriteString(w, `{"success":true}`)
	}))
	return s
}

func rounds() int {
	if n, err := strconv.Atoi(os.Getenv("COMPARE_ROUNDS")); err == nil && n >= 0 {
		return n
	}
	return 7
}

// results[row][lib] collects one figure per round.
type results map[string]map[string][]float64

func (r results) add(row, lib string, v float64) {
	if r[row] == nil {
		r[row] = map[string][]float64{}
	}
	r[row][lib] = append(r[row][lib], v)
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// order rotates the libraries each round so none always runs first.
func order(round int) []lib {
	out := make([]lib, len(libs))
	for i := range libs {
		out[i] = libs[(i+round)%len(libs)]
	}
	return out
}

// perCall is b.N Track calls at defaults against the fast server: the time
// and allocations per call as the caller sees them, background work included.
func perCall(l lib, srv *server) (nsPerOp, allocsPerOp float64) {
	res := testing.Benchmark(func(b *testing.B) {
		c := l.open(srv.URL, 0)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			_ = c.track()
		}
		b.StopTimer()
		_ = c.close()
	})
	return float64(res.NsPerOp()), float64(res.AllocsPerOp())
}

// tightLoop makes n calls from g goroutines and returns the calls refused with
// an error and the messages the server received.
func tightLoop(l lib, srv *server, n, g int) (refused, delivered int64) {
	before := srv.got.Load()
	c := l.open(srv.URL, 0)
	var wg sync.WaitGroup
	var ref atomic.Int64
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n / g {
				if c.track() != nil {
					ref.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	_ = c.close()
	return ref.Load(), srv.got.Load() - before
}

// throughput is n events from the first call until Close returns.
func throughput(l lib, srv *server, n, batch int) (eventsPerSec float64, delivered int64) {
	before := srv.got.Load()
	start := time.Now()
	c := l.open(srv.URL, batch)
	for range n {
		_ = c.track()
	}
	_ = c.close()
	return float64(n) / time.Since(start).Seconds(), srv.got.Load() - before
}

func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// hung makes n calls against a server that never answers and returns the heap
// the client holds after them, the calls refused, and how long the calls took.
func hung(l lib, n int) (heapMB float64, refused int64, took time.Duration) {
	srv := newServer()
	srv.mode.Store(1)
	defer srv.Close()
	base := heapAlloc()
	c := l.open(srv.URL, 0)
	start := time.Now()
	for range n {
		if c.track() != nil {
			refused++
		}
	}
	took = time.Since(start)
	heapMB = float64(int64(heapAlloc())-int64(base)) / (1 << 20)
	srv.CloseClientConnections()
	_ = c.close()
	return heapMB, refused, took
}

// outage sends n events to a server that answers 500 for the first 3 s, then
// 200, and calls Close at once; it returns how many the server accepted.
func outage(l lib, n int) (delivered int64, closeTook time.Duration) {
	srv := newServer()
	defer srv.Close()
	srv.mode.Store(2)
	timer := time.AfterFunc(3*time.Second, func() { srv.mode.Store(0) })
	defer timer.Stop()
	c := l.open(srv.URL, 0)
	for range n {
		_ = c.track()
	}
	start := time.Now()
	_ = c.close()
	return srv.got.Load(), time.Since(start)
}

func TestCompare(t *testing.T) {
	srv := newServer()
	defer srv.Close()
	r := results{}
	const tight, events = 1_000_000, 200_000
	n := rounds()
	for round := range n {
		for _, l := range order(round) {
			ns, allocs := perCall(l, srv)
			r.add("one Track call, ns/op", l.name, ns)
			r.add("allocations per call", l.name, allocs)
		}
		for _, l := range order(round) {
			for _, batch := range []int{20, 250} {
				eps, got := throughput(l, srv, events, batch)
				r.add(fmt.Sprintf("%d events, FlushAt %d, events/s", events, batch), l.name, eps)
				r.add(fmt.Sprintf("%d events, FlushAt %d, delivered", events, batch), l.name, float64(got))
			}
		}
		for _, l := range order(round) {
			for _, g := range []int{1, 2} {
				ref, got := tightLoop(l, srv, tight, g)
				r.add(fmt.Sprintf("tight loop %d calls, %d goroutine(s): refused", tight, g), l.name, float64(ref))
				r.add(fmt.Sprintf("tight loop %d calls, %d goroutine(s): delivered", tight, g), l.name, float64(got))
			}
		}
		t.Logf("round %d of %d done", round+1, n)
	}
	if os.Getenv("COMPARE_FAILURES") != "" {
		for _, l := range libs {
			heap, ref, took := hung(l, tight)
			r.add("hung server, 1,000,000 calls: heap kept, MB", l.name, heap)
			r.add("hung server, 1,000,000 calls: refused", l.name, float64(ref))
			r.add("hung server, 1,000,000 calls: seconds for the calls", l.name, took.Seconds())
			got, closeTook := outage(l, 1000)
			r.add("500s for 3 s then 200, Close at once: of 1000 delivered", l.name, float64(got))
			r.add("500s for 3 s then 200, Close at once: Close seconds", l.name, closeTook.Seconds())
		}
	}
	report(t, r, n)
}

func report(t *testing.T, r results, n int) {
	rows := make([]string, 0, len(r))
	for row := range r {
		rows = append(rows, row)
	}
	sort.Strings(rows)
	var b strings.Builder
	fmt.Fprintf(&b, "\nmedians of %d interleaved rounds; %s, %d CPUs, %s\n", n, runtime.Version(), runtime.NumCPU(), time.Now().UTC().Format(time.DateOnly))
	fmt.Fprintf(&b, "| | %s | %s | %s | clients/go ÷ v3 |\n|---|---|---|---|---|\n", libs[0].name, libs[1].name, libs[2].name)
	for _, row := range rows {
		m := [3]float64{}
		for i, l := range libs {
			m[i] = median(r[row][l.name])
		}
		ratio := "–"
		if m[1] != 0 {
			ratio = fmt.Sprintf("%.2f", m[0]/m[1])
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", row, num(m[0]), num(m[1]), num(m[2]), ratio)
		if os.Getenv("COMPARE_ALL") != "" {
			for _, l := range libs {
				fmt.Fprintf(&b, "|   %s rounds | %v |\n", l.name, r[row][l.name])
			}
		}
	}
	t.Log(b.String())
}

func num(v float64) string {
	if v == float64(int64(v)) {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

var _ = errors.Is
