// efd's web console: plain JavaScript, no build step. Everything it shows comes from the
// admin API with the bearer token the operator typed, kept in this tab's sessionStorage.
// Data is only ever put into the page as text (textContent), never as HTML.
"use strict";

const TOKEN_KEY = "efd-admin-token";
const FEED_MAX = 200; // messages kept in the feed's DOM
const RENDER_EVERY_MS = 250; // the feed is redrawn at most this often
const RENDER_MAX = 25; // messages added per redraw; beyond that the feed shows a sample
const ATTEMPTS_KEPT = 2000; // messageIds whose latest attempt outcome is remembered

const $ = (selector) => document.querySelector(selector);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.className = value;
    else if (key === "data") for (const [k, v] of Object.entries(value)) node.dataset[k] = v;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function time(iso) {
  if (!iso) return "—";
  const date = new Date(iso);
  return date.toLocaleTimeString([], { hour12: false }) + "." +
    String(date.getMilliseconds()).padStart(3, "0");
}

function when(iso) {
  return iso ? new Date(iso).toLocaleString([], { hour12: false }) : "—";
}

function percent(rate) {
  return rate === null ? "—" : (rate * 100).toFixed(1) + " %";
}

function ms(value) {
  return value === null ? "—" : value.toFixed(1) + " ms";
}

// -- the token and the API -----------------------------------------------------------------

class Unauthorized extends Error {}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

async function api(path, options = {}) {
  const response = await fetch(path, {
    ...options,
    headers: { ...(options.headers || {}), Authorization: "Bearer " + token() },
  });
  const body = await response.json().catch(() => null);
  if (response.status === 401) throw new Unauthorized(body && body.message);
  if (!response.ok) {
    throw new Error((body && body.message) || "HTTP " + response.status);
  }
  return body;
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  stream.stop();
  $("#app").hidden = true;
  $("#tabs").hidden = true;
  $("#sign-out").hidden = true;
  $("#login").hidden = false;
  $("#login-error").hidden = !message;
  $("#login-error").textContent = message || "";
}

async function signIn(candidate) {
  sessionStorage.setItem(TOKEN_KEY, candidate);
  try {
    await api("/admin/destinations");
  } catch (error) {
    signOut(error instanceof Unauthorized ? "That token was refused." : error.message);
    return;
  }
  $("#login").hidden = true;
  $("#app").hidden = false;
  $("#tabs").hidden = false;
  $("#sign-out").hidden = false;
  stream.start();
  show("feed");
}

function failed(error) {
  if (error instanceof Unauthorized) signOut("The token was refused.");
  return error.message;
}

// -- views ---------------------------------------------------------------------------------

function show(view) {
  for (const button of document.querySelectorAll("#tabs button")) {
    button.classList.toggle("active", button.dataset.view === view);
  }
  for (const section of document.querySelectorAll(".view")) {
    section.hidden = section.id !== "view-" + view;
  }
  if (view === "destinations") loadDestinations();
}

// -- the live feed -------------------------------------------------------------------------

const feed = {
  pending: [], // messages arrived since the last redraw
  arrived: 0, // in the current second, for the sample notice
  skipped: 0, // of those, not drawn
  serverDropped: 0, // events the daemon left out (`sampled`), in the current second
  paused: false,
  sources: new Set(),
  outcomes: new Map(), // messageId -> "delivered" | "failed" (its latest attempt)
  open: new Map(), // messageId -> the expanded detail element
};

function badgeFor(messageId) {
  const outcome = feed.outcomes.get(messageId);
  const label = { delivered: "delivered", failed: "attempt failed" }[outcome] || "accepted";
  return el("span", { class: "badge " + (outcome || "pending") }, label);
}

