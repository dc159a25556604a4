// The text/event-stream format of server-sent events, parsed as it arrives: chunks of bytes
// (UTF-8) or text in, whole events out. It touches no DOM, so Node runs it as it is.

export class EventStreamParser {
  #decoder = new TextDecoder(); // drops a leading byte order mark, as the format asks
  #line = ""; // the start of a line whose end has not arrived
  #afterCR = false; // a chunk ended in CR: an LF starting the next belongs to that break
  #type = "";
  #data = [];

  // Parses `chunk` (a string, or a Uint8Array of UTF-8 cut anywhere) and returns the events
  // it completed, in order, each `{ type, data }`; `type` is "message" unless an `event:`
  // field named one. An event still open when the stream ends is never returned.
  push(chunk) {
    const text = typeof chunk === "string" ? chunk : this.#decoder.decode(chunk, { stream: true });
    const events = [];
    if (text === "") return events;
    let start = this.#afterCR && text[0] === "\n" ? 1 : 0;
    this.#afterCR = false;
    for (let i = start; i < text.length; i++) {
      const c = text[i];
      if (c !== "\n" && c !== "\r") continue;
      this.#field(this.#line + text.slice(start, i), events);
      this.#line = "";
      if (c === "\r") {
        if (i + 1 === text.length) this.#afterCR = true;
        else if (text[i + 1] === "\n") i++;
      }
      start = i + 1;
    }
    this.#line += text.slice(start);
    return events;
  }

  #field(line, events) {
    if (line === "") {
      // A blank line ends the event; one with no data (only comments, say) is no event.
      if (this.#data.length > 0) {
        events.push({ type: this.#type || "message", data: this.#data.join("\n") });
      }
      this.#type = "";
      this.#data = [];
      return;
    }
    if (line[0] === ":") return; // a comment: the server's keep-alive
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value[0] === " ") value = value.slice(1);
    if (name === "event") this.#type = value;
    else if (name === "data") this.#data.push(value);
    // `id` and `retry` are not read: the console reconnects on its own and from now.
  }
}
