// Schedules: the list (status, last run, next fire in the schedule's zone), one schedule (its next
// fires in local time with offset and fold, DST changes marked; occurrences; pause, resume, trigger,
// edit, backfill, cancel, rotate a webhook token showing the new URL once), and the create form.
// A goal loop (loop: true) is a schedule with a goal: it shows its goal, and is neither triggered nor
// backfilled (the API refuses both with 409 loop_policy); it is edited through the loops route.

import { call, qs } from "./api.js";
import { badge, errorBox, field, h, replace, table, toast, when } from "./dom.js";

// "2026-12-07T09:00:00Z" in zone -> "Mon 7 Dec 2026, 10:00 GMT+01:00"
export function inZone(iso, zone) {
  if (!iso) return "—";
  try {
    return new Intl.DateTimeFormat(undefined, {
      timeZone: zone, weekday: "short", year: "numeric", month: "short", day: "numeric",
      hour: "2-digit", minute: "2-digit", timeZoneName: "longOffset",
    }).format(new Date(iso));
  } catch { return when(iso); }
}

function rule(s) {
  if (s.loop) return `goal loop · ${plainRule(s)}`;
  return plainRule(s);
}

function plainRule(s) {
  if (s.kind === "cron") return `cron ${s.cron}`;
  if (s.kind === "interval") return `every ${s.interval_seconds}s`;
  if (s.kind === "once") return `once at ${when(s.starts_at)}`;
  return s.kind;
}

function act(label, action, cls = "") {
  return h("button", { type: "button", class: cls, onclick: action }, label);
}

async function run(action, done, message) {
  try {
    const answer = await action();
    if (message) toast(typeof message === "function" ? message(answer) : message, "ok");
    await done(answer);
  } catch (err) {
    toast(err.message, "bad");
  }
}

function controls(s, done) {
  const id = encodeURIComponent(s.id);
  const buttons = [];
  if (s.status === "active") {
    buttons.push(act("Pause", () => {
      const reason = window.prompt("Why pause it? (optional, shown with the schedule)", "");
      run(() => call("POST", `/v1/schedules/${id}/pause`, reason ? { reason: reason.slice(0, 500) } : undefined),
        done, "Paused");
    }));
  }
  if (s.status === "paused" || s.status === "draft") {
    buttons.push(act("Resume", () => run(() => call("POST", `/v1/schedules/${id}/resume`), done, "Resumed")));
  }
  if (!s.loop && (s.status === "active" || s.status === "paused")) {
    buttons.push(act("Trigger", () => run(() => call("POST", `/v1/schedules/${id}/trigger`), done,
      (a) => `Run ${a.run_id} queued`)));
    buttons.push(act("Test run", () => run(() => call("POST", `/v1/schedules/${id}/test`), done,
      (a) => `Test run ${a.run_id} queued: model calls are real, nothing is sent`)));
  }
  if (s.status !== "cancelled" && s.status !== "completed") {
    buttons.push(act("Cancel", () => {
      if (!window.confirm(`Cancel schedule "${s.name || s.id}"? This cannot be undone.`)) return;
      run(() => call("DELETE", `/v1/schedules/${id}`), done, "Cancelled");
    }, "danger"));
  }
  return h("div", { class: "actions" }, buttons);
}

async function renderList(main) {
  const { schedules } = await call("GET", "/v1/schedules");
  const rows = schedules.map((s) => h("tr", { dataset: { schedule: s.id } },
    h("td", {}, h("a", { href: `#/schedules/${encodeURIComponent(s.id)}` }, s.name || s.id.slice(0, 8))),
    h("td", {}, rule(s), s.loop && s.goal ? h("div", { class: "goal" }, `Goal: ${s.goal.outcome}`) : null,
      h("div", { class: "muted" }, s.timezone)),
    h("td", {}, badge(s.status)),
    h("td", {}, s.last_run
      ? [h("a", { href: `#/runs/${encodeURIComponent(s.last_run.id)}` }, badge(s.last_run.state)), " ",
        h("span", { class: "muted" }, s.last_run.source)]
      : h("span", { class: "muted" }, "none")),
    h("td", {}, s.next_fire_at ? inZone(s.next_fire_at, s.timezone) : "—",
      s.jitter_seconds && s.next_dispatch_at
        ? h("div", { class: "muted" }, `dispatch ${inZone(s.next_dispatch_at, s.timezone)}`) : null),
    h("td", {}, controls(s, () => renderList(main)))));
  replace(main,
    h("div", { class: "head" }, h("h1", {}, "Schedules"),
      h("a", { class: "button primary", href: "#/schedules/new" }, "New schedule")),
    schedules.length
      ? table(["Name", "Rule", "Status", "Last run", "Next fire (local)", ""], rows, { id: "schedules-table" })
      : h("p", { id: "schedules-table", class: "muted" }, "No schedules yet."));
}