function feedItem(message) {
  const li = el("li", { data: { messageId: message.messageId, source: message.source } });
  const summary = el(
    "div",
    { class: "summary", onclick: () => toggleDetail(li, message.source, message.messageId) },
    el("span", { class: "muted" }, time(message.receivedAt)),
    el("span", {}, message.source),
    el("span", {}, message.type),
    el("span", {}, message.event || message.userId || ""),
    el("span", { class: "id", title: message.messageId }, message.messageId),
    badgeFor(message.messageId),
  );
  li.append(summary);
  li.hidden = !matchesSource(message.source);
  return li;
}

function matchesSource(source) {
  const wanted = $("#source-filter").value;
  return !wanted || wanted === source;
}

function onMessage(message) {
  feed.arrived += 1;
  if (feed.paused) return;
  feed.pending.push(message);
  if (feed.pending.length > RENDER_MAX) feed.skipped += feed.pending.splice(0, 1).length;
  if (!feed.sources.has(message.source)) {
    feed.sources.add(message.source);
    $("#source-filter").append(el("option", { value: message.source }, message.source));
  }
}

function onAttempt(attempt) {
  const previous = feed.outcomes.get(attempt.messageId);
  if (previous !== "delivered" || attempt.delivered) {
    feed.outcomes.delete(attempt.messageId);
    feed.outcomes.set(attempt.messageId, attempt.delivered ? "delivered" : "failed");
    if (feed.outcomes.size > ATTEMPTS_KEPT) feed.outcomes.delete(feed.outcomes.keys().next().value);
  }
  for (const li of document.querySelectorAll("#feed > li")) {
    if (li.dataset.messageId !== attempt.messageId) continue;
    li.querySelector(".summary .badge").replaceWith(badgeFor(attempt.messageId));
    if (feed.open.has(attempt.messageId)) refreshDetail(li, li.dataset.source, attempt.messageId);
  }
}

function redraw() {
  const list = $("#feed");
  // At high rates only the newest RENDER_MAX of a redraw's messages are kept (onMessage):
  // a sample.
  for (const message of feed.pending.splice(0)) list.prepend(feedItem(message));
  while (list.children.length > FEED_MAX) {
    const last = list.lastElementChild;
    feed.open.delete(last.dataset.messageId);
    last.remove();
  }
}

function sampleNotice() {
  const notice = $("#feed-sample");
  const left = feed.skipped + feed.serverDropped;
  if (left > 0) {
    const total = feed.arrived + feed.serverDropped;
    notice.textContent = `showing a sample: ${total - left} of ${total} events in the last second`;
    notice.hidden = false;
  } else {
    notice.hidden = true;
  }
  feed.arrived = feed.skipped = feed.serverDropped = 0;
}

async function toggleDetail(li, source, messageId) {
  if (feed.open.has(messageId)) {
    feed.open.get(messageId).remove();
    feed.open.delete(messageId);
    li.classList.remove("expanded");
    return;
  }
  const detail = el("div", { class: "detail" }, el("span", { class: "muted" }, "loading…"));
  feed.open.set(messageId, detail);
  li.classList.add("expanded");
  li.append(detail);
  await refreshDetail(li, source, messageId);
}

async function refreshDetail(li, source, messageId) {
  const detail = feed.open.get(messageId) || li.querySelector(".detail");
  if (!detail) return;
  detail.replaceChildren(await messageDetail(source, messageId));
}

