// The run trace drawn as a timeline, in server sequence order: one lane per attempt; within it a row
// per step (started / finished folded together, with its folded progress count), per effect
// (reserved / settled), per approval or input wait, and the terminal event, marked. add(events)
// extends the drawing with a page read after the last sequence: nothing already drawn is re-read,
// except an open step's own started row (one event), whose folded progress count moves while it runs.
// It also keeps the waits for a person it has drawn (waits: approval or input, from, to), which the
// run page's steps view draws on its time axis.

import { h } from "./dom.js";

const WAIT_OPENS = { "approval.waiting": "approval", "input.waiting": "input" };
const WAIT_CLOSES = { "approval.approved": "approval", "approval.denied": "approval", "input.answered": "input" };
const TERMINAL = new Set(["run.succeeded", "run.failed", "run.cancelled", "run.expired", "run.abandoned",
  "run.policy_blocked"]);

export function isTerminalEvent(type) { return TERMINAL.has(type); }

function kindOf(type) {
  if (TERMINAL.has(type)) return "terminal";
  return type.split(".")[0];
}

function details(data) {
  const parts = [];
  for (const [key, value] of Object.entries(data || {})) {
    if (value === null || value === undefined || typeof value === "object") continue;
    parts.push(`${key} ${value}`);
  }
  return parts.join(" · ");
}

function clock(iso, origin) {
  const ms = new Date(iso).getTime() - origin;
  return Number.isFinite(ms) ? `+${(ms / 1000).toFixed(1)}s` : "";
}

export class Timeline {
  constructor(container) {
    this.root = h("ol", { class: "timeline", id: "timeline", "aria-label": "Run trace" });
    container.append(this.root);
    this.lanes = new Map();   // attempt -> <ol>
    this.steps = new Map();   // `${attempt}/${step}` -> row parts
    this.origin = null;
    this.last = 0;
    this.waits = [];          // {attempt, kind, from, to}: to is null while the run still waits
  }

  wait(e) {
    if (WAIT_OPENS[e.type]) this.waits.push({ attempt: e.attempt, kind: WAIT_OPENS[e.type], from: e.at, to: null });
    const kind = WAIT_CLOSES[e.type];
    for (const w of this.waits) {
      if (!w.to && (TERMINAL.has(e.type) || w.kind === kind)) w.to = e.at;
    }
  }

  lane(attempt) {
    let lane = this.lanes.get(attempt);
    if (!lane) {
      lane = h("ol", { class: "lane-events" });
      this.root.append(h("li", { class: "lane", dataset: { attempt: String(attempt) } },
        h("div", { class: "lane-title" }, attempt === 0 ? "Before the first claim" : `Attempt ${attempt}`), lane));
      this.lanes.set(attempt, lane);
    }
    return lane;
  }

  add(events) {
    for (const e of events) {
      if (e.seq <= this.last) continue;  // a page never overlaps, but a retry of one must not redraw
      this.last = e.seq;
      if (this.origin === null) this.origin = new Date(e.at).getTime();
      this.draw(e);
    }
  }

  // The open step's row, if any: its step.started seq (re-read alone to fold its newest progress).
  openStep() {
    for (const row of this.steps.values()) if (row.open) return row.seq;
    return null;
  }

  // Folds a re-read step.started row's progress count into its drawn row (progress is never listed).
  fold(e) {
    const row = this.steps.get(`${e.attempt}/${e.step}`);
    if (!row || e.type !== "step.started") return;
    row.progress.textContent = e.progress_count
      ? ` · ${e.progress_count} progress, last ${new Date(e.last_progress_at).toLocaleTimeString()}` : "";
  }

  draw(e) {
    this.wait(e);
    const lane = this.lane(e.attempt);
    const key = `${e.attempt}/${e.step}`;
    if (e.step && e.type === "step.finished" && this.steps.has(key)) {
      const row = this.steps.get(key);
      row.open = false;
      const took = (new Date(e.at).getTime() - row.at) / 1000;
      const outcome = e.data && e.data.outcome ? ` ${e.data.outcome}` : "";
      row.status.textContent = `finished${outcome}${Number.isFinite(took) ? ` in ${took.toFixed(1)}s` : ""}`;
      row.el.classList.add("done");
      row.el.dataset.seqs += ` ${e.seq}`;
      return;
    }
    const el = h("li", { class: `ev ev-${kindOf(e.type)}`, dataset: { type: e.type, seqs: String(e.seq) } },
      h("span", { class: "t" }, clock(e.at, this.origin)),
      h("span", { class: "dot", "aria-hidden": "true" }),
      h("span", { class: "label" }, e.type === "step.started" ? `step ${e.step}` : e.type));
    if (e.type === "step.started") {
      const status = h("span", { class: "status" }, "running");
      const progress = h("span", { class: "muted progress" });
      el.append(" ", status, progress);
      this.steps.set(key, { el, status, progress, seq: e.seq, open: true, at: new Date(e.at).getTime() });
      this.fold(e);
    } else {
      const text = details(e.data);
      if (text) el.append(h("span", { class: "muted detail" }, ` ${text}`));
      if (e.step && e.type !== "run.claimed") el.append(h("span", { class: "muted" }, ` (${e.step})`));
    }
    if (e.type === "approval.waiting" && e.data && e.data.approval_id) {
      el.append(" ", h("a", { href: "#/approvals" }, "decide"));
    }
    lane.append(el);
  }
}