// Marks each fire whose UTC offset differs from the fire before it (a DST change between them).
export function markDst(fires) {
  return fires.map((f, i) => ({ ...f, change: i > 0 && fires[i - 1].utc_offset !== f.utc_offset
    ? `${fires[i - 1].utc_offset} → ${f.utc_offset}` : null }));
}

function firesTable(fires) {
  const rows = markDst(fires).map((f) => h("tr", { class: f.change ? "dst" : null },
    h("td", {}, f.local_time.replace("T", " "),
      f.change ? h("span", { class: "dst-mark", title: "UTC offset changes before this fire" },
        ` DST change ${f.change}`) : null),
    h("td", {}, f.utc_offset),
    h("td", {}, String(f.fold)),
    h("td", { class: "muted" }, f.fire_at),
    h("td", { class: "muted" }, f.dispatch_at && f.dispatch_at !== f.fire_at ? f.dispatch_at : "at fire")));
  return table(["Local time", "Offset", "Fold", "UTC", "Dispatch (UTC, jitter)"], rows, { id: "fires" });
}

function shownOnce(webhook) {
  return h("div", { class: "card once", id: "webhook-url" },
    h("strong", {}, "Webhook URL — shown once, copy it now"),
    h("code", { class: "wrap" }, webhook.url));
}