async function messageDetail(source, messageId) {
  let message;
  try {
    message = await api(
      "/admin/messages/" + encodeURIComponent(source) + "/" + encodeURIComponent(messageId),
    );
  } catch (error) {
    return el("p", { class: "error" }, failed(error));
  }
  const box = el("div", { class: "message-detail", data: { messageId } });
  box.append(
    el("h3", {}, "Payload"),
    el(
      "pre",
      { class: "payload" },
      message.body === null ? "(purged by a deletion request)" : JSON.stringify(message.body, null, 2),
    ),
    el("h3", {}, "Deliveries"),
  );
  const table = el(
    "table",
    { class: "grid deliveries" },
    el(
      "thead",
      {},
      el("tr", {}, ...["destination", "status", "attempts", "next attempt", "window ends", "replay of"]
        .map((h) => el("th", {}, h))),
    ),
  );
  const body = el("tbody");
  for (const delivery of message.deliveries) {
    body.append(
      el(
        "tr",
        { class: "delivery", data: { status: delivery.status } },
        el("td", {}, delivery.destination),
        el("td", {}, el("span", { class: "badge " + delivery.status }, delivery.status)),
        el("td", {}, delivery.attemptCount),
        el("td", {}, when(delivery.nextAttemptAt)),
        el("td", {}, when(delivery.windowEndsAt)),
        el("td", {}, delivery.replayOf ?? "—"),
      ),
    );
    if (delivery.filteredBy) {
      body.append(
        el(
          "tr",
          { class: "filtered-by" },
          el("td", { class: "muted" }, "↳ filtered"),
          el("td", { class: "mono", colspan: "5" }, delivery.filteredBy),
        ),
      );
    }
    for (const attempt of delivery.attempts) {
      body.append(
        el(
          "tr",
          { class: "attempt" },
          el("td", { class: "muted" }, "↳ " + when(attempt.at)),
          el("td", { class: "status-code" }, attempt.statusCode ?? attempt.error ?? "—"),
          el("td", {}, ms(attempt.durationMs)),
          el("td", { class: "mono", colspan: "2" }, attempt.url),
          el("td", { class: "mono" }, (attempt.response || "").slice(0, 200)),
        ),
      );
    }
  }
  table.append(body);
  box.append(table);
  return box;
}

// The SSE stream, read with fetch: EventSource cannot send the Authorization header.
const stream = {
  controller: null,
  retry: null,
  start() {
    this.stop();
    this.controller = new AbortController();
    this.read(this.controller.signal);
  },
  stop() {
    if (this.controller) this.controller.abort();
    this.controller = null;
    clearTimeout(this.retry);
  },
  async read(signal) {
    const state = $("#feed-state");
    try {
      const response = await fetch("/admin/stream", {
        headers: { Authorization: "Bearer " + token() },
        signal,
      });
      if (response.status === 401) {
        signOut("The token was refused.");
        return;
      }
      if (!response.ok) throw new Error("HTTP " + response.status);
      state.textContent = "live";
      state.dataset.state = "live";
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          dispatch(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
        }
      }
    } catch (error) {
      if (signal.aborted) return;
      state.textContent = "disconnected: " + error.message;
    }
    if (signal.aborted) return;
    state.textContent = "reconnecting…";
    state.dataset.state = "reconnecting";
    this.retry = setTimeout(() => this.start(), 2000);
  },
};

function dispatch(block) {
  let kind = "message";
  let data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith("event: ")) kind = line.slice(7);
    else if (line.startsWith("data: ")) data += line.slice(6);
  }
  if (!data) return; // a comment (keep-alive)
  const payload = JSON.parse(data);
  if (kind === "message") onMessage(payload);
  else if (kind === "attempt") onAttempt(payload);
  else if (kind === "sampled") feed.serverDropped += payload.dropped;
}

// -- destinations --------------------------------------------------------------------------

async function loadDestinations() {
  const state = $("#destinations-state");
  state.textContent = "loading…";
  let answer;
  try {
    answer = await api("/admin/destinations");
  } catch (error) {
    state.textContent = failed(error);
    return;
  }
  state.textContent = "as of " + new Date().toLocaleTimeString([], { hour12: false });
  $("#destinations").replaceChildren(...answer.destinations.map(destinationPanel));
}

function windowCells(figures) {
  return [
    el("td", {}, figures.attempts),
    el("td", {}, percent(figures.successRate)),
    el("td", {}, ms(figures.p50Ms)),
    el("td", {}, ms(figures.p99Ms)),
  ];
}

