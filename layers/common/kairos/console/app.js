// The console's shell: sign-in, the hash router (#/page/id?filters) and the navigation. Each page is
// its own module, loaded when first visited; render(view, route) draws into a fresh view and may
// return a cleanup function (a live run's follower stops when the user leaves the page).

import { clearToast, h, replace, errorBox } from "./dom.js";
import { finishOidc, loadConfig, signedIn, signOut, startOidc, useDevToken, whenSignedOut } from "./auth.js";

const PAGES = {
  schedules: "./schedules.js",
  runs: "./runs.js",
  run: "./run.js",
  approvals: "./approvals.js",
  inbox: "./inbox.js",
  usage: "./usage.js",
  status: "./status.js",
};

const main = document.getElementById("main");
let cleanup = null;
let config = null;

export function parseRoute(hash) {
  const [path, query] = (hash.replace(/^#\/?/, "") || "schedules").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  let page = parts[0] || "schedules";
  if (page === "runs" && parts[1]) page = "run";
  return { page, id: parts[1] || null, params: new URLSearchParams(query || "") };
}

export function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

async function route() {
  if (cleanup) { cleanup(); cleanup = null; }
  clearToast();  // a message belongs to the page it was shown on
  if (!signedIn()) { showSignIn(); return; }
  document.getElementById("signout").hidden = config.auth !== "oidc" && config.auth !== "dev";
  const current = parseRoute(location.hash);
  for (const link of document.querySelectorAll("#nav a")) {
    const active = link.dataset.page === current.page || (current.page === "run" && link.dataset.page === "runs");
    if (active) link.setAttribute("aria-current", "page"); else link.removeAttribute("aria-current");
  }
  // Each visit renders into its own view: a request of the page left behind that answers late
  // writes into a detached element, never over the page now shown.
  const view = h("div", { class: "view" });
  replace(main, view);
  const module = PAGES[current.page];
  if (!module) { replace(view, errorBox({ status: 404, message: "No such page." })); return; }
  try {
    const page = await import(module);
    const done = await page.render(view, current);
    if (view.isConnected) cleanup = typeof done === "function" ? done : null;
    else if (typeof done === "function") done();
  } catch (err) {
    replace(view, errorBox(err));
  }
}

function showSignIn(message) {
  document.getElementById("signout").hidden = true;
  clearToast({ force: true });
  if (config.auth === "oidc") {
    replace(main, h("section", { class: "card narrow" },
      h("h1", {}, "Sign in"),
      message ? h("p", { class: "error" }, message) : null,
      h("p", {}, "Sign in with your organisation's identity provider."),
      h("button", { type: "button", class: "primary", onclick: () => startOidc().catch((e) => showSignIn(e.message)) },
        "Sign in")));
    return;
  }
  if (config.auth !== "dev") {
    replace(main, errorBox({ message: "Sign-in is not configured: set ConsoleClientId on the stack." }));
    return;
  }
  const input = h("input", { type: "password", id: "token", name: "token", autocomplete: "off", required: true,
    placeholder: "dev-token-alice" });
  const form = h("form", { class: "card narrow", id: "signin" },
    h("h1", {}, "Sign in"),
    message ? h("p", { class: "error" }, message) : null,
    h("label", { class: "field" }, h("span", {}, "Bearer token"), input,
      h("small", { class: "muted" }, "kairos dev prints it (Authorization: Bearer …). Kept in this tab only.")),
    h("button", { type: "submit", class: "primary" }, "Sign in"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    useDevToken(input.value);
    route();
  });
  replace(main, form);
  input.focus();
}

async function start() {
  config = await loadConfig();
  whenSignedOut((message) => { if (cleanup) { cleanup(); cleanup = null; } showSignIn(message); });
  document.getElementById("signout").addEventListener("click", () => signOut());
  try {
    await finishOidc();
  } catch (err) {
    showSignIn(err.message);
    return;
  }
  window.addEventListener("hashchange", route);
  route();
}

start().catch((err) => replace(main, errorBox(err)));
