// Baton admin dashboard: this front door's slowest recent requests (GET
// /admin/api/slow-requests, router/frontdoor/slow_requests.py) as a table, and the selected
// one's door-side spans as a timeline: one bar per span, offset and width to scale of the
// request's end-to-end time, labelled with its duration. admin.js polls `refreshSlow`.
"use strict";

const slow = { by: "e2e", selected: null, shown: "", report: null };

// A span's colour by what it waited on.
const SPAN_KINDS = {
  "baton.request": "request", "door.parse": "door", "door.chat_template": "door",
  "door.tokenize": "door", "baton.attempt": "attempt", "router.route": "route",
  "prefill_gate.wait": "gate", "decode.reserve": "call", "decode.admit": "call",
  "prefill": "prefill", "first_token": "first", "decode": "decode", "finish": "finish",
};

// The attributes worth reading beside a span's name, and how to print them.
const KiB = (n) => n >= 1 << 20 ? (n / (1 << 20)).toFixed(1) + " MiB" : (n / 1024).toFixed(0) + " KiB";
const count = (n, noun) => `${n} ${noun}${n === 1 ? "" : "s"}`;
const SPAN_FACTS = [
  ["baton.attempt", (v) => `try ${v}`],
  ["baton.retry.reason", (v) => `after ${v}`],
  ["baton.route.prefill_worker", (v) => v ? `→ ${v}` : "prefill on decode"],
  ["baton.route.prefill_cached_blocks", (v) => count(v, "cached block")],
  ["baton.route.reason", (v) => v],
  ["baton.cached_tokens", (v) => count(v, "cached token")],
  ["baton.blocks_sent", (v) => `${count(v, "block")} sent`],
  ["baton.kv.bytes", (v) => KiB(v)],
  ["baton.tokens.from", (v, a) => `tokens ${v}–${a["baton.tokens.to"]}`],
  ["baton.finish_reason", (v) => v],
];

const seconds = (s) => s === null || s === undefined ? "—"
  : s < 1 ? (1000 * s).toFixed(s < 0.01 ? 2 : 1) + " ms" : s.toFixed(2) + " s";
const keyOf = (r) => `${r.trace_id}/${r.request_id}/${r.finished_at}`;

async function refreshSlow() {
  slow.report = await api("slow-requests");
  renderSlow();
}

function renderSlow() {
  const report = slow.report;
  const text = JSON.stringify([slow.by, slow.selected, report]);
  if (report === null || text === slow.shown) return; // unchanged: keep the DOM (and a hover)
  slow.shown = text;
  const about = document.getElementById("slow-about");
  const rows = document.getElementById("slow-rows");
  rows.replaceChildren();
  if (!report.enabled) {
    about.textContent = "off (baton serve --slow-requests 0)";
    document.getElementById("timeline").hidden = true;
    return;
  }
  const kept = report[slow.by];
  about.textContent = `the ${report.capacity} slowest of the last ` +
    `${Math.round(report.window_s / 60)} min at this door`;
  if (!kept.some((r) => keyOf(r) === slow.selected)) {
    slow.selected = kept.length ? keyOf(kept[0]) : null; // the slowest, until one is picked
  }
  for (const r of kept) {
    const row = rows.insertRow();
    row.className = "slow" + (keyOf(r) === slow.selected ? " selected" : "");
    row.dataset.requestId = r.request_id;
    cell(row, new Date(r.finished_at * 1000).toLocaleTimeString());
    cell(row, r.request_id || "(no id)");
    cell(row, seconds(r.ttft_s));
    cell(row, seconds(r.e2e_s));
    cell(row, `${r.prompt_tokens} → ${r.output_tokens}`);
    cell(row, r.prefill_worker || "—");
    cell(row, r.decode_worker || "—");
    cell(row, String(r.retries));
    cell(row, r.status, r.status === "ok" ? "" : "error");
    row.addEventListener("click", () => { slow.selected = keyOf(r); renderSlow(); });
  }
  renderTimeline(kept.find((r) => keyOf(r) === slow.selected));
}

function renderTimeline(request) {
  const box = document.getElementById("timeline");
  box.hidden = !request;
  box.replaceChildren();
  if (!request) return;
  const title = document.createElement("h3");
  title.textContent = `${request.request_id || "(no id)"}: TTFT ` +
    `${seconds(request.ttft_s)}, end to end ${seconds(request.e2e_s)}` +
    (request.trace_id ? `  (trace ${request.trace_id})` : "");
  box.appendChild(title);
  const total = Math.max(request.e2e_s, ...request.spans.map((s) => s.start_s + s.duration_s));
  const at = (s) => (100 * s / total).toFixed(3) + "%";
  for (const span of request.spans) {
    const row = document.createElement("div");
    row.className = "span-row";
    row.dataset.span = span.name;
    const label = document.createElement("div");
    label.className = "span-label";
    label.style.paddingLeft = (1.1 * span.depth) + "rem";
    const facts = SPAN_FACTS.filter(([k]) => k in span.attributes)
      .map(([k, f]) => f(span.attributes[k], span.attributes));
    label.textContent = span.name + (span.worker ? ` @ ${span.worker}` : "");
    if (facts.length) {
      const more = document.createElement("span");
      more.className = "muted";
      more.textContent = "  " + facts.join(", ");
      label.appendChild(more);
    }
    label.title = Object.entries(span.attributes).map(([k, v]) => `${k} = ${v}`).join("\n");
    const track = document.createElement("div");
    track.className = "span-track";
    const bar = document.createElement("div");
    bar.className = `span-bar kind-${SPAN_KINDS[span.name] || "door"}` + (span.error ? " error" : "");
    bar.style.left = at(span.start_s);
    bar.style.width = at(span.duration_s);
    bar.title = label.title;
    const time = document.createElement("span");
    time.className = "span-time";
    time.textContent = seconds(span.duration_s);
    const end = (span.start_s + span.duration_s) / total;
    if (end > 0.8) time.style.right = (100 * (1 - span.start_s / total) + 0.5).toFixed(3) + "%";
    else time.style.left = `calc(${at(span.start_s + span.duration_s)} + 4px)`;
    track.append(bar, time);
    row.append(label, track);
    box.appendChild(row);
  }
  const axis = document.createElement("div");
  axis.className = "span-axis";
  for (const f of [0, 0.25, 0.5, 0.75, 1]) {
    const tick = document.createElement("span");
    tick.style.left = (100 * f) + "%";
    tick.textContent = seconds(f * total);
    axis.appendChild(tick);
  }
  box.appendChild(axis);
}

for (const b of document.querySelectorAll("#slow-requests .tabs button")) {
  b.addEventListener("click", () => {
    slow.by = b.dataset.by;
    slow.selected = null;
    for (const other of document.querySelectorAll("#slow-requests .tabs button")) {
      other.classList.toggle("on", other === b);
    }
    renderSlow();
  });
}