// A destination removed from the configuration with deliveries still pending: nothing sends
// them, so the operator is offered to discard them (POST /admin/discard), dry run first.
function unconfiguredPanel(destination) {
  const discard = el("div", { class: "discard" });
  const start = el("button", { type: "button", class: "discard-start" }, "Discard pending…");
  start.addEventListener("click", () => actionDryRun(DISCARD, destination.name, discard));
  discard.append(start);
  const head = el(
    "div",
    { class: "destination-head" },
    el("h2", {}, destination.name),
    el("span", { class: "badge unconfigured" }, "not configured"),
    el("span", { class: "backlog" }, `backlog ${destination.backlog}`),
    el("span", { class: "muted" }, "oldest pending " + when(destination.oldestPendingAt)),
    discard,
  );
  const note = el(
    "p",
    { class: "notice" },
    "Removed from the configuration: its pending deliveries are never sent. " +
      "Configure it again to send them, or discard them (kept as discarded until retention).",
  );
  return el(
    "div",
    { class: "destination unconfigured", data: { destination: destination.name, configured: "false" } },
    head,
    note,
  );
}

// An ordered destination: how many users' lanes are held by a head that keeps failing.
function lanesNote(lanes) {
  if (!lanes) return [];
  if (!lanes.blocked) return [el("span", { class: "muted lanes" }, "ordered per user, no lane blocked")];
  return [
    el(
      "span",
      { class: "lanes blocked" },
      `${lanes.blocked} blocked ${lanes.blocked === 1 ? "lane" : "lanes"}; ` +
        `longest: message ${lanes.oldestBlockedMessageId} since ` +
        when(lanes.oldestBlockedSince),
    ),
  ];
}

function destinationPanel(destination) {
  if (destination.configured === false) return unconfiguredPanel(destination);
  const redrive = el("div", { class: "redrive" });
  const start = el("button", { type: "button", class: "redrive-start" }, "Redrive failed and expired…");
  start.addEventListener("click", () => actionDryRun(REDRIVE, destination.name, redrive));
  redrive.append(start);
  const head = el(
    "div",
    { class: "destination-head" },
    el("h2", {}, destination.name),
    el("span", { class: "backlog" }, `backlog ${destination.backlog}`),
    el("span", { class: "muted" }, "oldest pending " + when(destination.oldestPendingAt)),
    ...lanesNote(destination.lanes),
    redrive,
  );
  const table = el(
    "table",
    { class: "grid hooks" },
    el(
      "thead",
      {},
      el(
        "tr",
        {},
        ...["hook", "circuit", "limit", "last error", "1 h attempts", "success", "p50", "p99",
          "24 h attempts", "success", "p50", "p99"].map((h) => el("th", {}, h)),
      ),
    ),
  );
  const body = el("tbody");
  for (const hook of destination.hooks) {
    body.append(
      el(
        "tr",
        { class: "hook", data: { circuit: hook.circuit } },
        el("td", { class: "mono" }, hook.url),
        el("td", {}, el("span", { class: "badge " + hook.circuit }, hook.circuit)),
        el(
          "td",
          { class: "limit" },
          hook.maxPerSecond == null
            ? "—"
            : `${hook.maxPerSecond}/s, burst ${hook.burst}; held back ${hook.heldBack}`,
        ),
        el(
          "td",
          { class: "last-error" },
          hook.lastError ? `${hook.lastError} (${when(hook.lastErrorAt)})` : "—",
        ),
        ...windowCells(hook.window["1h"]),
        ...windowCells(hook.window["24h"]),
      ),
    );
  }
  table.append(body);
  return el("div", { class: "destination", data: { destination: destination.name } }, head, table);
}

