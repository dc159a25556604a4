// The live feed: the newest stored messages when it opens, then the stream's as they are
// stored, each one's badge saying its state at each destination, opened to its detail on a
// click; drawn at a bounded rate, as a sample when more arrive.

import { api } from "./api.js";
import { $, el } from "./dom.js";
import { time } from "./format.js";
import { messageDetail } from "./message.js";

const FEED_MAX = 200; // messages kept in the feed's DOM
const RENDER_EVERY_MS = 250; // the feed is redrawn at most this often
const RENDER_MAX = 25; // messages added per redraw; beyond that the feed shows a sample
const STATES_KEPT = 2000; // messageIds whose destinations' states are remembered
const RECENT = 50; // messages shown when the feed opens

const feed = {
  pending: [], // messages arrived since the last redraw
  arrived: 0, // in the current second, for the sample notice
  skipped: 0, // of those, not drawn
  serverDropped: 0, // events the daemon left out (`sampled`), in the current second
  paused: false,
  sources: new Set(),
  // messageId -> {destination: its delivery's status as stored, or "failing" once an
  // attempt failed, "delivered" once one succeeded}
  states: new Map(),
  open: new Map(), // messageId -> the expanded detail element
};

const WORDS = { queued: "pending", failing: "failing", failed: "failed" };
const BAD = new Set(["failing", "failed", "expired"]);

function remember(messageId, states) {
  feed.states.delete(messageId);
  feed.states.set(messageId, states);
  if (feed.states.size > STATES_KEPT) feed.states.delete(feed.states.keys().next().value);
}

// "delivered" only once every destination delivered it; otherwise how many did and where
// it stands at each of the others: "2 of 3 delivered · warehouse pending".
export function badgeText(states) {
  const names = Object.keys(states);
  if (names.length === 0) return { label: "accepted", kind: "pending" };
  const word = (state) => WORDS[state] || state;
  const delivered = names.filter((name) => states[name] === "delivered");
  const others = names.filter((name) => states[name] !== "delivered");
  const kind =
    others.length === 0 ? "delivered" : others.some((name) => BAD.has(states[name])) ? "failed" : "pending";
  if (names.length === 1) return { label: word(states[names[0]]), kind };
  if (others.length === 0) return { label: `${names.length} of ${names.length} delivered`, kind };
  const rest = others.map((name) => `${name} ${word(states[name])}`).join(" · ");
  return { label: `${delivered.length} of ${names.length} delivered · ${rest}`, kind };
}

function badgeFor(messageId) {
  const { label, kind } = badgeText(feed.states.get(messageId) || {});
  return el("span", { class: "badge " + kind }, label);
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

function noteSource(source) {
  if (!feed.sources.has(source)) {
    feed.sources.add(source);
    $("#source-filter").append(el("option", { value: source }, source));
  }
}

function onMessage(message) {
  $("#feed-empty").hidden = true;
  if (!feed.states.has(message.messageId)) remember(message.messageId, { ...(message.destinations || {}) });
  feed.arrived += 1;
  if (feed.paused) return;
  feed.pending.push(message);
  if (feed.pending.length > RENDER_MAX) feed.skipped += feed.pending.splice(0, 1).length;
  noteSource(message.source);
}

function onAttempt(attempt) {
  const states = { ...(feed.states.get(attempt.messageId) || {}) };
  if (attempt.delivered) states[attempt.destination] = "delivered";
  else if (states[attempt.destination] !== "delivered") states[attempt.destination] = "failing";
  remember(attempt.messageId, states);
  for (const li of document.querySelectorAll("#feed > li")) {
    if (li.dataset.messageId !== attempt.messageId) continue;
    li.querySelector(".summary .badge").replaceWith(badgeFor(attempt.messageId));
    if (feed.open.has(attempt.messageId)) refreshDetail(li, li.dataset.source, attempt.messageId);
  }
}

// One event of the live stream (stream.js).
export function onEvent({ type, data }) {
  const payload = JSON.parse(data);
  if (type === "message") onMessage(payload);
  else if (type === "attempt") onAttempt(payload);
  else if (type === "sampled") feed.serverDropped += payload.dropped;
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

// The newest stored messages, drawn below any the stream brought meanwhile; or a notice
// that there are none yet.
export async function loadRecent() {
  let found;
  try {
    found = await api(`/admin/recent?limit=${RECENT}`);
  } catch (error) {
    $("#feed-empty").textContent = "recent messages could not be loaded: " + error.message;
    $("#feed-empty").hidden = false;
    return;
  }
  const list = $("#feed");
  const shown = new Set([...list.children].map((li) => li.dataset.messageId));
  for (const message of found.messages) {
    if (shown.has(message.messageId)) continue;
    if (!feed.states.has(message.messageId)) remember(message.messageId, { ...message.destinations });
    noteSource(message.source);
    list.append(feedItem(message));
  }
  const empty = found.messages.length === 0 && list.children.length === 0 && feed.pending.length === 0;
  $("#feed-empty").textContent = "no messages yet: they appear here as they are stored";
  $("#feed-empty").hidden = !empty;
}

// The feed's own controls and its redraw; the events come through onEvent.
export function setUpFeed() {
  $("#pause").addEventListener("click", () => {
    feed.paused = !feed.paused;
    $("#pause").textContent = feed.paused ? "Resume" : "Pause";
  });
  $("#source-filter").addEventListener("change", () => {
    for (const li of document.querySelectorAll("#feed > li")) li.hidden = !matchesSource(li.dataset.source);
  });
  setInterval(redraw, RENDER_EVERY_MS);
  setInterval(sampleNotice, 1000);
}
