package analytics

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

type namedMap map[string]interface{}

type point struct {
	X, Y int
	Tag  string `json:"tag,omitempty"`
}

// The direct encoder must produce what encoding/json would, value for value.
func TestEncoderMatchesEncodingJSON(t *testing.T) {
	values := []interface{}{
		nil, true, false, "", "plain", `quote " and \ backslash`, "tab\tnew\nline\rcr",
		"control \x00\x01\x1f\x7f", "html <b>&amp;</b>", "unicode é 日本 🎉", "bad utf8 \xff\xfe end",
		"js \u2028 \u2029 separators", 0.0, -0.0, 1.0, 42.5, -3.25, 1e-7, 1e-6, 123456789.125, 1e20, 1e21, 1.5e300,
		math.MaxFloat64, math.SmallestNonzeroFloat64, float32(1.1), float32(1e-7), float32(3e38),
		int(-7), int8(-8), int16(16), int32(-32), int64(math.MinInt64), uint(7), uint8(255), uint16(16), uint32(32), uint64(math.MaxUint64),
		map[string]interface{}{}, map[string]interface{}{"a": 1.0, "b": map[string]interface{}{"c": []interface{}{"d", 2.0, nil}}},
		[]interface{}{}, []interface{}{1.0, "x", true, nil, []interface{}{}},
		map[string]string{"k": "v", "q\"": "\n"}, []string{"a", "<b>"}, []string(nil), map[string]string(nil),
		[]interface{}(nil), map[string]interface{}(nil),
		// Types the encoder leaves to encoding/json.
		time.Date(2026, 11, 24, 10, 0, 0, 123e6, time.UTC), point{1, 2, "t"}, &point{X: 3}, namedMap{"n": 1.0},
		json.Number("12.50"), json.RawMessage(`{"raw":true}`), []int{1, 2}, map[string]int{"x": 1}, [2]bool{true, false},
	}
	for _, v := range values {
		want, err := marshalNoHTML(v)
		if err != nil {
			t.Fatalf("%#v: encoding/json: %v", v, err)
		}
		got, err := appendValue(nil, v, 1)
		if err != nil {
			t.Errorf("%#v: %v", v, err)
			continue
		}
		if !sameJSON(t, got, want) {
			t.Errorf("%#v: encoded %s, encoding/json %s", v, got, want)
		}
		switch v.(type) {
		case float64, float32, int, int64, uint64, bool, nil:
			if !bytes.Equal(got, want) { // numbers byte for byte, not just equal values
				t.Errorf("%#v: encoded %s, encoding/json %s", v, got, want)
			}
		}
	}
}

func marshalNoHTML(v interface{}) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	err := enc.Encode(v)
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), err
}

func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y interface{}
	if err := json.Unmarshal(a, &x); err != nil {
		t.Errorf("not JSON: %s: %v", a, err)
		return false
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Errorf("not JSON: %s: %v", b, err)
		return false
	}
	return reflect.DeepEqual(x, y)
}

func TestEncoderRefusesWhatJSONCannotHold(t *testing.T) {
	cyclic := map[string]interface{}{}
	cyclic["self"] = cyclic
	for name, v := range map[string]interface{}{
		"NaN": math.NaN(), "+Inf": math.Inf(1), "float32 -Inf": float32(math.Inf(-1)),
		"channel": make(chan int), "func": func() {}, "nested NaN": []interface{}{map[string]interface{}{"x": math.NaN()}},
		"cycle": cyclic,
	} {
		if _, err := appendValue(nil, v, 1); err == nil {
			t.Errorf("%s: encoded without error", name)
		}
	}
	c, _ := newTestClient(t, newServer(t, nil))
	err := c.Track(&Track{UserId: "u", Event: "e", Properties: map[string]interface{}{"loop": cyclic}})
	if !errors.Is(err, ErrInvalidMessage) || !strings.Contains(err.Error(), "JSON") {
		t.Fatalf("cyclic property: %v", err)
	}
}

// A whole message, encoded directly, is what encoding/json makes of the same
// fields; keys the caller repeats across DefaultContext and Context appear
// once.
func TestEncodedMessageIsValidJSON(t *testing.T) {
	w := &wire{typ: "page", msg: &Message{MessageId: "id \"1\"", Timestamp: "2026-11-24T10:00:00+01:00"},
		context:      map[string]interface{}{"ip": "203.0.113.9", "locale": "en", "library": "spoofed"},
		integrations: map[string]interface{}{"All": false},
		bodyKey:      "properties", body: map[string]interface{}{"url": "https://example.com/?a=1&b=2"},
		anonymousID: "anon", name: "Home", category: "Docs"}
	defaults := map[string]interface{}{"locale": "de", "app": map[string]interface{}{"name": "shop"}}
	data, idStart, idEnd, err := encodeMessage(nil, w, defaults, time.Now())
	mustNil(t, err)
	var got map[string]interface{}
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatalf("not JSON: %v: %s", err, data)
	}
	want := map[string]interface{}{
		"type": "page", "messageId": `id "1"`, "timestamp": "2026-11-24T09:00:00.000Z", "anonymousId": "anon",
		"name": "Home", "category": "Docs", "properties": map[string]interface{}{"url": "https://example.com/?a=1&b=2"},
		"integrations": map[string]interface{}{"All": false},
		"context": map[string]interface{}{"ip": "203.0.113.9", "locale": "en", "app": map[string]interface{}{"name": "shop"},
			"library": map[string]interface{}{"name": LibraryName, "version": Version}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	if id := string(data[idStart:idEnd]); id != `id \"1\"` {
		t.Errorf("id span %q", id)
	}
	if bytes.Count(data, []byte(`"locale"`)) != 1 || bytes.Count(data, []byte(`"library"`)) != 1 {
		t.Errorf("a context key appears twice: %s", data)
	}
}
