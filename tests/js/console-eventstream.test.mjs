// The console's stream parser (efd/http/console/eventstream.js) under Node's own test runner:
// the same events whether the stream arrives whole, one character or one byte at a time.
import assert from "node:assert/strict";
import test from "node:test";

import { EventStreamParser } from "../../efd/http/console/eventstream.js";

// What efd's /admin/stream writes: a comment first, keep-alives, then events.
const EFD = [
  ": efd live stream\n\n",
  'event: message\ndata: {"messageId":"m-1","event":"Café ☕ 𝄞"}\n\n',
  ": keepalive\n\n",
  'event: attempt\ndata: {"messageId":"m-1","delivered":true}\n\n',
  'event: sampled\ndata: {"dropped":3}\n\n',
].join("");
const EFD_EVENTS = [
  { type: "message", data: '{"messageId":"m-1","event":"Café ☕ 𝄞"}' },
  { type: "attempt", data: '{"messageId":"m-1","delivered":true}' },
  { type: "sampled", data: '{"dropped":3}' },
];

function whole(text) {
  return new EventStreamParser().push(text);
}

function byCharacter(text) {
  const parser = new EventStreamParser();
  return [...text].flatMap((c) => parser.push(c)); // code points: 𝄞 is two UTF-16 units
}

function byUnit(text) {
  const parser = new EventStreamParser();
  const events = [];
  for (let i = 0; i < text.length; i++) events.push(...parser.push(text[i]));
  return events;
}

function byByte(text) {
  const parser = new EventStreamParser();
  return [...new TextEncoder().encode(text)].flatMap((b) => parser.push(Uint8Array.of(b)));
}

const FEEDS = { whole, byCharacter, byUnit, byByte };

for (const [name, feed] of Object.entries(FEEDS)) {
  test(`efd's stream, ${name}`, () => {
    assert.deepEqual(feed(EFD), EFD_EVENTS);
  });

  test(`CRLF, CR and LF all end lines, ${name}`, () => {
    const text = "event: a\r\ndata: 1\r\n\r\nevent: b\rdata: 2\r\rdata: 3\n\n";
    assert.deepEqual(feed(text), [
      { type: "a", data: "1" },
      { type: "b", data: "2" },
      { type: "message", data: "3" },
    ]);
  });

  test(`the format's other rules, ${name}`, () => {
    const text = [
      "data: one\ndata:two\ndata\n\n", // data lines join with LF; the space is optional
      "event: x\n\n", // no data: no event, and its type is forgotten
      "data: y\n\n",
      "id: 7\nretry: 10\n: a comment\nunknown: field\ndata:  two spaces\n\n",
      "data: never finished\n",
    ].join("");
    assert.deepEqual(feed(text), [
      { type: "message", data: "one\ntwo\n" },
      { type: "message", data: "y" },
      { type: "message", data: " two spaces" },
    ]);
  });
}

test("bytes cut inside a character wait for its end", () => {
  const parser = new EventStreamParser();
  const bytes = new TextEncoder().encode("data: ☕\n\n");
  assert.deepEqual(parser.push(bytes.subarray(0, 7)), []);
  assert.deepEqual(parser.push(bytes.subarray(7)), [{ type: "message", data: "☕" }]);
});

test("a byte order mark at the start is dropped", () => {
  const bytes = new TextEncoder().encode("\uFEFFdata: x\n\n");
  assert.deepEqual(new EventStreamParser().push(bytes), [{ type: "message", data: "x" }]);
});
