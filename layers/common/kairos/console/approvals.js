// Waiting for you: pending tool-call approvals (approve, deny) and a goal loop's input requests
// (answer), refreshed every 5 s. Each shows its run; deciding one requeues that run (or ends it
// policy_blocked).

import { call, qs } from "./api.js";
import { errorBox, h, replace, table, toast, when } from "./dom.js";

// The JSON text of a preview's value, indented; a string that is itself JSON (the API gives the
// arguments as their JSON text) is parsed first, so nothing is escaped twice. A text that does not
// parse (the bounded preview cut it) is shown as it is. Always text: it reaches the page as textContent.
export function pretty(value) {
  if (typeof value === "string") {
    try { return JSON.stringify(JSON.parse(value), null, 2); } catch { return value; }
  }
  return JSON.stringify(value, null, 2);
}

// What the approver must see of a call: where it goes first (an http call's method and whole URL),
// then the arguments as far as the preview goes, whether they were cut, and what the body that will
// be sent is (its size and SHA-256); any other field of the preview as it is. The tool has its column.
function preview(p) {
  if (!p || typeof p !== "object") return h("code", { class: "wrap" }, p === null || p === undefined ? "" : String(p));
  const target = p.target && typeof p.target === "object" ? p.target : null;
  const body = p.body && typeof p.body === "object" ? p.body : null;
  const rest = Object.entries(p).filter(([key]) => !["tool", "target", "arguments", "truncated", "body"].includes(key));
  return h("div", { class: "preview" },
    target ? h("div", { class: "target" }, h("strong", {}, `${target.method || ""} `), h("code", { class: "wrap" }, target.url)) : null,
    rest.map(([key, value]) => h("div", { class: "muted" }, `${key} `, h("code", {}, typeof value === "string" ? value : JSON.stringify(value)))),
    "arguments" in p ? h("pre", { class: "args" }, pretty(p.arguments)) : null,
    p.truncated ? h("div", { class: "muted" }, "Cut to the preview's bound: the call holds more.") : null,
    body && body.sha256 ? h("div", { class: "muted" }, `body sent: ${body.bytes} bytes, SHA-256 ${body.sha256}`) : null);
}

async function approvals(box) {
  const { approvals: list } = await call("GET", `/v1/approvals${qs({ state: "pending" })}`);
  const decide = (a, verb) => async () => {
    try {
      const id = encodeURIComponent(a.id);
      if (verb === "approve") await call("POST", `/v1/approvals/${id}/approve`);
      else await call("POST", `/v1/approvals/${id}/deny`);
      toast(verb === "approve" ? "Approved: the run continues" : "Denied: the run ends policy_blocked", "ok");
    } catch (err) { toast(err.message, "bad"); }
    await approvals(box);
  };
  replace(box, h("h2", {}, "Tool calls waiting for approval"), list.length
    ? table(["Tool", "Arguments", "Run", "Expires", ""], list.map((a) => h("tr", { dataset: { approval: a.id } },
      h("td", {}, a.tool),
      h("td", {}, preview(a.preview)),
      h("td", {}, h("a", { href: `#/runs/${encodeURIComponent(a.run_id)}` }, a.run_id.slice(0, 8))),
      h("td", {}, when(a.expires_at)),
      h("td", {}, h("div", { class: "actions" },
        h("button", { type: "button", class: "primary", onclick: decide(a, "approve") }, "Approve"),
        h("button", { type: "button", class: "danger", onclick: decide(a, "deny") }, "Deny"))))), { id: "approvals-table" })
    : h("p", { class: "muted", id: "approvals-table" }, "Nothing waits for approval."));
}

async function inputs(box) {
  let list;
  try {
    ({ input_requests: list } = await call("GET", `/v1/input-requests${qs({ state: "pending" })}`));
  } catch (err) {
    replace(box, h("h2", {}, "Questions from goal loops"), errorBox(err));
    return;
  }
  replace(box, h("h2", {}, "Questions from goal loops"), list.length
    ? h("ul", { class: "cards", id: "input-requests" }, list.map((q) => {
      const answer = h("textarea", { name: "answer", rows: 2, required: true });
      const form = h("form", { class: "card" },
        h("p", { class: "pre" }, q.question),
        h("p", { class: "muted" }, "run ", h("a", { href: `#/runs/${encodeURIComponent(q.run_id)}` }, q.run_id.slice(0, 8)),
          ` · asked ${when(q.created_at)}`),
        answer, h("button", { type: "submit", class: "primary" }, "Answer"));
      form.addEventListener("submit", async (event) => {
        event.preventDefault();
        try {
          await call("POST", `/v1/input-requests/${encodeURIComponent(q.id)}/answer`, { answer: answer.value });
          toast("Answered: the run continues", "ok");
        } catch (err) { toast(err.message, "bad"); }
        await inputs(box);
      });
      return h("li", {}, form);
    }))
    : h("p", { class: "muted", id: "input-requests" }, "No open questions."));
}

export async function render(main) {
  const a = h("section", {});
  const q = h("section", {});
  replace(main, h("div", { class: "head" }, h("h1", {}, "Waiting for you")), a, q);
  await Promise.all([approvals(a), inputs(q)]);
  // New requests appear without a reload; a form being filled in is left alone.
  let stopped = false;
  let timer = null;
  const again = async () => {
    if (stopped) return;
    const typing = main.contains(document.activeElement) && /^(TEXTAREA|INPUT)$/.test(document.activeElement.tagName);
    if (!typing) {
      await Promise.all([approvals(a), inputs(q)]).catch(() => {});
    }
    if (!stopped) timer = setTimeout(again, 5000);
  };
  timer = setTimeout(again, 5000);
  return () => { stopped = true; clearTimeout(timer); };
}
