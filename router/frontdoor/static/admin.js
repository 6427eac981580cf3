// Baton admin dashboard: polls the admin JSON endpoints (the HttpOnly cookie set with the
// page carries the token) and draws pools, workers, three small canvas charts and the slow
// requests (slow_requests.js).
"use strict";

const POLL_MS = 1000;
const WINDOW_S = 60;
const statusEl = document.getElementById("status");
const poolsEl = document.getElementById("pools");

// Drop ?token= from the address bar: the cookie now carries it.
if (window.location.search.includes("token=")) {
  window.history.replaceState(null, "", window.location.pathname);
}

async function api(path, options) {
  const response = await fetch("/admin/api/" + path, {
    credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    ...options,
  });
  const body = await response.json();
  if (!response.ok) {
    throw new Error((body.error && body.error.message) || response.statusText);
  }
  return body;
}

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function button(label, id, onClick) {
  const b = document.createElement("button");
  b.textContent = label;
  b.id = id;
  b.addEventListener("click", onClick);
  return b;
}

const pct = (x) => (100 * x).toFixed(1) + "%";

function renderPools(state) {
  poolsEl.replaceChildren();
  for (const pool of state.pools) {
    const box = document.createElement("div");
    box.className = "pool";
    box.id = "pool-" + pool.name;
    const title = document.createElement("h2");
    title.textContent = `${pool.name} pool `;
    const size = document.createElement("span");
    size.className = "muted";
    size.id = `pool-${pool.name}-size`;
    size.textContent = `${pool.workers.length} workers, desired ${pool.desired_size}`;
    title.appendChild(size);
    title.appendChild(button("−", `scale-${pool.name}-down`,
      () => scale(pool.name, Math.max(0, pool.desired_size - 1))));
    title.appendChild(button("+", `scale-${pool.name}-up`,
      () => scale(pool.name, pool.desired_size + 1)));
    box.appendChild(title);
    if (pool.autoscale) {
      // The autoscaler's most recent evaluation of this pool: its verdict and what it read.
      const a = pool.autoscale;
      const line = document.createElement("p");
      line.className = "muted autoscale";
      line.id = `pool-${pool.name}-autoscale`;
      line.textContent = `autoscale: ${a.size} → ${a.target} (${a.reason}; pressure ` +
        `${a.pressure.toFixed(2)}; queued ${a.signals.queued}, oldest wait ` +
        `${a.signals.oldest_wait_s.toFixed(2)} s, busy ${pct(a.signals.busy)}, ` +
        `KV ${pct(a.signals.kv_usage)})`;
      box.appendChild(line);
    }

    const table = document.createElement("table");
    const head = table.createTHead().insertRow();
    for (const h of ["worker", "role", "state", "running", "waiting", "KV", "prefix hits",
                     "adapters", ""]) {
      const th = document.createElement("th");
      th.textContent = h;
      head.appendChild(th);
    }
    const body = table.createTBody();
    for (const w of pool.workers) {
      const row = body.insertRow();
      row.className = "worker";
      row.dataset.workerId = w.worker_id;
      cell(row, w.worker_id);
      cell(row, w.role);
      cell(row, w.state, "state-" + w.state);
      cell(row, String(w.num_running));
      cell(row, String(w.num_waiting));
      cell(row, pct(w.kv_usage));
      cell(row, pct(w.prefix_hit_rate));
      cell(row, (w.adapters || []).join(", "));
      const td = cell(row, "");
      if (w.state === "ready" || w.state === "starting") {
        td.appendChild(button("drain", "drain-" + w.worker_id, () => drain(w.worker_id)));
      }
    }
    box.appendChild(table);
    poolsEl.appendChild(box);
  }
}

// The autoscaler's last decisions that changed a pool, newest first, with what each read.
function renderHistory(state) {
  const history = state.autoscale_history || [];
  document.getElementById("autoscale-history").hidden = history.length === 0;
  const rows = document.getElementById("autoscale-history-rows");
  rows.replaceChildren();
  for (const d of history.slice().reverse()) {
    const row = rows.insertRow();
    row.className = "decision";
    cell(row, new Date(d.at * 1000).toLocaleTimeString());
    cell(row, d.pool);
    cell(row, `${d.size} → ${d.target}`);
    cell(row, d.reason);
    cell(row, d.pressure.toFixed(2));
    const inputs = Object.entries(d.signals)
      .filter(([, v]) => v !== null)
      .map(([k, v]) => `${k}=${Number.isInteger(v) ? v : v.toPrecision(3)}`);
    cell(row, inputs.join(" "), "muted");
  }
}

