package analytics

// Every exported identifier of analytics-go v2.1 (Version, Endpoint,
// DefaultContext, Backo, Message, Batch, Identify, Group, Track, Page, Alias,
// Client and its exported fields, New and the Client methods), used with its
// v2 type and, for the structs, in v2's field order through positional
// literals. If any of them drifts, this file stops compiling. It is in the
// package itself because go vet rejects positional literals of another
// package's structs; replace_test.go compiles the same literals in a separate
// v2 program, through v2's own import path.

import (
	"log"
	"net/http"
	"testing"
	"time"
)

// Constants in v2 are constants here: these are constant expressions.
const (
	v2Version  string = Version
	v2Endpoint string = Endpoint
)

var (
	v2Context map[string]interface{} = DefaultContext

	v2New func(string) *Client = New

	v2IdentifyFn func(*Client, *Identify) error = (*Client).Identify
	v2TrackFn    func(*Client, *Track) error    = (*Client).Track
	v2PageFn     func(*Client, *Page) error     = (*Client).Page
	v2GroupFn    func(*Client, *Group) error    = (*Client).Group
	v2AliasFn    func(*Client, *Alias) error    = (*Client).Alias
	v2CloseFn    func(*Client) error            = (*Client).Close

	// v2's Backo was a *backo.Backo; its methods are here with their types.
	v2BackoDuration func(int) time.Duration = Backo.Duration
	v2BackoSleep    func(int)               = Backo.Sleep
)

type m = map[string]interface{}

// Positional literals: each field in v2's order with v2's type.
var (
	v2Message  = Message{"type", "message-id", "2016-01-02T15:04:05+0000", "sent-at"}
	v2Batch    = Batch{m{}, []interface{}{}, v2Message}
	v2Identify = Identify{m{}, m{}, m{"name": "Ada"}, "anon", "user", v2Message}
	v2Group    = Group{m{}, m{}, m{"name": "Initech"}, "anon", "user", "group", v2Message}
	v2Track    = Track{m{}, m{}, m{"plan": "pro"}, "anon", "user", "Signed Up", v2Message}
	v2Page     = Page{m{}, m{}, m{"url": "https://example.com"}, "anon", "user", "Docs", "Home", v2Message}
	v2Alias    = Alias{"prev", "user", v2Message}
)

// The Client's exported fields, each with its v2 type.
func v2ClientFields(c *Client) {
	var (
		_ *string        = &c.Endpoint
		_ *time.Duration = &c.Interval
		_ *int           = &c.Size
		_ **log.Logger   = &c.Logger
		_ *bool          = &c.Verbose
		_ *http.Client   = &c.Client
	)
}

func TestV2APICompiles(t *testing.T) {
	// The file compiling is the test; these checks keep the values honest.
	if v2Endpoint != DefaultEndpoint || v2Version == "" || v2Context["library"] == nil {
		t.Fatalf("Endpoint %q, Version %q, DefaultContext %v", v2Endpoint, v2Version, v2Context)
	}
	if v2Alias.PreviousId != "prev" || v2Alias.UserId != "user" || v2Alias.MessageId != "message-id" {
		t.Fatalf("positional Alias fields landed in the wrong place: %+v", v2Alias)
	}
	if v2Track.Event != "Signed Up" || v2Page.Category != "Docs" || v2Page.Name != "Home" || v2Group.GroupId != "group" {
		t.Fatalf("positional fields landed in the wrong place: %+v %+v %+v", v2Track, v2Page, v2Group)
	}
	if d := v2BackoDuration(3); d != 800*time.Millisecond {
		t.Fatalf("Backo.Duration(3) = %s, want 800ms (v2's default policy)", d)
	}
	_, _, _, _, _, _, _, _, _ = v2New, v2IdentifyFn, v2TrackFn, v2PageFn, v2GroupFn, v2AliasFn, v2CloseFn, v2BackoSleep, v2Batch
	_, _ = v2ClientFields, v2Identify
}
