package analytics_test

// This file is written the way programs for segmentio analytics-go v2 were;
// only the import path differs. That it compiles is half the test.

import (
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	analytics "github.com/efd-dev/efd/clients/go"
)

func TestV2ProgramUnchanged(t *testing.T) {
	var mu sync.Mutex
	var types []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Batch []struct {
				Type string `json:"type"`
			} `json:"batch"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		for _, m := range body.Batch {
			types = append(types, m.Type)
		}
		mu.Unlock()
		io.WriteString(w, `{"success":true}`)
	}))
	defer srv.Close()

	// --- v2 program starts ---
	client := analytics.New("h97jamjwbh")
	client.Endpoint = srv.URL
	client.Interval = 30 * time.Second
	client.Size = 100
	client.Verbose = false
	client.Logger = log.New(io.Discard, "segment ", log.LstdFlags)
	client.Client = http.Client{Timeout: 5 * time.Second}

	client.Identify(&analytics.Identify{
		UserId: "019mr8mf4r",
		Traits: map[string]interface{}{"name": "Michael Bolton", "email": "mbolton@example.com"},
	})
	track := &analytics.Track{
		Event:      "Signed Up",
		UserId:     "019mr8mf4r",
		Properties: map[string]interface{}{"plan": "Enterprise"},
	}
	track.Timestamp = "2016-01-02T15:04:05+0000" // historical import, v2 style
	client.Track(track)
	client.Page(&analytics.Page{
		UserId:   "019mr8mf4r",
		Category: "Docs",
		Name:     "Go library",
		Traits:   map[string]interface{}{"url": "https://example.com/docs/go/"},
	})
	client.Group(&analytics.Group{
		UserId:  "019mr8mf4r",
		GroupId: "56",
		Traits:  map[string]interface{}{"name": "Initech"},
		Message: analytics.Message{MessageId: "group-56"},
	})
	err := client.Alias(&analytics.Alias{PreviousId: "anon", UserId: "019mr8mf4r"})
	if err != nil {
		panic(err)
	}
	client.Close()
	_, _, _ = analytics.Version, analytics.Endpoint, analytics.DefaultContext["library"]
	var _ analytics.Batch
	// --- v2 program ends ---

	mu.Lock()
	defer mu.Unlock()
	if len(types) != 5 {
		t.Fatalf("server got %v, want all five message types", types)
	}
}