async function scale(pool, size) {
  statusEl.textContent = `scaling ${pool} to ${size}…`;
  try {
    renderPools(await api(`pools/${encodeURIComponent(pool)}/scale`,
      { method: "POST", body: JSON.stringify({ size }) }));
    statusEl.textContent = `${pool} scaled to ${size}`;
  } catch (e) {
    statusEl.textContent = "scale failed: " + e.message;
  }
}

async function drain(workerId) {
  try {
    renderPools(await api(`workers/${encodeURIComponent(workerId)}/drain`, { method: "POST" }));
    statusEl.textContent = `draining ${workerId}`;
  } catch (e) {
    statusEl.textContent = "drain failed: " + e.message;
  }
}

// A line chart of (t, y) points; gaps (null) break the line.
function drawChart(canvas, ts, ys, color) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 40;
  ctx.clearRect(0, 0, w, h);
  ctx.strokeStyle = "#c4c9d4";
  ctx.strokeRect(pad, 4, w - pad - 4, h - pad);
  const values = ys.filter((y) => y !== null);
  if (values.length === 0) {
    ctx.fillStyle = "#8a93a6";
    ctx.fillText("no requests yet", pad + 8, h / 2);
    return;
  }
  const now = Math.max(...ts, Date.now() / 1000);
  const t0 = now - WINDOW_S;
  const yMax = Math.max(...values) * 1.15 || 1;
  ctx.fillStyle = "#8a93a6";
  ctx.fillText(yMax.toPrecision(2), 2, 12);
  ctx.fillText("0", 2, h - pad);
  ctx.fillText(`−${WINDOW_S} s`, pad, h - 8);
  ctx.fillText("now", w - 28, h - 8);
  ctx.strokeStyle = color;
  ctx.lineWidth = 2;
  ctx.beginPath();
  let drawing = false;
  for (let i = 0; i < ts.length; i++) {
    if (ys[i] === null || ts[i] < t0) { drawing = false; continue; }
    const x = pad + ((ts[i] - t0) / (now - t0)) * (w - pad - 4);
    const y = 4 + (1 - ys[i] / yMax) * (h - pad - 4);
    if (drawing) ctx.lineTo(x, y); else ctx.moveTo(x, y);
    drawing = true;
  }
  ctx.stroke();
}

// Throughput is a rate: a second without finished requests is 0, not a gap.
function everySecond(ts, ys) {
  const now = Math.floor(Date.now() / 1000);
  const byT = new Map(ts.map((t, i) => [t, ys[i]]));
  const outT = [], outY = [];
  for (let t = now - WINDOW_S; t <= now; t++) {
    outT.push(t);
    outY.push(byT.get(t) || 0);
  }
  return [outT, outY];
}

function renderStats(stats) {
  drawChart(document.getElementById("chart-ttft"), stats.t, stats.ttft_s, "#2874a6");
  drawChart(document.getElementById("chart-tpot"), stats.t, stats.tpot_s, "#7d3c98");
  const [ts, tokens] = everySecond(stats.t, stats.tokens_per_s);
  const any = stats.t.length > 0;
  drawChart(document.getElementById("chart-throughput"), ts, any ? tokens : ts.map(() => null),
    "#1e8449");
}

async function poll() {
  try {
    const [state, stats] = await Promise.all([api("state"), api("stats"), refreshSlow()]);
    renderPools(state);
    renderHistory(state);
    renderStats(stats);
    statusEl.textContent = "updated " + new Date().toLocaleTimeString();
    statusEl.classList.remove("error");
  } catch (e) {
    statusEl.textContent = "cannot reach the server: " + e.message;
    statusEl.classList.add("error");
  }
  window.setTimeout(poll, POLL_MS);
}

poll();
