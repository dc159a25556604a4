package analytics

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
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

// item is one encoded message waiting in the queue. data[idStart:idEnd] is
// its messageId as encoded, kept for logs without a string per message.
type item struct {
	data           []byte
	idStart, idEnd uint16
}

func (it item) id() string { return string(it.data[it.idStart:it.idEnd]) }

// wire is a validated message as the encoder sees it. The methods build it
// on the stack from the caller's struct, which is only read: no copy of the
// struct or its maps is made, and the caller may reuse them at once.
type wire struct {
	typ          string
	msg          *Message
	context      map[string]interface{}
	integrations map[string]interface{}
	bodyKey      string // "properties" or "traits"
	body         map[string]interface{}
	anonymousID  string
	userID       string
	// Type-specific strings, all required or omitted when empty.
	event, name, category, groupID, previousID string
}

// encodeMessage appends w as one JSON object. Keys are written directly
// rather than through encoding/json's reflection, which is most of what a
// call used to cost; values of types the encoder does not know (structs,
// time.Time, json.Marshaler, named map types, ...) still go through
// encoding/json, so their output is unchanged.
func encodeMessage(b []byte, w *wire, defaults map[string]interface{}, now time.Time) (out []byte, idStart, idEnd int, err error) {
	start := len(b)
	b = append(b, `{"type":"`...)
	b = append(b, w.typ...)
	b = append(b, `","messageId":"`...)
	idStart = len(b) - start
	if w.msg.MessageId == "" {
		b = appendUUID(b)
	} else {
		if len(w.msg.MessageId) > maxMessageIDLen {
			return b, 0, 0, invalid(w.typ, "MessageId is %d characters, the limit is %d", len(w.msg.MessageId), maxMessageIDLen)
		}
		b = appendStringBody(b, w.msg.MessageId)
	}
	idEnd = len(b) - start
	b = append(b, `","timestamp":"`...)
	if w.msg.Timestamp == "" {
		b = now.UTC().AppendFormat(b, wireTimeLayout)
	} else {
		ts, perr := parseTimestamp(w.msg.Timestamp)
		if perr != nil {
			return b, 0, 0, invalid(w.typ, "Timestamp %q is not ISO 8601 (RFC 3339)", w.msg.Timestamp)
		}
		b = ts.UTC().AppendFormat(b, wireTimeLayout)
	}
	b = append(b, '"')
	b = appendField(b, "anonymousId", w.anonymousID)
	b = appendField(b, "userId", w.userID)
	b = appendField(b, "event", w.event)
	b = appendField(b, "name", w.name)
	b = appendField(b, "category", w.category)
	b = appendField(b, "groupId", w.groupID)
	b = appendField(b, "previousId", w.previousID)
	if len(w.body) > 0 {
		b = append(b, ',', '"')
		b = append(b, w.bodyKey...)
		b = append(b, `":`...)
		if b, err = appendMap(b, w.body, 1); err != nil {
			return b, 0, 0, invalid(w.typ, "cannot encode as JSON: %v", err)
		}
	}
	if len(w.integrations) > 0 {
		b = append(b, `,"integrations":`...)
		if b, err = appendMap(b, w.integrations, 1); err != nil {
			return b, 0, 0, invalid(w.typ, "cannot encode as JSON: %v", err)
		}
	}
	if b, err = appendContext(b, defaults, w.context); err != nil {
		return b, 0, 0, invalid(w.typ, "cannot encode as JSON: %v", err)
	}
	b = append(b, '}')
	if n := len(b) - start; n > MaxMessageBytes {
		return b, 0, 0, fmt.Errorf("%w: %s is %d bytes encoded, the limit is %d", ErrMessageTooLarge, w.typ, n, MaxMessageBytes)
	}
	return b, idStart, idEnd, nil
}

func appendField(b []byte, key, v string) []byte {
	if v == "" {
		return b
	}
	b = append(b, ',', '"')
	b = append(b, key...)
	b = append(b, `":`...)
	return appendString(b, v)
}

// libraryJSON is context.library, the same on every message.
var libraryJSON = []byte(`"library":{"name":"` + LibraryName + `","version":"` + Version + `"}`)

// appendContext writes the merged context: DefaultContext's keys under the
// message's own, and library always ours. Nothing is merged into a new map;
// neither input is modified.
func appendContext(b []byte, defaults, ctx map[string]interface{}) ([]byte, error) {
	b = append(b, `,"context":{`...)
	var err error
	for k, v := range defaults {
		if _, own := ctx[k]; own || k == "library" {
			continue
		}
		if b, err = appendMember(b, k, v, 1); err != nil {
			return b, err
		}
	}
	for k, v := range ctx {
		if k == "library" {
			continue
		}
		if b, err = appendMember(b, k, v, 1); err != nil {
			return b, err
		}
	}
	b = append(b, libraryJSON...)
	return append(b, '}'), nil
}

// appendMember writes `"k":v,`; the caller's closing byte follows it.
func appendMember(b []byte, k string, v interface{}, depth int) ([]byte, error) {
	b = appendString(b, k)
	b = append(b, ':')
	b, err := appendValue(b, v, depth)
	return append(b, ','), err
}

