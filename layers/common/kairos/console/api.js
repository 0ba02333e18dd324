// The API client: every request the console makes goes through call(method, path, body, headers),
// with the signed-in user's bearer token. Paths are literal documented routes of the OpenAPI document
// (tests/unit/test_console.py reads each call(...) in these files and checks it against the document).

import { accepted, markAccepted, token, signOut } from "./auth.js";

export class ApiError extends Error {
  constructor(status, body) {
    const err = (body && body.error) || {};
    super(err.message || `HTTP ${status}`);
    this.status = status;
    this.code = err.code || "http_error";
    this.fields = err.fields || [];
  }
}

export async function call(method, path, body, headers = {}) {
  const init = { method, headers: { Accept: "application/json", ...headers }, cache: "no-store" };
  const bearer = token();
  if (bearer) init.headers.Authorization = `Bearer ${bearer}`;
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let parsed = null;
  try { parsed = text ? JSON.parse(text) : null; } catch { parsed = null; }
  // A 401 signs out, once: a request that was sent with a token already signed out changes nothing.
  if (response.status === 401 && bearer === token()) {
    signOut(bearer && !accepted() ? "That token was not accepted: check it and sign in again."
      : "Your session ended; sign in again.");
  } else if (response.status !== 401 && bearer && bearer === token()) {
    markAccepted();
  }
  if (!response.ok) throw new ApiError(response.status, parsed);
  return parsed;
}

// A query string from an object, leaving out empty values.
export function qs(params) {
  const q = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") q.set(key, String(value));
  }
  const text = q.toString();
  return text ? `?${text}` : "";
}
