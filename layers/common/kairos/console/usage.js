// Usage per UTC day as a bar chart (inline SVG built with DOM APIs: no chart library, no markup
// strings), with the numbers in a table beside it for screen readers and exact values.

import { call, qs } from "./api.js";
import { h, replace, s, table } from "./dom.js";

function chart(days) {
  const width = 720;
  const height = 200;
  const pad = 28;
  const max = Math.max(1, ...days.map((d) => d.input_tokens + d.output_tokens));
  const step = (width - pad) / Math.max(1, days.length);
  const bar = Math.max(2, step * 0.7);
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img", id: "usage-chart",
    "aria-label": "Tokens per day" });
  svg.append(s("line", { x1: pad, y1: height - pad, x2: width, y2: height - pad, class: "axis" }));
  svg.append(s("text", { x: 0, y: 12, class: "tick" }, max.toLocaleString()));
  days.forEach((d, i) => {
    const x = pad + i * step + (step - bar) / 2;
    const scale = (height - 2 * pad) / max;
    const hIn = d.input_tokens * scale;
    const hOut = d.output_tokens * scale;
    const base = height - pad;
    const title = s("title", {}, `${d.day}: ${d.input_tokens} in, ${d.output_tokens} out, ${d.runs} runs`);
    svg.append(s("g", {}, title,
      s("rect", { x, y: base - hIn, width: bar, height: hIn, class: "in" }),
      s("rect", { x, y: base - hIn - hOut, width: bar, height: hOut, class: "out" })));
    if (i % Math.ceil(days.length / 7) === 0) {
      svg.append(s("text", { x, y: height - 8, class: "tick" }, d.day.slice(5)));
    }
  });
  return svg;
}

export async function render(main, route) {
  const daysBack = Number(route.params.get("days") || 14);
  const until = new Date(Date.now() + 86400000).toISOString().slice(0, 10);
  const from = new Date(Date.now() - (daysBack - 1) * 86400000).toISOString().slice(0, 10);
  const { days } = await call("GET", `/v1/usage${qs({ from, until })}`);
  const total = days.reduce((a, d) => a + d.cost_usd, 0);
  replace(main, h("div", { class: "head" }, h("h1", {}, "Usage"),
    h("div", { class: "actions" }, [7, 14, 30].map((n) => h("a", { class: "button", href: `#/usage?days=${n}` }, `${n} days`)))),
  h("p", {}, `Total cost in this window: $${total.toFixed(4)}. `, h("span", { class: "legend in" }, "input"), " ",
    h("span", { class: "legend out" }, "output"), " tokens."),
  h("div", { class: "card" }, chart(days)),
  table(["Day", "Input tokens", "Output tokens", "Calls", "Runs", "Cost (USD)"], days.slice().reverse().map((d) =>
    h("tr", {}, h("td", {}, d.day), h("td", {}, String(d.input_tokens)), h("td", {}, String(d.output_tokens)),
      h("td", {}, String(d.calls)), h("td", {}, String(d.runs)), h("td", {}, d.cost_usd.toFixed(4))))));
}