// A destination-wide action (`/admin/redrive`, `/admin/discard`): a dry run counts what it
// would change, the operator confirms, then it runs. `action` names its classes and sentences.
const REDRIVE = {
  path: "/admin/redrive",
  kind: "redrive",
  confirm: "Redrive them",
  would: (n) => `${n} failed or expired deliveries would be sent again`,
  done: (n) => `${n} deliveries are pending again`,
};
const DISCARD = {
  path: "/admin/discard",
  kind: "discard",
  confirm: "Discard them",
  would: (n) => `${n} pending deliveries would be discarded`,
  done: (n) => `${n} deliveries discarded`,
};

function postAction(action, body) {
  return api(action.path, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
}

async function actionDryRun(action, name, box) {
  let answer;
  try {
    answer = await postAction(action, { destination: name, dry_run: true });
  } catch (error) {
    box.replaceChildren(el("span", { class: "error" }, failed(error)));
    return;
  }
  const confirm = el("button", { type: "button", class: `${action.kind}-confirm` }, action.confirm);
  const cancel = el("button", { type: "button" }, "Cancel");
  confirm.addEventListener("click", () => actionRun(action, name, box));
  cancel.addEventListener("click", () => loadDestinations());
  box.replaceChildren(
    el("span", { class: `${action.kind}-count`, data: { count: answer.count } },
      action.would(answer.count)),
    ...(answer.count > 0 ? [confirm] : []),
    cancel,
  );
}

async function actionRun(action, name, box) {
  try {
    const answer = await postAction(action, { destination: name });
    box.replaceChildren(
      el("span", { class: `${action.kind}-done`, data: { count: answer.count } },
        action.done(answer.count)),
    );
  } catch (error) {
    box.replaceChildren(el("span", { class: "error" }, failed(error)));
  }
}

// -- search --------------------------------------------------------------------------------

async function search(event) {
  event.preventDefault();
  const by = $("#search-by").value;
  const query = $("#search-query").value.trim();
  const state = $("#search-state");
  const table = $("#search-results");
  $("#search-detail").replaceChildren();
  state.textContent = "searching…";
  let answer;
  try {
    answer = await api("/admin/deliveries?" + new URLSearchParams({ [by]: query, limit: "100" }));
  } catch (error) {
    state.textContent = failed(error);
    table.hidden = true;
    return;
  }
  const rows = answer.deliveries.map((d) =>
    el(
      "tr",
      {
        class: "clickable result",
        data: { messageId: d.messageId, status: d.status },
        onclick: async () =>
          $("#search-detail").replaceChildren(await messageDetail(d.source, d.messageId)),
      },
      el("td", {}, when(d.receivedAt)),
      el("td", {}, d.source),
      el("td", { class: "mono" }, d.messageId),
      el("td", {}, d.type),
      el("td", {}, d.userId ?? "—"),
      el("td", {}, d.destination),
      el("td", {}, el("span", { class: "badge " + d.status }, d.status)),
      el("td", {}, d.attemptCount),
    ),
  );
  table.querySelector("tbody").replaceChildren(...rows);
  table.hidden = rows.length === 0;
  state.textContent = rows.length
    ? `${rows.length} deliveries${answer.nextCursor ? " (the newest 100)" : ""}`
    : "no delivery matches";
}

// -- start ---------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("#login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    signIn($("#token").value);
  });
  $("#sign-out").addEventListener("click", () => signOut());
  for (const button of document.querySelectorAll("#tabs button")) {
    button.addEventListener("click", () => show(button.dataset.view));
  }
  $("#pause").addEventListener("click", () => {
    feed.paused = !feed.paused;
    $("#pause").textContent = feed.paused ? "Resume" : "Pause";
  });
  $("#source-filter").addEventListener("change", () => {
    for (const li of document.querySelectorAll("#feed > li")) li.hidden = !matchesSource(li.dataset.source);
  });
  $("#refresh-destinations").addEventListener("click", loadDestinations);
  $("#search-form").addEventListener("submit", search);
  setInterval(redraw, RENDER_EVERY_MS);
  setInterval(sampleNotice, 1000);
  if (token()) signIn(token());
});
