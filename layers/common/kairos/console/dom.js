// DOM helpers: every value reaches the page through textContent or setAttribute, never as markup,
// so a schedule named "<script>" is shown as text. No string is ever parsed as HTML in the console.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) {
      if (typeof value === "function") el.addEventListener(key.slice(2), value);  // never a handler string
    } else if (key === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

const SVG = "http://www.w3.org/2000/svg";

export function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, String(value));
  append(el, children);
  return el;
}

export function badge(state) {
  return h("span", { class: `badge st-${String(state).replace(/[^a-z_]/g, "")}` }, state);
}

export function when(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : d.toLocaleString();
}

export function ago(iso) {
  if (!iso) return "—";
  const secs = Math.round((Date.now() - new Date(iso).getTime()) / 1000);
  if (Math.abs(secs) < 60) return `${secs}s ago`;
  if (Math.abs(secs) < 3600) return `${Math.round(secs / 60)}m ago`;
  if (Math.abs(secs) < 86400) return `${Math.round(secs / 3600)}h ago`;
  return `${Math.round(secs / 86400)}d ago`;
}

// A message about what the user just did, for 5 s. It belongs to the page it was shown on: leaving
// that page clears it (clearToast, called by the router), unless it announces the very navigation it
// precedes ({ carry: true }: "Saved", then the saved schedule's page), which it then survives once.
export function toast(message, kind = "info", { carry = false } = {}) {
  const box = document.getElementById("toast");
  box.hidden = false;
  box.className = `show ${kind}`;
  box.textContent = message;
  toast.carry = carry;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => clearToast({ force: true }), 5000);
}

export function clearToast({ force = false } = {}) {
  if (toast.carry && !force) {  // shown for 5 s on the page it announces
    toast.carry = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => clearToast({ force: true }), 5000);
    return;
  }
  const box = document.getElementById("toast");
  clearTimeout(toast.timer);
  toast.carry = false;
  box.className = "";
  box.textContent = "";
  box.hidden = true;
}

export function table(headers, rows, attrs = {}) {
  // Each cell carries its column's name: a phone-width screen shows rows as labelled cards.
  for (const row of rows) [...row.children].forEach((cell, i) => { if (headers[i]) cell.dataset.label = headers[i]; });
  return h("div", { class: "scroll" },
    h("table", attrs,
      h("thead", {}, h("tr", {}, headers.map((x) => h("th", { scope: "col" }, x)))),
      h("tbody", {}, rows)));
}

export function field(label, input, hint) {
  return h("label", { class: "field" }, h("span", {}, label), input, hint ? h("small", { class: "muted" }, hint) : null);
}

export function errorBox(err) {
  const fields = (err && err.fields) || [];
  return h("div", { class: "error", role: "alert" },
    h("strong", {}, err && err.status === 404 ? "Not found" : "Error"), " ",
    (err && err.message) || String(err),
    fields.length ? h("ul", {}, fields.map((f) => h("li", {}, `${f.field}: ${f.message} (${f.rule})`))) : null);
}
