package analytics_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
)

// A v2 program keeps its import path and go.mod gets one replace line
// (README, "Migrating from v2"). This builds such a program as its own
// module, offline, and runs it against a test server.
func TestV2ImportPathWithReplace(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a separate module")
	}
	goBin := findGo(t)
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	// The two import paths v2 programs use, with the versions their go.mod
	// files already require.
	for path, version := range map[string]string{
		"gopkg.in/segmentio/analytics-go.v2": "v2.1.0",
		"github.com/segmentio/analytics-go":  "v2.1.0+incompatible",
	} {
		t.Run(path, func(t *testing.T) {
			dir := t.TempDir()
			write(t, filepath.Join(dir, "go.mod"), "module example.com/v2app\n\ngo 1.23\n\n"+
				"require "+path+" "+version+"\n\n"+
				"replace "+path+" => "+filepath.ToSlash(here)+"\n")
			write(t, filepath.Join(dir, "main.go"), `package main

import (
	"os"

	"`+path+`"
)

// v2.1's Endpoint is a constant.
const segment = analytics.Endpoint

func main() {
	client := analytics.New("h97jamjwbh")
	client.Endpoint = os.Args[1]
	client.Size = 1
	client.Track(&analytics.Track{Event: "Download", UserId: "123456",
		Properties: map[string]interface{}{"platform": "osx"}})
	// Positional literals, in v2's field order.
	msg := analytics.Message{"", "", "", ""}
	client.Alias(&analytics.Alias{"anon-1", "123456", msg})
	client.Identify(&analytics.Identify{nil, nil, map[string]interface{}{"plan": "pro"}, "", "123456", msg})
	_ = analytics.Backo.Duration(1)
	if err := client.Close(); err != nil {
		panic(err)
	}
	_ = segment
}
`)
			bin := filepath.Join(dir, "v2app")
			build := exec.Command(goBin, "build", "-o", bin, ".")
			build.Dir = dir
			build.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off", "GOTOOLCHAIN=local")
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("v2 program with replace does not build: %v\n%s", err, out)
			}

			var mu sync.Mutex
			var events []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var body struct {
					Batch []struct{ Type, Event string } `json:"batch"`
				}
				_ = json.NewDecoder(r.Body).Decode(&body)
				mu.Lock()
				for _, m := range body.Batch {
					events = append(events, m.Type+":"+m.Event)
				}
				mu.Unlock()
				io.WriteString(w, `{"success":true}`)
			}))
			defer srv.Close()
			if out, err := exec.Command(bin, srv.URL).CombinedOutput(); err != nil {
				t.Fatalf("v2 program failed: %v\n%s", err, out)
			}
			mu.Lock()
			defer mu.Unlock()
			sort.Strings(events) // concurrent senders: any order
			if strings.Join(events, ",") != "alias:,identify:,track:Download" {
				t.Fatalf("server got events %v", events)
			}
		})
	}
}

// findGo locates the toolchain running this test; nothing assumes a path.
func findGo(t *testing.T) string {
	t.Helper()
	exe := "go"
	if runtime.GOOS == "windows" {
		exe += ".exe"
	}
	for _, root := range []string{os.Getenv("GOROOT"), runtime.GOROOT()} {
		if root == "" {
			continue
		}
		if p := filepath.Join(root, "bin", exe); fileExists(p) {
			return p
		}
	}
	p, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command found to build the v2 program")
	}
	return p
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
