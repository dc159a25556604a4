package analytics

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
)

const (
	// LibraryName and Version are sent as context.library on every message.
	LibraryName = "efd-analytics-go"
	// Version of this client.
	Version = "1.0.0"

	// MaxMessageBytes is the largest encoded message accepted (32 KiB).
	MaxMessageBytes = 32 << 10
	// MaxBatchBytes is the largest request body sent (500 KiB).
	MaxBatchBytes = 500 << 10
	// MaxBatchMessages is the daemon's limit on messages per request; the
	// flush count is capped at it.
	MaxBatchMessages = 2500
	// maxMessageIDLen is the daemon's limit on a given messageId.
	maxMessageIDLen = 100

	wireTimeLayout = "2006-01-02T15:04:05.000Z07:00"
)

// Layouts accepted for a caller's Timestamp: RFC 3339 with "Z" or "+00:00",
// and the "+0000" form v2 itself produced; fractions are optional in both.
var timestampLayouts = []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999Z0700"}

// item is one encoded message waiting in the queue; id is kept for logs.
type item struct {
	id   string
	data []byte
}

// prepare fills the common fields on the caller's copy of a message: type,
// messageId, a normalised timestamp, and a context that carries the library.
func prepare(typ string, m *Message, ctx *map[string]interface{}, defaults map[string]interface{}, now time.Time) error {
	m.Type = typ
	m.SentAt = ""
	if m.MessageId == "" {
		m.MessageId = newMessageID()
	} else if len(m.MessageId) > maxMessageIDLen {
		return invalid(typ, "MessageId is %d characters, the limit is %d", len(m.MessageId), maxMessageIDLen)
	}
	if m.Timestamp == "" {
		m.Timestamp = now.UTC().Format(wireTimeLayout)
	} else {
		ts, err := parseTimestamp(m.Timestamp)
		if err != nil {
			return invalid(typ, "Timestamp %q is not ISO 8601 (RFC 3339)", m.Timestamp)
		}
		m.Timestamp = ts.UTC().Format(wireTimeLayout)
	}
	*ctx = mergeContext(defaults, *ctx)
	return nil
}

func parseTimestamp(s string) (time.Time, error) {
	var err error
	for _, layout := range timestampLayouts {
		var t time.Time
		if t, err = time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, err
}

// mergeContext returns a new map of the defaults, overridden by the
// message's context, with library always ours. Neither input is modified,
// so one Context can be shared by many goroutines and calls.
func mergeContext(defaults, ctx map[string]interface{}) map[string]interface{} {
	out := make(map[string]interface{}, len(defaults)+len(ctx)+1)
	for k, v := range defaults {
		out[k] = v
	}
	for k, v := range ctx {
		out[k] = v
	}
	out["library"] = library
	return out
}

// library is shared by every message; it is only ever read.
var library = map[string]interface{}{"name": LibraryName, "version": Version}

// encode marshals a prepared message and enforces the per-message limit.
// HTML escaping is off so URLs keep their "&" and the size is what the
// daemon sees.
func encode(typ string, v interface{}) ([]byte, error) {
	// Most messages are a few hundred bytes: start there rather than grow.
	buf := bytes.NewBuffer(make([]byte, 0, 512))
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, invalid(typ, "cannot encode as JSON: %v", err)
	}
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if len(b) > MaxMessageBytes {
		return nil, fmt.Errorf("%w: %s is %d bytes encoded, the limit is %d", ErrMessageTooLarge, typ, len(b), MaxMessageBytes)
	}
	return b, nil
}

// newMessageID returns a random (version 4) UUID.
func newMessageID() string {
	var u [16]byte
	_, _ = rand.Read(u[:]) // never fails: guaranteed since Go 1.24
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:], u[10:])
	return string(s[:])
}

// batchBody frames encoded messages as the daemon's batch payload.
func batchBody(items []item, sentAt time.Time) []byte {
	size := batchOverhead
	for _, it := range items {
		size += len(it.data) + 1
	}
	b := make([]byte, 0, size)
	b = append(b, `{"batch":[`...)
	for i, it := range items {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, it.data...)
	}
	b = append(b, `],"sentAt":"`...)
	b = sentAt.UTC().AppendFormat(b, wireTimeLayout)
	return append(b, `"}`...)
}

// batchOverhead is the size of a batch body without its messages.
const batchOverhead = len(`{"batch":[],"sentAt":""}`) + len("2006-01-02T15:04:05.000Z")
