package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync"
	"testing"
)

// The end-to-end test in the repository checks these exact values at a
// webhook receiver; this pins them on the client side.
func TestExampleSendsTheFiveMessages(t *testing.T) {
	var mu sync.Mutex
	var got []map[string]interface{}
	var user string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Batch []map[string]interface{} }
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			t.Error(err)
		}
		mu.Lock()
		user, _, _ = r.BasicAuth()
		got = append(got, body.Batch...)
		mu.Unlock()
		io.WriteString(w, `{"success":true}`)
	}))
	defer srv.Close()
	t.Setenv("EFD_ENDPOINT", srv.URL)
	t.Setenv("EFD_WRITE_KEY", "")

	if err := run(); err != nil {
		t.Fatal(err)
	}
	want := []map[string]interface{}{
		{"type": "identify", "userId": "go-user-1", "traits": map[string]interface{}{"name": "Ada", "plan": "pro"}},
		{"type": "track", "userId": "go-user-1", "event": "Order Completed", "properties": map[string]interface{}{"revenue": 42.5}},
		{"type": "page", "userId": "go-user-1", "name": "Home", "properties": map[string]interface{}{"url": "https://example.com/", "title": "Home"}},
		{"type": "group", "userId": "go-user-1", "groupId": "g-1", "traits": map[string]interface{}{"name": "Acme"}},
		{"type": "alias", "userId": "go-user-1", "previousId": "anon-1"},
	}
	mu.Lock()
	defer mu.Unlock()
	if user != "wk_live_123" {
		t.Errorf("write key %q, want the default wk_live_123", user)
	}
	if len(got) != len(want) {
		t.Fatalf("got %d messages, want %d", len(got), len(want))
	}
	for i, m := range got {
		for k, v := range want[i] {
			if !reflect.DeepEqual(m[k], v) {
				t.Errorf("message %d: %s = %#v, want %#v", i, k, m[k], v)
			}
		}
	}
}

func TestExampleFailsWhenTheDaemonRefuses(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"success":false,"code":"unknown_write_key","message":"unknown write key"}`)
	}))
	defer srv.Close()
	t.Setenv("EFD_ENDPOINT", srv.URL)
	t.Setenv("EFD_WRITE_KEY", "wk_wrong")
	if err := run(); err == nil {
		t.Fatal("run succeeded although every message was refused")
	}
}
