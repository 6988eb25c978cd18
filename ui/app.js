// outboxd dashboard: polls the JSON API and renders it. No framework, no CDN.
"use strict";

const BASE = document.body.dataset.base;
const API = BASE + "/api";
const POLL_MS = 2000;
const state = { view: "pending", key: "", cursor: null, pageCursors: [] };

const $ = (sel) => document.querySelector(sel);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const short = (id) => (id ? String(id).slice(0, 8) : "—");
const num = (n) => Number(n ?? 0).toLocaleString("en-US");
const time = (t) => (t ? new Date(t).toLocaleTimeString() : "—");
const secs = (s) => {
  if (s == null) return "—";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 120) return `${s.toFixed(1)} s`;
  if (s < 7200) return `${(s / 60).toFixed(1)} min`;
  return `${(s / 3600).toFixed(1)} h`;
};

async function api(path, options = {}) {
  const res = await fetch(API + path, { credentials: "same-origin", ...options });
  if (res.status === 401) { location.href = BASE + "/login"; throw new Error("unauthorized"); }
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(body.error || res.statusText);
  return body;
}

// Actions are POSTs with the action header (see src/dashboard/auth.rs).
function act(path, payload) {
  return api(path, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-Outboxd-Action": "1" },
    body: JSON.stringify(payload),
  });
}

function renderKpis(s) {
  const t = s.totals;
  $("#kpi-workers").textContent = num(t.workers_live);
  $("#kpi-buckets").textContent = `${t.buckets_owned} / ${t.buckets}`;
  $("#kpi-pending").textContent = num(t.pending) + (t.pending_capped ? "+" : "");
  $("#kpi-lag").textContent = secs(t.max_lag_seconds);
  $("#kpi-rate").textContent = num(s.throughput.current_per_minute);
  $("#kpi-hour").textContent = num(s.throughput.published_last_hour);
  $("#kpi-parked").textContent = num(t.parked);
  $("#kpi-parked").classList.toggle("bad", t.parked > 0);
  $("#kpi-blocked").textContent = num(t.blocked_buckets);
  $("#kpi-blocked").classList.toggle("bad", t.blocked_buckets > 0);
}

function renderChart(minutes) {
  const svg = $("#chart");
  const w = 600, h = 120, pad = 4;
  const max = Math.max(1, ...minutes.map((m) => m.published + m.failed));
  const bw = w / minutes.length;
  let out = "";
  minutes.forEach((m, i) => {
    const ph = ((h - pad) * m.published) / max;
    const fh = ((h - pad) * m.failed) / max;
    const x = i * bw + 1;
    out += `<rect class="bar" x="${x}" y="${h - ph}" width="${bw - 2}" height="${ph}"><title>${time(m.minute)}: ${m.published} published, ${m.failed} failed</title></rect>`;
    if (fh > 0) out += `<rect class="fail" x="${x}" y="${h - ph - fh}" width="${bw - 2}" height="${fh}"></rect>`;
  });
  svg.innerHTML = out;
  $("#chart-max").textContent = num(max);
}

function renderWorkers(workers) {
  $("#workers tbody").innerHTML = workers.map((w) => `
    <tr class="${w.live ? "" : "gone"}" data-worker="${esc(w.worker_id)}">
      <td class="mono" title="${esc(w.worker_id)}">${short(w.worker_id)}</td>
      <td>${esc(w.hostname)}</td><td>${w.pid}</td><td>${esc(w.mode)}</td>
      <td class="state">${w.can_publish ? `<span class="badge ok">publishing</span>` : w.broker_error ? `<span class="badge blocked" title="${esc(w.broker_error)}">broker unreachable</span>` : `<span class="badge idle">starting</span>`}</td>
      <td>${time(w.started_at)}</td>
      <td>${w.live ? secs(w.heartbeat_ttl_seconds) : "gone"}</td>
      <td class="buckets">${w.buckets}</td>
      <td>${w.published_rate.toFixed(1)}/s</td><td>${num(w.published_total)}</td>
    </tr>`).join("") || `<tr><td colspan="10" class="muted">No workers.</td></tr>`;
}

function bucketStatus(p) {
  if (p.head_error) return `<span class="badge blocked" title="${esc(p.head_error)}">blocked</span> <span class="err">${esc(p.head_error)}</span>`;
  const owned = p.lease_owner && p.lease_ttl_seconds > 0;
  if (!owned && p.pending > 0) return `<span class="badge unowned">unowned</span>`;
  return p.pending > 0 ? `<span class="badge ok">draining</span>` : `<span class="badge idle">idle</span>`;
}

function renderPartitions(parts) {
  $("#partitions tbody").innerHTML = parts.map((p) => `
    <tr data-bucket="${esc(p.partition_key)}">
      <td class="mono">${esc(p.partition_key)}</td>
      <td class="mono" title="${esc(p.lease_owner)}">${short(p.lease_owner)}</td>
      <td>${p.lease_epoch}</td>
      <td>${p.lease_owner && p.lease_ttl_seconds > 0 ? secs(p.lease_ttl_seconds) : "—"}</td>
      <td class="pending">${num(p.pending)}${p.pending_capped ? "+" : ""}</td>
      <td>${p.head_id ? secs(p.lag_seconds) : "—"}</td>
      <td>${p.parked ? `${num(p.parked)} <button class="danger requeue-bucket" data-bucket="${esc(p.partition_key)}">Requeue all</button>` : "0"}</td>
      <td class="${p.head_error ? "err" : ""}">${bucketStatus(p)}</td>
    </tr>`).join("");
}

