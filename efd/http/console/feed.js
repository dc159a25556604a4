// The live feed: the stream's messages as they are stored, each one's badge following its
// latest attempt, opened to its detail on a click; drawn at a bounded rate, as a sample when
// more arrive.

import { $, el } from "./dom.js";
import { time } from "./format.js";
import { messageDetail } from "./message.js";

const FEED_MAX = 200; // messages kept in the feed's DOM
const RENDER_EVERY_MS = 250; // the feed is redrawn at most this often
const RENDER_MAX = 25; // messages added per redraw; beyond that the feed shows a sample
const ATTEMPTS_KEPT = 2000; // messageIds whose latest attempt outcome is remembered

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
