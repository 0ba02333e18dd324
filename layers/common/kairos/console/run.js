// One run: its state, its steps on a time axis (steps.js), the trace as a timeline that follows a live run by reading only after the last
// sequence it has drawn (never the whole trace again), the output projection, and a failed run's
// diagnosis with its recovery actions as buttons. A missing or foreign run is the API's 404.

import { call, qs } from "./api.js";
import { badge, errorBox, h, replace, toast, when } from "./dom.js";
import { readSteps, StepsView } from "./steps.js";
import { isTerminalEvent, Timeline } from "./timeline.js";

const FINISHED = new Set(["succeeded", "failed", "cancelled", "expired", "abandoned", "policy_blocked"]);
const POLL_MS = 1000;

// What each recovery action means; its control comes from the diagnosis' executable form (actions).
const GUIDANCE = {
  check_agent_config: "Check the schedule's agent (executor, model, base_url).",
  check_secret: "Check the agent's api_key_secret: store your key through the secrets API, then point the agent at it.",
  check_egress_allow: "The endpoint is not an allowed destination: point the agent's base_url at a public host.",
  check_target: "The target answered with an error or not in time: check it (and the agent's base_url), then retry.",
  raise_runtime_limit: "The run hit its runtime limit: raise the schedule's limits.runtime_seconds.",
  raise_max_steps: "The tool loop used all its model turns: raise the schedule's limits.max_steps.",
  report_issue: "This looks like a Kairos fault: report it with the run id and its trace.",
};
const LABELS = { retry_run: "Retry run", resume_schedule: "Resume schedule", raise_runtime_limit: "Raise runtime limit",
  raise_max_steps: "Raise max steps", report_issue: "Report: open the trace" };

function facts(run) {
  const usage = run.usage || {};
  return h("dl", { class: "facts" },
    h("dt", {}, "Source"), h("dd", {}, run.source),
    h("dt", {}, "Schedule"), h("dd", {}, run.schedule_id
      ? h("a", { href: `#/schedules/${encodeURIComponent(run.schedule_id)}` }, run.schedule_id.slice(0, 8)) : "—"),
    h("dt", {}, "Attempt"), h("dd", {}, `${run.attempt} of ${run.max_attempts ?? "?"}`),
    run.deliveries ? [h("dt", {}, "Deliveries"), h("dd", { id: "deliveries" },
      `${run.deliveries} (${run.flow_window === "batch" ? "batched" : "debounced"})`)] : null,
    run.held_until && run.state === "queued" ? [h("dt", {}, "Held until"), h("dd", {}, when(run.held_until))] : null,
    h("dt", {}, "Revision"), h("dd", { id: "run-revision" }, run.schedule_revision == null ? "—" : String(run.schedule_revision)),
    h("dt", {}, "Agent"), h("dd", {}, h("code", { id: "agent-digest", title: run.agent_digest || "" },
      run.agent_digest ? `sha256:${run.agent_digest.slice(0, 12)}` : "—")),
    h("dt", {}, "Limits"), h("dd", { id: "run-limits" }, run.limits
      ? `${run.limits.runtime_seconds} s · ${run.limits.max_attempts} attempts · ${run.limits.max_steps} steps` : "—"),
    run.waiting_for ? [h("dt", {}, "Waits for"), h("dd", { id: "waiting-for" }, run.waiting_for === "key"
      ? "a slot of its concurrency key (another run of the same key holds it)"
      : "one of your running slots (your other runs hold them all)")] : null,
    h("dt", {}, "Created"), h("dd", {}, when(run.created_at)),
    h("dt", {}, "Finished"), h("dd", {}, when(run.finished_at)),
    h("dt", {}, "Usage"), h("dd", {}, `${usage.input_tokens ?? 0} in · ${usage.output_tokens ?? 0} out · ` +
      `${usage.calls ?? 0} calls · $${Number(usage.cost_usd ?? 0).toFixed(4)}`));
}

// One control per recovery action: a POST performs its route; a field to change opens the schedule's
// edit form at that field; a GET (the trace) opens the route's answer. An action without a form for this
// run (a chat turn has no schedule) explains itself.
function control(run, action, form, hint, refresh) {
  const label = LABELS[action] || action.replaceAll("_", " ");
  const explain = () => { hint.textContent = GUIDANCE[action] || action; };
  if (form && form.method === "POST") {
    return h("button", { type: "button", class: action === "retry_run" ? "primary" : "", dataset: { action },
      onclick: async () => {
        try {
          const answer = await call("POST", form.path);
          if (answer && answer.run_id) location.hash = `#/runs/${encodeURIComponent(answer.run_id)}`;
          else { toast(`${label}: done`, "ok"); refresh(); }
        } catch (err) { toast(err.message, "bad"); }
      } }, label);
  }
  if (form && form.method === "PATCH" && form.field && run.schedule_id) {
    return h("button", { type: "button", dataset: { action }, onclick: () => {
      explain();
      location.hash = `#/schedules/${encodeURIComponent(run.schedule_id)}/edit${qs({ field: form.field })}`;
    } }, label);
  }
  if (form && form.method === "GET") {
    return h("button", { type: "button", dataset: { action }, onclick: async () => {
      explain();
      try {
        const page = await call("GET", form.path);
        hint.append(h("pre", { class: "output", id: "report" }, JSON.stringify({ run_id: run.id, ...page }, null, 2)));
      } catch (err) { toast(err.message, "bad"); }
    } }, label);
  }
  return h("button", { type: "button", dataset: { action }, onclick: explain }, label);
}

