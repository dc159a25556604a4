// Search by messageId or userId (GET /admin/deliveries); a row opens its message.

import { api } from "./api.js";
import { $, el } from "./dom.js";
import { when } from "./format.js";
import { messageDetail } from "./message.js";
import { failed } from "./session.js";

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

export function setUpSearch() {
  $("#search-form").addEventListener("submit", search);
}