// maxDepth bounds the direct encoder's recursion; deeper values (or a map
// that contains itself) go to encoding/json, which reports cycles.
const maxDepth = 64

func appendMap(b []byte, m map[string]interface{}, depth int) ([]byte, error) {
	if m == nil {
		return append(b, "null"...), nil
	}
	b = append(b, '{')
	var err error
	for k, v := range m {
		if b, err = appendMember(b, k, v, depth); err != nil {
			return b, err
		}
	}
	if b[len(b)-1] == ',' {
		b = b[:len(b)-1]
	}
	return append(b, '}'), nil
}

func appendValue(b []byte, v interface{}, depth int) ([]byte, error) {
	if depth > maxDepth {
		return appendFallback(b, v)
	}
	switch x := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case string:
		return appendString(b, x), nil
	case bool:
		return strconv.AppendBool(b, x), nil
	case float64:
		return appendFloat(b, x, 64)
	case float32:
		return appendFloat(b, float64(x), 32)
	case int:
		return strconv.AppendInt(b, int64(x), 10), nil
	case int64:
		return strconv.AppendInt(b, x, 10), nil
	case int32:
		return strconv.AppendInt(b, int64(x), 10), nil
	case int16:
		return strconv.AppendInt(b, int64(x), 10), nil
	case int8:
		return strconv.AppendInt(b, int64(x), 10), nil
	case uint:
		return strconv.AppendUint(b, uint64(x), 10), nil
	case uint64:
		return strconv.AppendUint(b, x, 10), nil
	case uint32:
		return strconv.AppendUint(b, uint64(x), 10), nil
	case uint16:
		return strconv.AppendUint(b, uint64(x), 10), nil
	case uint8:
		return strconv.AppendUint(b, uint64(x), 10), nil
	case map[string]interface{}:
		return appendMap(b, x, depth+1)
	case []interface{}:
		if x == nil {
			return append(b, "null"...), nil
		}
		b = append(b, '[')
		var err error
		for i, e := range x {
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = appendValue(b, e, depth+1); err != nil {
				return b, err
			}
		}
		return append(b, ']'), nil
	case map[string]string:
		if x == nil {
			return append(b, "null"...), nil
		}
		b = append(b, '{')
		for k, s := range x {
			b = appendString(b, k)
			b = append(b, ':')
			b = appendString(b, s)
			b = append(b, ',')
		}
		if b[len(b)-1] == ',' {
			b = b[:len(b)-1]
		}
		return append(b, '}'), nil
	case []string:
		if x == nil {
			return append(b, "null"...), nil
		}
		b = append(b, '[')
		for i, s := range x {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, s)
		}
		return append(b, ']'), nil
	}
	return appendFallback(b, v)
}

// appendFloat formats as encoding/json does, and refuses what JSON cannot
// hold.
func appendFloat(b []byte, f float64, bits int) ([]byte, error) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return b, fmt.Errorf("unsupported value: %s", strconv.FormatFloat(f, 'g', -1, bits))
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 {
		if bits == 64 && (abs < 1e-6 || abs >= 1e21) || bits == 32 && (float32(abs) < 1e-6 || float32(abs) >= 1e21) {
			format = 'e'
		}
	}
	b = strconv.AppendFloat(b, f, format, -1, bits)
	if format == 'e' {
		// 1e-07 becomes 1e-7, as encoding/json writes it.
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, nil
}

var fallbackPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// appendFallback encodes v with encoding/json, HTML escaping off as for the
// rest of the message.
func appendFallback(b []byte, v interface{}) ([]byte, error) {
	buf := fallbackPool.Get().(*bytes.Buffer)
	defer fallbackPool.Put(buf)
	buf.Reset()
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return b, err
	}
	return append(b, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...), nil
}

func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	b = appendStringBody(b, s)
	return append(b, '"')
}

const hexDigits = "0123456789abcdef"

// appendStringBody escapes as encoding/json does with HTML escaping off:
// quotes, backslashes and control characters; invalid UTF-8 becomes U+FFFD;
// U+2028 and U+2029 are escaped for JavaScript's sake.
func appendStringBody(b []byte, s string) []byte {
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	return append(b, s[start:]...)
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

// randomness hands out crypto/rand bytes 16 at a time, read 1 KiB at once:
// one read per 64 messageIds instead of one per call.
type randomness struct {
	buf [1024]byte
	pos int
}

var randomPool = sync.Pool{New: func() any { return &randomness{pos: 1024} }}

// appendUUID appends a random (version 4) UUID.
func appendUUID(b []byte) []byte {
	r := randomPool.Get().(*randomness)
	if r.pos == len(r.buf) {
		_, _ = rand.Read(r.buf[:]) // never fails: guaranteed since Go 1.24
		r.pos = 0
	}
	var u [16]byte
	copy(u[:], r.buf[r.pos:])
	r.pos += 16
	randomPool.Put(r)
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
	return append(b, s[:]...)
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
