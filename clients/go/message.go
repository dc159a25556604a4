package analytics

// Message holds the fields common to every message. It is embedded, as in
// v2, so msg.Timestamp and msg.MessageId work on every message type.
type Message struct {
	// Type is set by the client from the method called; any value given is
	// replaced.
	Type string `json:"type,omitempty"`
	// MessageId is generated (a random UUID) when empty. The daemon uses it
	// to drop duplicates, so set it only to a value unique per event.
	MessageId string `json:"messageId,omitempty"`
	// Timestamp is when the event happened, ISO 8601 / RFC 3339 ("Z",
	// "+00:00" or "+0000" offsets, with or without fractions). It is sent in
	// UTC with milliseconds; when empty the time of the call is used. Set it
	// to import historical data.
	Timestamp string `json:"timestamp,omitempty"`
	// SentAt is kept for v2 compatibility and ignored: the client stamps
	// sentAt on each request.
	SentAt string `json:"sentAt,omitempty"`
}

// Identify ties a user to their traits.
type Identify struct {
	Context      map[string]interface{} `json:"context,omitempty"`
	Integrations map[string]interface{} `json:"integrations,omitempty"`
	Traits       map[string]interface{} `json:"traits,omitempty"`
	AnonymousId  string                 `json:"anonymousId,omitempty"`
	UserId       string                 `json:"userId,omitempty"`
	Message
}

// Track records an action a user performed.
type Track struct {
	Context      map[string]interface{} `json:"context,omitempty"`
	Integrations map[string]interface{} `json:"integrations,omitempty"`
	Properties   map[string]interface{} `json:"properties,omitempty"`
	AnonymousId  string                 `json:"anonymousId,omitempty"`
	UserId       string                 `json:"userId,omitempty"`
	Event        string                 `json:"event"`
	Message
}

// Page records a page view. Traits travels as "properties" on the wire, as
// it did in v2; url, title, referrer and path are the well-known keys.
type Page struct {
	Context      map[string]interface{} `json:"context,omitempty"`
	Integrations map[string]interface{} `json:"integrations,omitempty"`
	Traits       map[string]interface{} `json:"properties,omitempty"`
	AnonymousId  string                 `json:"anonymousId,omitempty"`
	UserId       string                 `json:"userId,omitempty"`
	Category     string                 `json:"category,omitempty"`
	Name         string                 `json:"name,omitempty"`
	Message
}

// Group associates a user with a group and records the group's traits.
type Group struct {
	Context      map[string]interface{} `json:"context,omitempty"`
	Integrations map[string]interface{} `json:"integrations,omitempty"`
	Traits       map[string]interface{} `json:"traits,omitempty"`
	AnonymousId  string                 `json:"anonymousId,omitempty"`
	UserId       string                 `json:"userId,omitempty"`
	GroupId      string                 `json:"groupId"`
	Message
}

// Alias associates a new identity (UserId) with a previous one
// (PreviousId). Its fields are exactly v2's, in v2's order, so positional
// literals such as Alias{"prev", "user", msg} compile; it therefore has no
// Context or Integrations of its own.
type Alias struct {
	PreviousId string `json:"previousId"`
	UserId     string `json:"userId"`
	Message
}

// Batch is the shape of a request body ({"batch": [...], "sentAt": ...}).
// The client builds its bodies directly; the type is kept from v2 so
// programs that name it still compile.
type Batch struct {
	Context  map[string]interface{} `json:"context,omitempty"`
	Messages []interface{}          `json:"batch"`
	Message
}