async function renderOne(main, id, shown) {
  const sid = encodeURIComponent(id);
  const { schedule: s } = await call("GET", `/v1/schedules/${sid}`);
  const again = () => renderOne(main, id);
  const fireBox = h("div", {});
  const more = async (count) => {
    if (!s.next_fire_at) { replace(fireBox, h("p", { class: "muted" }, "No future fires.")); return; }
    const { fires } = await call("GET", `/v1/schedules/${sid}/preview${qs({ count })}`);
    replace(fireBox, firesTable(fires), count < 100
      ? h("button", { type: "button", onclick: () => more(100) }, "Show 100 fires") : null);
  };
  const extra = [];
  if (s.kind === "webhook" && (s.status === "active" || s.status === "paused")) {
    extra.push(act("Rotate token", () => run(
      () => call("POST", `/v1/schedules/${sid}/token`, { overlap_seconds: 3600 }),
      (a) => renderOne(main, id, a.webhook), "New token; the old one works for 1 hour")));
  }
  const occurrences = h("div", {});
  replace(main,
    h("div", { class: "head" }, h("h1", {}, s.name || "Schedule"), badge(s.status)),
    shown ? shownOnce(shown) : null,
    h("dl", { class: "facts" },
      h("dt", {}, "Rule"), h("dd", {}, rule(s)),
      s.loop ? goalFacts(s) : null,
      h("dt", {}, "Zone"), h("dd", {}, `${s.timezone} (gap ${s.dst_gap}, fold ${s.dst_fold})`),
      s.flow ? [h("dt", {}, "Flow"), h("dd", { id: "flow" }, flowText(s.flow))] : null,
      s.kind === "cron" || s.kind === "interval" ? [h("dt", {}, "Jitter"), h("dd", { id: "jitter" }, s.jitter_seconds
        ? `up to ${s.jitter_seconds} s after each fire (next dispatch ${s.next_dispatch_at || "—"})` : "none")] : null,
      h("dt", {}, "Revision"), h("dd", { id: "revision" }, String(s.revision)),
      h("dt", {}, "Limits"), h("dd", { id: "schedule-limits" }, s.limits && Object.keys(s.limits).length
        ? Object.entries(s.limits).map(([k, v]) => `${k} ${v}`).join(" · ") : "defaults"),
      h("dt", {}, "Prompt"), h("dd", { class: "pre" }, s.prompt || ""),
      h("dt", {}, "Last run"), h("dd", {}, s.last_run
        ? h("a", { href: `#/runs/${encodeURIComponent(s.last_run.id)}` }, `${s.last_run.state} · ${when(s.last_run.created_at)}`)
        : "none"),
      h("dt", {}, "Failures"), h("dd", {}, String(s.consecutive_failures ?? 0)),
      s.status === "paused" ? [h("dt", {}, "Paused"), h("dd", { id: "paused-reason" },
        `${when(s.paused_at)}${s.paused_reason ? ` — ${s.paused_reason}` : ""}`)] : null),
    h("div", { class: "actions" }, controls(s, again), extra,
      h("a", { class: "button", href: `#/schedules/${sid}/edit` }, "Edit"),
      h("a", { class: "button", href: `#/runs?schedule_id=${sid}` }, "Runs")),
    s.kind !== "webhook" && !s.loop ? backfillForm(s, again) : null,
    h("h2", {}, "Next fires"), fireBox,
    h("h2", {}, "Occurrences"), occurrences);
  await more(25);
  const { occurrences: list } = await call("GET", `/v1/schedules/${sid}/occurrences${qs({ limit: 10 })}`);
  replace(occurrences, list.length ? table(["Fire (local)", "Source", "Decision", "Rev", "Run", "Dispatched (UTC)"], list.map((o) => h("tr", {},
    h("td", {}, `${o.local_time.replace("T", " ")} ${o.utc_offset}`), h("td", {}, o.source),
    h("td", { title: o.decision === "coalesced" ? "folded into the run on the right (debounce or batch)" : null },
      o.covers_count > 1 ? `${o.decision} ×${o.covers_count}` : o.decision),
    h("td", {}, String(o.schedule_revision)),
    h("td", {}, o.run_id ? h("a", { href: `#/runs/${encodeURIComponent(o.run_id)}` }, o.run_id.slice(0, 8)) : "—"),
    h("td", { class: "muted" }, o.dispatch_at || o.fire_at))))
    : h("p", { class: "muted" }, "None yet."));
}

// A webhook's flow settings in one line (docs/api.md "Webhook flow").
export function flowText(flow) {
  const parts = [];
  if (flow.debounce_seconds) parts.push(`debounce ${flow.debounce_seconds} s`);
  if (flow.batch) parts.push(`batch of ${flow.batch.max_events} or ${flow.batch.max_wait_seconds} s`);
  if (flow.concurrency) parts.push(`at most ${flow.concurrency.limit ?? 1} running per ${flow.concurrency.key}`);
  parts.push(flow.over_rate === "defer" ? "over the rate: deferred" : "over the rate: rejected (429)");
  return parts.join(" · ");
}

// A loop's goal as the API shows it: the outcome, its constraints, and the verification's digest only
// (the verification text is given to the loop's runs, never shown back).
function goalFacts(s) {
  const goal = s.goal || {};
  return [
    h("dt", {}, "Goal"), h("dd", { class: "pre", id: "goal-outcome" }, goal.outcome || "—"),
    (goal.constraints || []).length
      ? [h("dt", {}, "Constraints"), h("dd", {}, h("ul", {}, goal.constraints.map((c) => h("li", {}, c))))] : null,
    h("dt", {}, "Goal revision"), h("dd", {}, String(goal.revision ?? s.goal_revision ?? "—")),
    s.input_run_id ? [h("dt", {}, "Waiting on"), h("dd", {},
      h("a", { href: `#/runs/${encodeURIComponent(s.input_run_id)}` }, `run ${s.input_run_id.slice(0, 8)}`),
      " (answer its question under Approvals)")] : null,
  ];
}

