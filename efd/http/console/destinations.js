// The destinations view: per destination its backlog, lanes and pause state, per hook its
// pause, circuit, last error and figures (GET /admin/destinations); the redrive, discard,
// pause and resume actions.

import { api } from "./api.js";
import { rateChart } from "./chart.js";
import { $, el } from "./dom.js";
import { ms, percent, when } from "./format.js";
import { failed } from "./session.js";

export async function loadDestinations() {
  const state = $("#destinations-state");
  state.textContent = "loading…";
  let answer;
  let rates;
  try {
    [answer, rates] = await Promise.all([api("/admin/destinations"), api("/admin/rates")]);
  } catch (error) {
    state.textContent = failed(error);
    return;
  }
  state.textContent = "as of " + new Date().toLocaleTimeString([], { hour12: false });
  $("#destinations").replaceChildren(
    ...answer.destinations.map((destination) => destinationPanel(destination, rates.destinations[destination.name])),
  );
}

export function setUpDestinations() {
  $("#refresh-destinations").addEventListener("click", loadDestinations);
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

// A destination's or a hook's pause: a badge saying paused or disabled (the reason and since
// when in its tooltip), and the button that resumes it or pauses it.
function pauseBadge(pause) {
  if (!pause) return [];
  const title = `${pause.kind} since ${when(pause.since)}` + (pause.reason ? `: ${pause.reason}` : "");
  return [el("span", { class: "badge " + pause.kind, title }, pause.kind)];
}

function pauseButton(name, hook, pause) {
  const action = pause ? "resume" : "pause";
  const label = pause ? "Resume" : "Pause";
  const button = el("button", { type: "button", class: `${action}-button`, data: { action } }, label);
  button.addEventListener("click", () => pauseOrResume(name, hook, action, button));
  return button;
}

async function pauseOrResume(name, hook, action, button) {
  const body = hook == null ? {} : { hook };
  button.disabled = true;
  try {
    await api(`/admin/destinations/${encodeURIComponent(name)}/${action}`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
  } catch (error) {
    button.replaceWith(el("span", { class: "error" }, failed(error)));
    return;
  }
  await loadDestinations();
}

function destinationPanel(destination, series) {
  if (destination.configured === false) return unconfiguredPanel(destination);
  const stateBadge =
    destination.state === "partly"
      ? [el("span", { class: "badge partly", title: "some of its hooks are paused or disabled" }, "partly paused")]
      : pauseBadge(destination.pause);
  const redrive = el("div", { class: "redrive" });
  const start = el("button", { type: "button", class: "redrive-start" }, "Redrive failed and expired…");
  start.addEventListener("click", () => actionDryRun(REDRIVE, destination.name, redrive));
  redrive.append(start);
  const head = el(
    "div",
    { class: "destination-head" },
    el("h2", {}, destination.name),
    ...stateBadge,
    el("span", { class: "backlog" }, `backlog ${destination.backlog}`),
    el("span", { class: "muted" }, "oldest pending " + when(destination.oldestPendingAt)),
    ...lanesNote(destination.lanes),
    pauseButton(destination.destination, null, destination.pause),
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
          "24 h attempts", "success", "p50", "p99", "state"].map((h) => el("th", {}, h)),
      ),
    ),
  );
  const body = el("tbody");
  for (const hook of destination.hooks) {
    body.append(
      el(
        "tr",
        { class: "hook", data: { circuit: hook.circuit, paused: hook.pause ? hook.pause.kind : "" } },
        el("td", { class: "mono" }, `${hook.hook}. ${hook.url}`),
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
        // Last, so the figures keep their columns.
        el("td", { class: "pause" }, ...pauseBadge(hook.pause), pauseButton(destination.destination, hook.hook, hook.pause)),
      ),
    );
  }
  table.append(body);
  const chart = series
    ? el(
        "figure",
        { class: "rates-figure" },
        rateChart(destination.name, series),
        el("figcaption", {}, "delivered and failed per minute, last hour"),
      )
    : null;
  // The hooks' table with the rates chart beside it (below it where the page is narrow).
  const layout = el("div", { class: "destination-body" }, table, chart);
  return el("div", { class: "destination", data: { destination: destination.name } }, head, layout);
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
