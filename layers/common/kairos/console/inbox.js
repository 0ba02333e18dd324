// The inbox: notes Kairos left on your conversations (a schedule paused after failures, an approval
// requested, a goal loop's question, a run that ended as its notify asked), newest conversations
// first. Each note shows its kind, its run (linked to the run's page), why it was left, and when.

import { call, qs } from "./api.js";
import { h, replace, when } from "./dom.js";

const KINDS = {
  approval_requested: "Approval requested",
  input_required: "Question from a goal loop",
  goal_completed: "Goal completed",
  goal_blocked: "Goal blocked",
  run_ended: "Run ended",
  schedule_paused: "Schedule paused",
  notify_gave_up: "Notification gave up",
};

// Why the note was left, in words, from its body (each kind carries its own fields).
export function reason(kind, body) {
  const b = body || {};
  if (typeof b.reason === "string" && b.reason) return b.reason;
  switch (kind) {
    case "approval_requested": return `${b.tool || "a tool"} call waits for your approval`;
    case "input_required": return "the loop's run asks you a question";
    case "goal_completed": return "the loop reached its goal and fires no more";
    case "goal_blocked": return "the loop is blocked and paused";
    case "run_ended": return `ended ${b.state || ""}${b.reason_code ? ` (${b.reason_code})` : ""}`.trim();
    case "notify_gave_up": return `the notify webhook failed ${b.attempts ?? "?"} times` +
      `${b.last_status ? ` (last status ${b.last_status})` : ""}${b.last_error ? `: ${b.last_error}` : ""}`;
    default: return b.reason_code || "";
  }
}

function note(n) {
  const body = n.body || {};
  const runId = typeof body.run_id === "string" ? body.run_id : null;
  const scheduleId = typeof body.schedule_id === "string" ? body.schedule_id
    : typeof body.loop_id === "string" ? body.loop_id : null;
  const links = [
    runId ? h("a", { class: "note-run", href: `#/runs/${encodeURIComponent(runId)}` }, `run ${runId.slice(0, 8)}`) : null,
    scheduleId ? h("a", { href: `#/schedules/${encodeURIComponent(scheduleId)}` },
      `${body.loop_id ? "loop" : "schedule"} ${scheduleId.slice(0, 8)}`) : null,
    n.kind === "approval_requested" ? h("a", { href: "#/approvals" }, "decide") : null,
    n.kind === "input_required" ? h("a", { href: "#/approvals" }, "answer") : null,
  ].filter(Boolean);
  return h("li", { class: "note", dataset: { kind: n.kind } },
    h("strong", { class: "note-kind" }, KINDS[n.kind] || n.kind), " ",
    h("span", { class: "muted note-time" }, when(n.created_at)),
    h("div", { class: "note-reason" }, reason(n.kind, body)),
    links.length ? h("div", { class: "actions" }, links) : null);
}

export async function render(main) {
  // The conversations you created: a run's thread gets no notes of its own.
  const { conversations } = await call("GET", `/v1/conversations${qs({ threads: "false", limit: 20 })}`);
  const box = h("div", { id: "inbox" }, h("p", { class: "muted" }, "Loading…"));
  replace(main, h("div", { class: "head" }, h("h1", {}, "Inbox")), box);
  const inboxes = await Promise.all(conversations.map(async (c) =>
    [c, (await call("GET", `/v1/conversations/${encodeURIComponent(c.id)}/inbox`)).notes]));
  const shown = inboxes.filter(([, notes]) => notes.length);
  replace(box, shown.length ? shown.map(([c, notes]) => h("section", { class: "card" },
    h("h2", {}, c.title || `conversation ${c.id.slice(0, 8)}`),
    h("ol", { class: "notes" }, notes.map(note))))
    : h("p", { class: "muted" }, "No notes."));
}