function backfillForm(s, done) {
  const from = h("input", { type: "datetime-local", name: "from", required: true });
  const until = h("input", { type: "datetime-local", name: "until", required: true });
  const max = h("input", { type: "number", name: "max", min: 1, max: 100, value: 10 });
  const form = h("form", { class: "inline card" }, h("strong", {}, "Backfill"),
    field("From (your time)", from), field("Until", until), field("At most", max),
    h("button", { type: "submit" }, "Backfill"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const body = { from: new Date(from.value).toISOString(), until: new Date(until.value).toISOString(),
      max: Number(max.value) };
    run(() => call("POST", `/v1/schedules/${encodeURIComponent(s.id)}/backfill`, body), done,
      (a) => `${a.occurrences.length} backfill occurrences`);
  });
  return h("details", {}, h("summary", {}, "Backfill past fires"), form);
}

const KINDS = ["cron", "interval", "once", "webhook"];
const LIMITS = [["runtime_seconds", "Runtime seconds"], ["max_attempts", "Max attempts"], ["max_steps", "Max steps"],
  ["rate_per_minute", "Deliveries per minute"]];
const LIMIT_DEFAULTS = { runtime_seconds: 600, max_attempts: 3, max_steps: 8, rate_per_minute: 60 };

function select(name, options, value) {
  return h("select", { name }, options.map((o) => h("option", { value: o, selected: o === value }, o)));
}

