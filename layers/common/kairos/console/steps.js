// A run's steps (the API's steps route) drawn on one time axis: a lane per attempt, each model turn
// or tool call a bar from its start to its end (a running step to now), each wait for a person (an
// approval or an answer, read from the trace) a hatched bar in its attempt's lane. Every step opens
// to its input, output, target, usage and state; a running model step shows its answer so far (live
// output: the page redraws the steps on every poll while the run goes on). Values reach the page only as text (dom.js):
// a preview is JSON.stringify'd into a <pre>'s text, never parsed as markup. Positions are set through
// the CSSOM (element.style), which the strict policy allows, never a style attribute.

import { call, qs } from "./api.js";
import { h, replace } from "./dom.js";

const PAGE = 100;

function ms(iso) {
  const t = new Date(iso).getTime();
  return Number.isFinite(t) ? t : null;
}

function seconds(from, to) {
  return `${((to - from) / 1000).toFixed(1)}s`;
}

function json(value) {
  return value === null || value === undefined ? "—" : JSON.stringify(value, null, 2);
}

function usageText(usage) {
  if (!usage) return "—";
  const parts = [];
  if (usage.input_tokens !== undefined) parts.push(`${usage.input_tokens} in · ${usage.output_tokens ?? 0} out`);
  if (usage.cost_usd !== undefined) parts.push(`$${Number(usage.cost_usd).toFixed(6)}`);
  if (usage.tool_calls) parts.push(`${usage.tool_calls} tool call`);
  if (usage.duration_ms !== undefined) parts.push(`${usage.duration_ms} ms`);
  return parts.join(" · ") || json(usage);
}

function targetText(target) {
  return target ? `${target.method} ${target.host}${target.path}` : "—";
}

// A running model step's answer so far (its output preview, grown by the worker while the model
// streams), shown under its bar without opening it; nothing for any other step.
function liveText(step) {
  if (step.state !== "running" || step.kind !== "model" || !step.output) return null;
  const out = step.output;
  const text = typeof out.content === "string" ? out.content
    : out.truncated ? `${out.head || ""}… (${out.bytes} bytes so far)` : null;
  if (!text) return null;
  return h("p", { class: "step-live", "aria-live": "polite" }, text);
}

// Reads every page of a run's steps (they change state while the run goes on: always from the first).
export async function readSteps(runId) {
  const steps = [];
  let after = 0;
  for (;;) {
    const page = await call("GET", `/v1/runs/${encodeURIComponent(runId)}/steps${qs({ after, limit: PAGE })}`);
    steps.push(...page.steps);
    if (page.steps.length < PAGE) return steps;
    after = page.next_after;
  }
}

export class StepsView {
  constructor(container) {
    this.root = h("div", { id: "steps", class: "steps", "aria-label": "Run steps on a time axis" });
    container.append(this.root);
    this.opened = new Set();  // the steps a reader opened stay open when the view is redrawn
  }

  // steps: the API's steps; waits: [{attempt, kind, from, to|null}] from the trace; now: ms.
  draw(steps, waits, now) {
    const starts = [...steps.map((s) => ms(s.started_at)), ...waits.map((w) => ms(w.from))].filter((t) => t !== null);
    if (!starts.length) { replace(this.root, h("p", { class: "muted", id: "steps-empty" }, "No steps yet.")); return; }
    const origin = Math.min(...starts);
    const ends = [...steps.map((s) => (s.finished_at ? ms(s.finished_at) : now)),
      ...waits.map((w) => (w.to ? ms(w.to) : now))].filter((t) => t !== null);
    const span = Math.max(1, Math.max(...ends, origin + 1) - origin);
    const place = (el, from, to) => {
      el.style.left = `${((from - origin) / span) * 100}%`;
      el.style.width = `${Math.max(0.5, ((to - from) / span) * 100)}%`;
    };
    const attempts = [...new Set([...steps.map((s) => s.attempt), ...waits.map((w) => w.attempt)])].sort((a, b) => a - b);
    const lanes = attempts.map((attempt) => {
      const rows = [];
      for (const wait of waits.filter((w) => w.attempt === attempt)) {
        const to = wait.to ? ms(wait.to) : now;
        const bar = h("span", { class: `bar wait${wait.to ? "" : " open"}` });
        place(bar, ms(wait.from), to);
        const label = `waiting for ${wait.kind === "input" ? "an answer" : "approval"} · ${seconds(ms(wait.from), to)}${wait.to ? "" : " so far"}`;
        rows.push(h("li", { class: "step-row wait-row", dataset: { kind: "wait", at: String(ms(wait.from)) } },
          h("div", { class: "track" }, bar), h("div", { class: "step-label muted" }, label)));
      }
      for (const step of steps.filter((s) => s.attempt === attempt)) rows.push(this.row(step, place, now));
      rows.sort((a, b) => Number(a.dataset.at || 0) - Number(b.dataset.at || 0));
      return h("li", { class: "lane", dataset: { attempt: String(attempt) } },
        h("div", { class: "lane-title" }, `Attempt ${attempt}`), h("ol", { class: "step-rows" }, rows));
    });
    replace(this.root,
      h("div", { class: "axis" }, h("span", {}, "+0.0s"), h("span", { id: "steps-span" }, `+${(span / 1000).toFixed(1)}s`)),
      h("ol", { class: "step-lanes" }, lanes));
  }

  row(step, place, now) {
    const from = ms(step.started_at);
    const to = step.finished_at ? ms(step.finished_at) : now;
    const bar = h("span", { class: `bar st-${step.state} kind-${step.kind}` });
    place(bar, from, to);
    const key = String(step.step);
    const details = h("details", { class: "step-detail", open: this.opened.has(key),
      ontoggle: () => { if (details.open) this.opened.add(key); else this.opened.delete(key); } },
      h("summary", {}, `step ${step.step} · ${step.kind} ${step.name} · `,
        h("span", { class: "step-state" }, step.state), ` · ${seconds(from, to)}${step.finished_at ? "" : " so far"}`),
      h("dl", { class: "facts" },
        h("dt", {}, "State"), h("dd", { class: "step-state-full" }, step.state + (step.pruned_at ? " (previews forgotten)" : "")),
        h("dt", {}, "Target"), h("dd", { class: "step-target" }, targetText(step.target)),
        h("dt", {}, "Usage"), h("dd", { class: "step-usage" }, usageText(step.usage)),
        h("dt", {}, "Input"), h("dd", {}, h("pre", { class: "step-input" }, json(step.input))),
        h("dt", {}, "Output"), h("dd", {}, h("pre", { class: "step-output" }, json(step.output)))));
    return h("li", { class: "step-row", dataset: { step: key, state: step.state, kind: step.kind, at: String(from) } },
      h("div", { class: "track" }, bar), details, liveText(step));
  }
}
