// The admin API, with the bearer token the operator typed, kept in this tab's
// sessionStorage only.

const TOKEN_KEY = "efd-admin-token";

export class Unauthorized extends Error {}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function keepToken(candidate) {
  sessionStorage.setItem(TOKEN_KEY, candidate);
}

export function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

export function authorization() {
  return { Authorization: "Bearer " + token() };
}

export async function api(path, options = {}) {
  const response = await fetch(path, {
    ...options,
    headers: { ...(options.headers || {}), ...authorization() },
  });
  const body = await response.json().catch(() => null);
  if (response.status === 401) throw new Unauthorized(body && body.message);
  if (!response.ok) {
    throw new Error((body && body.message) || "HTTP " + response.status);
  }
  return body;
}
