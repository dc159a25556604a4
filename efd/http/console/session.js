// Signing in with the admin token and out again. What starts and stops with the session
// (the live stream, the first view) registers here, so that this module needs none of it.

import { api, forgetToken, keepToken, Unauthorized } from "./api.js";
import { $ } from "./dom.js";

const started = [];
const stopped = [];

export function whenSignedIn(callback) {
  started.push(callback);
}

export function whenSignedOut(callback) {
  stopped.push(callback);
}

export function signOut(message) {
  forgetToken();
  for (const callback of stopped) callback();
  $("#app").hidden = true;
  $("#tabs").hidden = true;
  $("#sign-out").hidden = true;
  $("#login").hidden = false;
  $("#login-error").hidden = !message;
  $("#login-error").textContent = message || "";
}

export async function signIn(candidate) {
  keepToken(candidate);
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
  for (const callback of started) callback();
}

// What a failed call shows; a refused token also ends the session.
export function failed(error) {
  if (error instanceof Unauthorized) signOut("The token was refused.");
  return error.message;
}
