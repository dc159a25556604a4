// GET /admin/stream, read with fetch: EventSource cannot send the Authorization header.
// Each event goes to `onEvent`; a stream that ends or breaks is opened again.

import { authorization } from "./api.js";
import { $ } from "./dom.js";
import { EventStreamParser } from "./eventstream.js";
import { signOut } from "./session.js";

const RECONNECT_MS = 2000;

export class LiveStream {
  constructor(onEvent) {
    this.onEvent = onEvent;
    this.controller = null;
    this.retry = null;
  }

  start() {
    this.stop();
    this.controller = new AbortController();
    this.read(this.controller.signal);
  }

  stop() {
    if (this.controller) this.controller.abort();
    this.controller = null;
    clearTimeout(this.retry);
  }

  async read(signal) {
    const state = $("#feed-state");
    try {
      const response = await fetch("/admin/stream", { headers: authorization(), signal });
      if (response.status === 401) {
        signOut("The token was refused.");
        return;
      }
      if (!response.ok) throw new Error("HTTP " + response.status);
      state.textContent = "live";
      state.dataset.state = "live";
      const parser = new EventStreamParser();
      const reader = response.body.getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        for (const event of parser.push(value)) this.onEvent(event);
      }
    } catch (error) {
      if (signal.aborted) return;
      state.textContent = "disconnected: " + error.message;
    }
    if (signal.aborted) return;
    state.textContent = "reconnecting…";
    state.dataset.state = "reconnecting";
    this.retry = setTimeout(() => this.start(), RECONNECT_MS);
  }
}
