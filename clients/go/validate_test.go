package analytics

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestValidation(t *testing.T) {
	s := newServer(t, nil)
	c, _ := newTestClient(t, s)
	c.Size = 1

	big := strings.Repeat("x", MaxMessageBytes)
	cases := []struct {
		name    string
		call    func() error
		wantErr error
		mention string
	}{
		{"identify without ids", func() error { return c.Identify(&Identify{Traits: map[string]interface{}{"a": 1}}) }, ErrInvalidMessage, "UserId or AnonymousId"},
		{"track without ids", func() error { return c.Track(&Track{Event: "e"}) }, ErrInvalidMessage, "UserId or AnonymousId"},
		{"track without event", func() error { return c.Track(&Track{UserId: "u"}) }, ErrInvalidMessage, "Event is required"},
		{"page without ids", func() error { return c.Page(&Page{Name: "Home"}) }, ErrInvalidMessage, "UserId or AnonymousId"},
		{"group without ids", func() error { return c.Group(&Group{GroupId: "g"}) }, ErrInvalidMessage, "UserId or AnonymousId"},
		{"group without groupId", func() error { return c.Group(&Group{UserId: "u"}) }, ErrInvalidMessage, "GroupId is required"},
		{"alias without userId", func() error { return c.Alias(&Alias{PreviousId: "p"}) }, ErrInvalidMessage, "UserId is required"},
		{"alias without previousId", func() error { return c.Alias(&Alias{UserId: "u"}) }, ErrInvalidMessage, "PreviousId is required"},
		{"alias with only a previous id is not enough", func() error { return c.Alias(&Alias{PreviousId: "p", Message: Message{MessageId: "m"}}) }, ErrInvalidMessage, "alias"},
		{"nil identify", func() error { return c.Identify(nil) }, ErrInvalidMessage, "nil"},
		{"nil track", func() error { return c.Track(nil) }, ErrInvalidMessage, "nil"},
		{"nil page", func() error { return c.Page(nil) }, ErrInvalidMessage, "nil"},
		{"nil group", func() error { return c.Group(nil) }, ErrInvalidMessage, "nil"},
		{"nil alias", func() error { return c.Alias(nil) }, ErrInvalidMessage, "nil"},
		{"over 32 KiB", func() error {
			return c.Track(&Track{UserId: "u", Event: "e", Properties: map[string]interface{}{"blob": big}})
		}, ErrMessageTooLarge, "limit is 32768"},
		{"bad timestamp", func() error {
			m := track(1)
			m.Timestamp = "yesterday"
			return c.Track(m)
		}, ErrInvalidMessage, "Timestamp"},
		{"messageId over 100 characters", func() error {
			m := track(1)
			m.MessageId = strings.Repeat("a", 101)
			return c.Track(m)
		}, ErrInvalidMessage, "MessageId"},
		{"NaN property", func() error {
			return c.Track(&Track{UserId: "u", Event: "e", Properties: map[string]interface{}{"revenue": math.NaN()}})
		}, ErrInvalidMessage, "JSON"},
		{"unencodable trait", func() error {
			return c.Identify(&Identify{UserId: "u", Traits: map[string]interface{}{"ch": make(chan int)}})
		}, ErrInvalidMessage, "JSON"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error %q does not mention %q", err, tc.mention)
			}
		})
	}

	// Nothing invalid was queued or sent.
	mustNil(t, c.Close())
	if st := c.Stats(); st.Accepted != 0 || st.Requests != 0 {
		t.Errorf("invalid messages were queued: %+v", st)
	}
	if n := len(s.requests()); n != 0 {
		t.Errorf("%d requests sent for invalid messages", n)
	}
}

func TestSizeLimitBoundary(t *testing.T) {
	s := newServer(t, nil)
	c, _ := newTestClient(t, s)
	c.Size = 1

	// Find the padding that makes the encoded message exactly the limit.
	m := &Track{UserId: "u", Event: "e", Properties: map[string]interface{}{"blob": ""}}
	m.MessageId = "fixed-id"
	m.Timestamp = "2026-11-21T10:00:00.000Z"
	w := &wire{typ: "track", msg: &m.Message, bodyKey: "properties", body: m.Properties, userID: m.UserId, event: m.Event}
	data, _, _, err := encodeMessage(nil, w, nil, time.Now())
	mustNil(t, err)
	m.Properties["blob"] = strings.Repeat("x", MaxMessageBytes-len(data))

	mustNil(t, c.Track(m)) // exactly 32 KiB: accepted
	if got := len(s.next(t).Body.Batch); got != 1 {
		t.Fatalf("got %d messages", got)
	}
	m.Properties["blob"] = strings.Repeat("x", MaxMessageBytes-len(data)+1)
	if err := c.Track(m); !errors.Is(err, ErrMessageTooLarge) {
		t.Fatalf("one byte over: err = %v", err)
	}
}
