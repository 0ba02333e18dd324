// Operator status: your due backlog and fire lag, runs in flight, and the run queue's DLQ depth,
// refreshed every 5 s while the page is open.

import { call } from "./api.js";
import { h, replace, when } from "./dom.js";

function tile(label, value, warn, id) {
  return h("div", { class: `tile${warn ? " warn" : ""}`, id }, h("div", { class: "value" }, value), h("div", {}, label));
}

export async function render(main) {
  let timer = null;
  let stopped = false;
  const draw = async () => {
    const { status: st } = await call("GET", "/v1/status");
    replace(main, h("div", { class: "head" }, h("h1", {}, "Status"), h("span", { class: "muted" }, `as of ${when(st.now)}`)),
      h("div", { class: "tiles" },
        tile("schedules due", String(st.due_backlog), st.due_backlog > 0, "due-backlog"),
        tile("fire lag (s)", st.fire_lag_seconds.toFixed(1), st.fire_lag_seconds > 120, "fire-lag"),
        tile("DLQ depth", st.dlq_depth === null ? "n/a" : String(st.dlq_depth), st.dlq_depth > 0, "dlq-depth"),
        tile("queued", String(st.queued), false), tile("running", String(st.running), false),
        tile("awaiting approval", String(st.awaiting_approval ?? 0), false)),
      h("p", { class: "muted" }, "Backlog and lag count your schedules; the DLQ is the deployment's run queue."));
    if (!stopped) timer = setTimeout(() => draw().catch(() => {}), 5000);
  };
  await draw();
  return () => { stopped = true; clearTimeout(timer); };
}
