package analytics

import (
	"reflect"
	"regexp"
	"testing"
)

var (
	uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	timeRE = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`)
)

func TestWireFormat(t *testing.T) {
	s := newServer(t, nil)
	c, _ := newTestClient(t, s)
	c.FlushAt = 5

	userCtx := map[string]interface{}{"ip": "203.0.113.9"}
	integrations := map[string]interface{}{"All": false, "Webhooks": true}
	page := &Page{
		AnonymousId: "anon-9", Name: "Home", Category: "Docs",
		Traits:  map[string]interface{}{"url": "https://example.com/?a=1&b=2", "title": "Home"},
		Context: userCtx, Integrations: integrations,
	}
	before := *page
	mustNil(t, c.Identify(&Identify{UserId: "u1", Traits: map[string]interface{}{"plan": "pro"}}))
	mustNil(t, c.Track(&Track{UserId: "u1", Event: "Order Completed", Properties: map[string]interface{}{"revenue": 42.5}}))
	mustNil(t, c.Page(page))
	mustNil(t, c.Group(&Group{UserId: "u1", GroupId: "g-1", Traits: map[string]interface{}{"name": "Acme"}}))
	mustNil(t, c.Alias(&Alias{UserId: "u1", PreviousId: "anon-1"}))

	r := s.next(t)
	if r.Method != "POST" || r.Path != "/v1/batch" {
		t.Errorf("got %s %s, want POST /v1/batch", r.Method, r.Path)
	}
	if !r.HasAuth || r.User != "wk_test" || r.Password != "" {
		t.Errorf("basic auth = %q:%q (present %v), want wk_test with empty password", r.User, r.Password, r.HasAuth)
	}
	if got := r.Header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type = %q", got)
	}
	if got := r.Header.Get("User-Agent"); got != LibraryName+"/"+Version {
		t.Errorf("User-Agent = %q", got)
	}
	if !timeRE.MatchString(r.Body.SentAt) {
		t.Errorf("sentAt = %q, want ISO 8601 UTC with milliseconds", r.Body.SentAt)
	}
	if len(r.Raw) > MaxBatchBytes {
		t.Errorf("body is %d bytes", len(r.Raw))
	}

	want := []map[string]interface{}{
		{"type": "identify", "userId": "u1", "traits": map[string]interface{}{"plan": "pro"}},
		{"type": "track", "userId": "u1", "event": "Order Completed", "properties": map[string]interface{}{"revenue": 42.5}},
		{"type": "page", "anonymousId": "anon-9", "name": "Home", "category": "Docs",
			"properties":   map[string]interface{}{"url": "https://example.com/?a=1&b=2", "title": "Home"},
			"integrations": map[string]interface{}{"All": false, "Webhooks": true}},
		{"type": "group", "userId": "u1", "groupId": "g-1", "traits": map[string]interface{}{"name": "Acme"}},
		{"type": "alias", "userId": "u1", "previousId": "anon-1"},
	}
	if len(r.Body.Batch) != len(want) {
		t.Fatalf("batch has %d messages, want %d", len(r.Body.Batch), len(want))
	}
	library := map[string]interface{}{"name": LibraryName, "version": Version}
	for i, m := range r.Body.Batch {
		if !uuidRE.MatchString(m["messageId"].(string)) {
			t.Errorf("message %d: messageId %v is not a UUID", i, m["messageId"])
		}
		if !timeRE.MatchString(m["timestamp"].(string)) {
			t.Errorf("message %d: timestamp %v, want ISO 8601 UTC with milliseconds", i, m["timestamp"])
		}
		ctx := m["context"].(map[string]interface{})
		if !reflect.DeepEqual(ctx["library"], library) {
			t.Errorf("message %d: context.library = %v", i, ctx["library"])
		}
		if _, ok := m["sentAt"]; ok {
			t.Errorf("message %d carries sentAt; it belongs to the batch", i)
		}
		for k, v := range want[i] {
			if !reflect.DeepEqual(m[k], v) {
				t.Errorf("message %d: %s = %#v, want %#v", i, k, m[k], v)
			}
		}
		wantKeys := len(want[i]) + 3 // messageId, timestamp, context
		if len(m) != wantKeys {
			t.Errorf("message %d has keys %v, want %d keys", i, keys(m), wantKeys)
		}
	}
	if ip := r.Body.Batch[2]["context"].(map[string]interface{})["ip"]; ip != "203.0.113.9" {
		t.Errorf("caller context lost: ip = %v", ip)
	}
	// The caller's message and maps are untouched, so they can be reused.
	if !reflect.DeepEqual(*page, before) || page.MessageId != "" || page.Type != "" {
		t.Errorf("caller's Page was modified: %+v", *page)
	}
	if len(userCtx) != 1 {
		t.Errorf("caller's Context map was modified: %v", userCtx)
	}
}

func keys(m map[string]interface{}) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestGivenMessageIdAndTimestamp(t *testing.T) {
	s := newServer(t, nil)
	c, _ := newTestClient(t, s)
	c.FlushAt = 4

	cases := []struct{ in, want string }{
		{"2026-11-21T10:00:00.000Z", "2026-11-21T10:00:00.000Z"},
		{"2026-11-21T12:00:00+02:00", "2026-11-21T10:00:00.000Z"},
		{"2026-11-21T10:00:00+0000", "2026-11-21T10:00:00.000Z"}, // v2's own format
		{"2026-11-21T10:00:00.123456Z", "2026-11-21T10:00:00.123Z"},
	}
	for i, tc := range cases {
		m := track(i)
		m.MessageId = "my-id-" + tc.in
		m.Timestamp = tc.in
		mustNil(t, c.Track(m))
	}
	r := s.next(t)
	for i, m := range r.Body.Batch {
		if m["messageId"] != "my-id-"+cases[i].in {
			t.Errorf("messageId = %v, want the caller's", m["messageId"])
		}
		if m["timestamp"] != cases[i].want {
			t.Errorf("timestamp %q sent as %v, want %v", cases[i].in, m["timestamp"], cases[i].want)
		}
	}
}

func TestReusedMessageGetsFreshIds(t *testing.T) {
	s := newServer(t, nil)
	c, _ := newTestClient(t, s)
	c.FlushAt = 2
	m := track(1)
	mustNil(t, c.Track(m))
	mustNil(t, c.Track(m))
	ids := s.next(t).ids()
	if len(ids) != 2 || ids[0] == ids[1] {
		t.Fatalf("reusing a message must not reuse its messageId: %v", ids)
	}
}

func TestLibraryContextWinsOverCallers(t *testing.T) {
	s := newServer(t, nil)
	c, _ := newTestClient(t, s)
	c.Size = 1
	m := track(1)
	m.Context = map[string]interface{}{"library": "spoofed", "locale": "en"}
	mustNil(t, c.Track(m))
	ctx := s.next(t).Body.Batch[0]["context"].(map[string]interface{})
	if lib, _ := ctx["library"].(map[string]interface{}); lib["name"] != LibraryName || ctx["locale"] != "en" {
		t.Fatalf("context = %v", ctx)
	}
}

func TestDefaultContextMerged(t *testing.T) {
	saved := DefaultContext
	t.Cleanup(func() { DefaultContext = saved })
	DefaultContext = map[string]interface{}{"app": map[string]interface{}{"name": "shop"}, "locale": "de", "library": "ignored"}

	s := newServer(t, nil)
	c, _ := newTestClient(t, s)
	c.Size = 1
	m := track(1)
	m.Context = map[string]interface{}{"locale": "en"}
	mustNil(t, c.Track(m))
	got := s.next(t).Body.Batch[0]["context"].(map[string]interface{})
	want := map[string]interface{}{
		"app":     map[string]interface{}{"name": "shop"},
		"locale":  "en", // the message's own key wins
		"library": map[string]interface{}{"name": LibraryName, "version": Version},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("context = %v, want %v", got, want)
	}
}
