// The inbox: notes Kairos left on your conversations (a schedule paused after failures, an approval
// requested, a run that ended as its notify asked), newest conversations first.

import { call, qs } from "./api.js";
import { h, replace, when } from "./dom.js";

function note(n) {
  const parts = [];
  for (const [key, value] of Object.entries(n)) {
    if (["kind", "created_at", "id", "seq"].includes(key) || value === null || typeof value === "object") continue;
    parts.push(`${key} ${value}`);
  }
  const runId = n.run_id || (n.data && n.data.run_id);
  return h("li", { class: "note" }, h("strong", {}, n.kind), " ", h("span", { class: "muted" }, when(n.created_at)),
    h("div", {}, parts.join(" · ")),
    runId ? h("a", { href: `#/runs/${encodeURIComponent(runId)}` }, "open run") : null);
}

export async function render(main) {
  const { conversations } = await call("GET", `/v1/conversations${qs({ limit: 20 })}`);
  const box = h("div", { id: "inbox" });
  replace(main, h("div", { class: "head" }, h("h1", {}, "Inbox")), box);
  const roots = conversations.filter((c) => !c.parent_id);
  const inboxes = await Promise.all(roots.map(async (c) =>
    [c, (await call("GET", `/v1/conversations/${encodeURIComponent(c.id)}/inbox`)).notes]));
  const shown = inboxes.filter(([, notes]) => notes.length);
  replace(box, shown.length ? shown.map(([c, notes]) => h("section", { class: "card" },
    h("h2", {}, c.title || `conversation ${c.id.slice(0, 8)}`),
    h("ol", { class: "notes" }, notes.map(note))))
    : h("p", { class: "muted" }, "No notes."));
}