function diagnosis(run, refresh) {
  const d = run.diagnosis;
  if (!d) return null;
  const hint = h("div", { class: "muted", id: "guidance" });
  const forms = Object.fromEntries((d.actions || []).map((a) => [a.action, a]));
  const buttons = (d.recovery_actions || []).map((action) => control(run, action, forms[action], hint, refresh));
  return h("section", { class: "card diagnosis", id: "diagnosis" },
    h("h2", {}, "Diagnosis"),
    h("p", { class: "summary" }, d.summary),
    h("p", { class: "muted" }, `reason ${d.reason_code} · scope ${d.scope} · `,
      d.retry_eligible ? "retry-safe" : "not retry-eligible"),
    h("div", { class: "actions" }, buttons), hint);
}

async function output(run, box) {
  const { output: o } = await call("GET", `/v1/runs/${encodeURIComponent(run.id)}/output`);
  replace(box, h("h2", {}, "Output"),
    o.state === "available" && typeof o.text === "string"
      ? h("pre", { class: "output", id: "output-text" }, o.text, o.truncated ? "\n…" : "")
      : h("p", { class: "muted", id: "output-text" }, `${o.state}${o.reason ? ` (${o.reason})` : ""}`));
}

export async function render(main, route) {
  const id = encodeURIComponent(route.id);
  let run;
  try {
    run = (await call("GET", `/v1/runs/${id}`)).run;
  } catch (err) {
    replace(main, h("h1", {}, "Run"), err.status === 404
      ? h("div", { class: "error", role: "alert", id: "not-found" }, "Run not found: no run of yours has this id.")
      : errorBox(err));
    return null;
  }
  const state = h("span", { id: "run-state" }, badge(run.state));
  const info = h("div", {}, facts(run));
  const controls = h("div", { class: "actions" });
  const diag = h("div", {});
  const out = h("div", {});
  const trace = h("section", { class: "card" }, h("h2", {}, "Trace"));
  const stepsCard = h("section", { class: "card" }, h("h2", {}, "Steps"));
  replace(main, h("div", { class: "head" }, h("h1", {}, `Run ${run.id.slice(0, 8)}`), state),
    info, controls, diag, stepsCard, trace, out);
  const timeline = new Timeline(trace);
  const stepsView = new StepsView(stepsCard);
  const drawSteps = async () => stepsView.draw(await readSteps(run.id), timeline.waits, Date.now());
  let stopped = false;
  let timer = null;
  let sawTerminal = false;

  const show = (r) => {
    run = r;
    replace(state, badge(r.state));
    replace(info, facts(r));
    replace(controls, FINISHED.has(r.state) ? null : h("button", { type: "button", class: "danger", onclick: async () => {
      try { await call("POST", `/v1/runs/${id}/cancel`); toast("Cancel requested", "ok"); } catch (err) { toast(err.message, "bad"); }
    } }, "Cancel run"));
    replace(diag, diagnosis(r, refreshRun));
  };
  const refreshRun = async () => show((await call("GET", `/v1/runs/${id}`)).run);

  // Reads every page after the last drawn sequence; true when something new arrived.
  const readTrace = async () => {
    let grew = false;
    for (;;) {
      const page = await call("GET", `/v1/runs/${id}/events${qs({ after: timeline.last, limit: 200 })}`);
      if (!page.events.length) return grew;
      grew = true;
      timeline.add(page.events);
      if (page.events.some((e) => isTerminalEvent(e.type))) sawTerminal = true;
      if (page.events.length < 200) return grew;
    }
  };

  // An open step's started row, alone: the server folds its step.progress events into it.
  const readProgress = async () => {
    const seq = timeline.openStep();
    if (seq === null) return;
    const page = await call("GET", `/v1/runs/${id}/events${qs({ after: seq - 1, limit: 1 })}`);
    for (const e of page.events) timeline.fold(e);
  };

  const follow = async () => {
    if (stopped) return;
    try {
      const grew = await readTrace();
      if (!grew && !FINISHED.has(run.state)) await readProgress();
      if (grew || !FINISHED.has(run.state)) { await refreshRun(); await drawSteps(); }
      // Terminal replay ends only once the durable terminal event is drawn and the run says so too.
      if (sawTerminal && FINISHED.has(run.state)) { await output(run, out); return; }
    } catch (err) {
      toast(err.message, "bad");
    }
    if (!stopped) timer = setTimeout(follow, POLL_MS);
  };
  show(run);
  await output(run, out);
  await follow();
  return () => { stopped = true; clearTimeout(timer); };
}