async function renderForm(main, id) {
  const editing = Boolean(id);
  const s = editing ? (await call("GET", `/v1/schedules/${encodeURIComponent(id)}`)).schedule : {};
  const zone = s.timezone || Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
  const inputs = {
    name: h("input", { name: "name", value: s.name || "", maxlength: 200 }),
    prompt: h("textarea", { name: "prompt", required: true, rows: 3 }, s.prompt || ""),
    kind: select("kind", s.loop ? ["cron", "interval"] : KINDS, s.kind || "cron"),
    cron: h("input", { name: "cron", value: s.cron || "0 7 * * 1-5", placeholder: "0 7 * * 1-5" }),
    interval_seconds: h("input", { name: "interval_seconds", type: "number", min: 300, value: s.interval_seconds || "" }),
    starts_at: h("input", { name: "starts_at", type: "datetime-local" }),
    timezone: h("input", { name: "timezone", value: zone }),
    dst_gap: select("dst_gap", ["auto", "shift_forward", "skip"], s.dst_gap || "auto"),
    dst_fold: select("dst_fold", ["auto", "first", "last", "both"], s.dst_fold || "auto"),
    mode: select("mode", ["fork", "append", "fresh"], s.mode || "fork"),
    overlap: select("overlap", ["allow", "skip", "queue_one", "cancel_replace"], s.overlap || "allow"),
    jitter_seconds: h("input", { name: "jitter_seconds", type: "number", min: 0, max: 3600, value: s.jitter_seconds || 0 }),
  };
  // Limits (docs/api.md "Limits"): empty means the agent's or the default; rate_per_minute is a webhook's.
  const limits = s.limits || {};
  const limitInputs = Object.fromEntries(LIMITS.map(([name]) => [name, h("input", {
    name: `limits.${name}`, id: `limits-${name}`, type: "number", min: 1, value: limits[name] ?? "",
    placeholder: `default ${LIMIT_DEFAULTS[name]}` })]));
  let conversation = null;
  if (!editing) {
    // Only the conversations the user made: the threads fork and fresh runs leave are not pickable.
    const { conversations } = await call("GET", `/v1/conversations${qs({ threads: "false", limit: 100 })}`);
    conversation = select("conversation_id", conversations.map((c) => c.id), conversations[0]?.id);
    for (const [i, c] of conversations.entries()) conversation.options[i].textContent = `${c.title || "untitled"} · ${c.id.slice(0, 8)}`;
  }
  const problem = h("div", {});
  const form = h("form", { class: "card", id: "schedule-form" },
    h("h1", {}, editing ? `Edit ${s.name || "schedule"}` : "New schedule"),
    conversation ? field("Conversation", conversation) : null,
    field("Name", inputs.name), field("Prompt", inputs.prompt), field("Kind", inputs.kind),
    field("Cron (5 fields, wall clock of the zone)", inputs.cron), field("Interval seconds", inputs.interval_seconds),
    field("Starts at (once / interval anchor)", inputs.starts_at), field("Time zone (IANA)", inputs.timezone),
    h("div", { class: "row" }, field("DST gap", inputs.dst_gap), field("DST fold", inputs.dst_fold),
      s.loop ? null : [field("Mode", inputs.mode), field("Overlap", inputs.overlap),
        field("Jitter seconds (cron, interval)", inputs.jitter_seconds)]),
    s.loop ? h("p", { class: "muted" }, "A goal loop always appends to its conversation and skips a fire while a run " +
      "is in flight; its goal is changed through the loops API.") : null,
    s.loop ? null : h("fieldset", { class: "row", id: "limits" }, h("legend", {}, "Limits (each run; empty: default)"),
      LIMITS.filter(([name]) => name !== "rate_per_minute" || (s.kind || "cron") === "webhook")
        .map(([name, label]) => field(label, limitInputs[name]))),
    problem, h("button", { type: "submit", class: "primary" }, editing ? "Save" : "Create"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const kind = inputs.kind.value;
    const body = { name: inputs.name.value, prompt: inputs.prompt.value, kind, timezone: inputs.timezone.value,
      dst_gap: inputs.dst_gap.value, dst_fold: inputs.dst_fold.value };
    if (!s.loop) Object.assign(body, { mode: inputs.mode.value, overlap: inputs.overlap.value });
    if (!s.loop && (kind === "cron" || kind === "interval")) body.jitter_seconds = Number(inputs.jitter_seconds.value || 0);
    if (kind === "cron") body.cron = inputs.cron.value;
    if (kind === "interval") body.interval_seconds = Number(inputs.interval_seconds.value);
    if (inputs.starts_at.value) body.starts_at = new Date(inputs.starts_at.value).toISOString();
    if (!s.loop) {
      // An edit merges inside limits: an emptied one is null (back to the default); a create sends the set ones.
      const given = {};
      for (const [name] of LIMITS) {
        if (name === "rate_per_minute" && kind !== "webhook") continue;
        const raw = limitInputs[name].value;
        if (raw !== "") given[name] = Number(raw);
        else if (editing && limits[name] !== undefined) given[name] = null;
      }
      if (Object.keys(given).length) body.limits = given;
    }
    try {
      if (editing && s.loop) {  // a loop is edited through its own route (the schedule route refuses it)
        await call("PATCH", `/v1/loops/${encodeURIComponent(id)}`, body, { "If-Match": `"${s.revision}"` });
        toast("Saved", "ok", { carry: true });
        location.hash = `#/schedules/${encodeURIComponent(id)}`;
      } else if (editing) {
        await call("PATCH", `/v1/schedules/${encodeURIComponent(id)}`, body, { "If-Match": `"${s.revision}"` });
        toast("Saved", "ok", { carry: true });
        location.hash = `#/schedules/${encodeURIComponent(id)}`;
      } else {
        body.conversation_id = conversation.value;
        const created = await call("POST", "/v1/schedules", body);
        toast("Created", "ok");
        await renderOne(main, created.schedule.id, created.webhook);
        history.replaceState(null, "", `#/schedules/${encodeURIComponent(created.schedule.id)}`);
      }
    } catch (err) {
      replace(problem, errorBox(err));
    }
  });
  replace(main, form);
  // Opened from a diagnosis (#/schedules/ID/edit?field=limits.runtime_seconds): that field has focus.
  const wanted = new URLSearchParams(location.hash.split("?")[1] || "").get("field");
  const target = wanted && form.querySelector(`[name="${CSS.escape(wanted)}"]`);
  if (target) { target.classList.add("wanted"); target.focus(); }
  else if (wanted) replace(problem, h("p", { class: "muted", id: "field-hint" },
    `Change ${wanted}: this form does not edit it; change it with the API's PATCH of this schedule.`));
}

export async function render(main, route) {
  if (route.id === "new") return renderForm(main, null);
  const sub = location.hash.split("?")[0].split("/")[3];
  if (route.id && sub === "edit") return renderForm(main, route.id);
  if (route.id) return renderOne(main, route.id);
  return renderList(main);
}
