// efd's web console, the page's one script: ES modules served as they are, no build step.
// Everything it shows comes from the admin API (api.js); this module only wires the views
// together. A module script runs once the page is parsed, so the elements are there.

import { token } from "./api.js";
import { loadDestinations, setUpDestinations } from "./destinations.js";
import { $ } from "./dom.js";
import { loadRecent, onEvent, setUpFeed } from "./feed.js";
import { setUpSearch } from "./search.js";
import { signIn, signOut, whenSignedIn, whenSignedOut } from "./session.js";
import { LiveStream } from "./stream.js";

function show(view) {
  for (const button of document.querySelectorAll("#tabs button")) {
    button.classList.toggle("active", button.dataset.view === view);
  }
  for (const section of document.querySelectorAll(".view")) {
    section.hidden = section.id !== "view-" + view;
  }
  if (view === "destinations") loadDestinations();
}

const stream = new LiveStream(onEvent);
whenSignedIn(() => {
  stream.start();
  loadRecent();
  show("feed");
});
whenSignedOut(() => stream.stop());

$("#login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  signIn($("#token").value);
});
$("#sign-out").addEventListener("click", () => signOut());
for (const button of document.querySelectorAll("#tabs button")) {
  button.addEventListener("click", () => show(button.dataset.view));
}
setUpFeed();
setUpDestinations();
setUpSearch();
if (token()) signIn(token());
