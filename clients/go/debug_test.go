package analytics

import (
	"io"
	"os"
	"strings"
	"testing"
)

func TestDebugLogging(t *testing.T) {
	for _, how := range []string{"DEBUG=analytics", "Verbose"} {
		t.Run(how, func(t *testing.T) {
			s := newServer(t, nil)
			c, logs := newTestClient(t, s)
			if how == "Verbose" {
				c.Verbose = true
			} else {
				t.Setenv("DEBUG", "analytics")
			}
			c.FlushAt = 2
			mustNil(t, c.Track(track(1)))
			mustNil(t, c.Track(track(2)))
			s.next(t)
			mustNil(t, c.Close())
			logs.mustContain(t,
				"debug: start: endpoint="+s.URL+"/v1/batch flushAt=2",
				"debug: buffer: track ", "(1/2 queued)", "(2/2 queued)",
				"debug: flush (count): 2 messages",
				"debug: request: POST "+s.URL+"/v1/batch: 2 messages",
				"debug: response: 200 OK in ",
				"debug: close: done: 2 delivered",
			)
		})
	}
}

func TestNoDebugLoggingByDefault(t *testing.T) {
	s := newServer(t, nil)
	c, logs := newTestClient(t, s) // sets DEBUG=""
	mustNil(t, c.Track(track(1)))
	mustNil(t, c.Close())
	if len(s.messages()) != 1 {
		t.Fatal("message not delivered")
	}
	if got := logs.String(); got != "" {
		t.Fatalf("quiet client logged:\n%s", got)
	}
}

func TestDebugEnvValues(t *testing.T) {
	for v, want := range map[string]bool{
		"analytics": true, "analytics:*": true, "*": true, "express,analytics": true,
		"http analytics*": true, "": false, "analytics-node": false, "express": false,
	} {
		if got := debugEnv(v); got != want {
			t.Errorf("DEBUG=%q: %v, want %v", v, got, want)
		}
	}
}

// New's Logger writes to stderr, where DEBUG=analytics output belongs.
func TestDefaultLoggerWritesToStderr(t *testing.T) {
	s := newServer(t, nil)
	t.Setenv("DEBUG", "analytics")
	r, w, err := os.Pipe()
	mustNil(t, err)
	stderr := os.Stderr
	os.Stderr = w
	c := New("wk_test")
	os.Stderr = stderr

	c.Endpoint = s.URL
	mustNil(t, c.Track(track(1)))
	mustNil(t, c.Close())
	w.Close()
	out, err := io.ReadAll(r)
	mustNil(t, err)
	if !strings.Contains(string(out), "analytics ") || !strings.Contains(string(out), "debug: request: POST") {
		t.Fatalf("stderr got:\n%s", out)
	}
}
