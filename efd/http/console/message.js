// One message opened: its payload, its deliveries and their attempts (GET /admin/messages/…),
// shown by the feed and by search.

import { api } from "./api.js";
import { el } from "./dom.js";
import { ms, when } from "./format.js";
import { failed } from "./session.js";

export async function messageDetail(source, messageId) {
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
    // An action's delivery: the URL rendered for its message, or why routing failed it.
    const routingFailed = delivery.status === "failed" && !delivery.attemptCount;
    for (const [label, text] of [
      ["↳ url", delivery.url],
      ["↳ failed at routing", routingFailed ? delivery.lastError : null],
    ]) {
      if (text) {
        body.append(
          el(
            "tr",
            { class: "routing" },
            el("td", { class: "muted" }, label),
            el("td", { class: "mono", colspan: "5" }, text),
          ),
        );
      }
    }
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
