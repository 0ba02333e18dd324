// Runs: newest first in keyset pages (next_before), filtered by schedule, state and source; the
// filters live in the address (#/runs?state=failed) so a filtered view can be linked.

import { call, qs } from "./api.js";
import { badge, h, replace, table, when } from "./dom.js";

const STATES = ["", "queued", "running", "awaiting_approval", "awaiting_input", "succeeded", "failed", "cancelled",
  "expired", "abandoned", "policy_blocked"];
const SOURCES = ["", "scheduled", "webhook", "manual", "backfill", "chat"];

function select(name, options, value) {
  return h("select", { name, id: `filter-${name}` },
    options.map((o) => h("option", { value: o, selected: o === value }, o || `any ${name}`)));
}

export async function render(main, route) {
  const filters = { schedule_id: route.params.get("schedule_id") || "", state: route.params.get("state") || "",
    source: route.params.get("source") || "" };
  const before = route.params.get("before") || "";
  const page = await call("GET", `/v1/runs${qs({ ...filters, before, limit: 25 })}`);
  const { schedules } = await call("GET", "/v1/schedules");
  const scheduleSelect = h("select", { name: "schedule_id", id: "filter-schedule_id" },
    h("option", { value: "" }, "any schedule"),
    schedules.map((s) => h("option", { value: s.id, selected: s.id === filters.schedule_id }, s.name || s.id.slice(0, 8))));
  const form = h("form", { class: "filters", id: "run-filters" }, scheduleSelect,
    select("state", STATES, filters.state), select("source", SOURCES, filters.source),
    h("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = Object.fromEntries(new FormData(form).entries());
    location.hash = `#/runs${qs(data)}`;
  });
  const rows = page.runs.map((r) => h("tr", {},
    h("td", {}, h("a", { href: `#/runs/${encodeURIComponent(r.id)}` }, r.id.slice(0, 8))),
    h("td", {}, badge(r.state), r.waiting_for ? h("span", { class: "muted" }, ` waits for a ${r.waiting_for}`) : null),
    h("td", {}, r.source),
    h("td", {}, String(r.attempt)),
    h("td", {}, when(r.created_at)),
    h("td", {}, when(r.finished_at)),
    h("td", { class: "muted" }, r.diagnosis ? r.diagnosis.reason_code : "")));
  const nav = h("div", { class: "actions" },
    before ? h("a", { class: "button", href: `#/runs${qs(filters)}` }, "Newest") : null,
    page.next_before ? h("a", { class: "button", id: "older", href: `#/runs${qs({ ...filters, before: page.next_before })}` },
      "Older") : null);
  replace(main, h("div", { class: "head" }, h("h1", {}, "Runs")), form,
    rows.length ? table(["Run", "State", "Source", "Attempt", "Created", "Finished", "Reason"], rows, { id: "runs-table" })
      : h("p", { class: "muted", id: "runs-table" }, "No runs match."),
    nav);
}