async function refresh() {
  try {
    const s = await api("/summary");
    renderKpis(s); renderChart(s.throughput.minutes); renderWorkers(s.workers); renderPartitions(s.partitions);
    $("#updated").textContent = "updated " + new Date().toLocaleTimeString();
    $("#updated").dataset.at = String(Date.now());
  } catch (e) {
    $("#updated").textContent = "update failed: " + e.message;
  }
}

function messageState(m) {
  if (m.published_at) return `<span class="badge ok">published ${time(m.published_at)}</span>`;
  if (m.failed_at) return `<span class="badge blocked">parked</span>`;
  return m.attempts > 0 ? `<span class="badge blocked">retrying</span>` : `<span class="badge idle">pending</span>`;
}

async function loadMessages() {
  const q = new URLSearchParams({ state: state.view, limit: "50" });
  if (state.key) q.set("key", state.key);
  if (state.cursor != null) q.set("cursor", String(state.cursor));
  const page = await api("/messages?" + q);
  $("#messages tbody").innerHTML = page.messages.map((m) => `
    <tr class="clickable" data-id="${m.id}">
      <td class="mono">${m.id}</td><td class="mono">${esc(m.partition_key)}</td><td>${esc(m.message_key)}</td>
      <td>${esc(m.exchange || "(default)")} → ${esc(m.routing_key)}</td><td>${time(m.created_at)}</td>
      <td>${m.attempts}</td><td>${messageState(m)}</td><td class="err">${esc(m.last_error || "")}</td>
      <td>${m.failed_at ? `<button class="danger requeue-one" data-id="${m.id}">Requeue</button>` : ""}</td>
    </tr>`).join("") || `<tr><td colspan="9" class="muted">No ${state.view} messages${state.key ? " for " + esc(state.key) : ""}.</td></tr>`;
  $("#next-page").disabled = page.next_cursor == null;
  $("#next-page").dataset.cursor = page.next_cursor ?? "";
}

async function showDetail(id) {
  const m = await api("/messages/" + id);
  $("#detail-title").textContent = `Message ${m.id}`;
  const fields = {
    "Message id": m.message_id, Bucket: m.partition_key, Key: m.message_key,
    Destination: `${m.exchange || "(default exchange)"} → ${m.routing_key}`, "Content type": m.content_type || "—",
    Created: m.created_at, Available: m.available_at, Published: m.published_at || "—", Parked: m.failed_at || "—",
    Attempts: m.attempts, "Last error": m.last_error || "—", Size: `${num(m.payload_bytes)} bytes`,
  };
  $("#detail-fields").innerHTML = Object.entries(fields).map(([k, v]) => `<dt>${esc(k)}</dt><dd>${esc(v)}</dd>`).join("");
  $("#detail-headers").textContent = JSON.stringify(m.headers, null, 2);
  const p = m.payload_preview;
  $("#detail-payload-info").textContent = `(${p.encoding}${p.truncated ? ", first 4 KiB" : ""})`;
  $("#detail-payload").textContent = p.text;
  $("#detail").showModal();
}

async function requeue(payload, what) {
  if (!confirm(`Requeue ${what}? It becomes the head of its bucket again and is published before the bucket's later pending messages.`)) return;
  try {
    const r = await act("/requeue", payload);
    alert(`Requeued ${r.requeued.length} message(s).`);
  } catch (e) {
    alert("Requeue failed: " + e.message);
  }
  await Promise.all([refresh(), loadMessages()]);
}

document.addEventListener("click", (ev) => {
  const t = ev.target;
  if (t.matches(".tabs button")) {
    document.querySelectorAll(".tabs button").forEach((b) => b.classList.toggle("active", b === t));
    state.view = t.dataset.state; state.cursor = null; loadMessages();
  } else if (t.matches(".requeue-one")) {
    ev.stopPropagation(); requeue({ ids: [Number(t.dataset.id)] }, `message ${t.dataset.id}`);
  } else if (t.matches(".requeue-bucket")) {
    requeue({ bucket: t.dataset.bucket }, `every parked message of bucket ${t.dataset.bucket}`);
  } else if (t.closest("#messages tr.clickable")) {
    showDetail(t.closest("tr").dataset.id).catch((e) => alert(e.message));
  }
});
$("#search").addEventListener("submit", (ev) => { ev.preventDefault(); state.key = $("#search-key").value.trim(); state.cursor = null; loadMessages(); });
$("#next-page").addEventListener("click", () => { state.cursor = Number($("#next-page").dataset.cursor); loadMessages(); });
$("#first-page").addEventListener("click", () => { state.cursor = null; loadMessages(); });
if (document.body.dataset.auth === "token") $("#logout").hidden = false;

refresh(); loadMessages();
setInterval(refresh, POLL_MS);
