// outboxd dashboard: polls the JSON API and renders it. No framework, no CDN.
"use strict";

const BASE = document.body.dataset.base;
const API = BASE + "/api";
const POLL_MS = 2000;
const state = { view: "pending", key: "", cursor: null, pageCursors: [] };

const $ = (sel) => document.querySelector(sel);
// Characters that change how text reads without being seen are shown as
// ⟨U+XXXX⟩, so a key like "rtl-\u202Egnp.exe" cannot pass for another name:
// controls, every Default_Ignorable_Code_Point (zero-width, bidirectional
// controls, variation selectors, tag characters, fillers…) and the line and
// paragraph separators.
const HIDDEN = /[\p{Cc}\p{Default_Ignorable_Code_Point}\u2028\u2029]/gu;
const mark = (c) => `⟨U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}⟩`;
// For multi-line text (headers, payloads): line breaks and tabs stay.
const visible = (s) => String(s ?? "").replace(HIDDEN, (c) => ("\t\n\r".includes(c) ? c : mark(c)));
// For one-line text and attributes, HTML-escaped.
const esc = (s) => String(s ?? "").replace(HIDDEN, mark)
  .replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const rate = (r) => `${Number(r ?? 0).toFixed(1)}/s`;
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

// The session's key: given once at login (in the URL's fragment, which no
// request carries) and kept in this origin's storage; every API request
// sends it beside the cookie, so a cookie captured elsewhere (a page on
// another port of the same host) reads nothing.
const SESSION_KEY = "outboxd-session-key";
if (location.hash.startsWith("#k=")) {
  localStorage.setItem(SESSION_KEY, location.hash.slice(3));
  history.replaceState(null, "", location.pathname + location.search);
}

async function api(path, options = {}) {
  const headers = { "X-Outboxd-Session": localStorage.getItem(SESSION_KEY) || "", ...(options.headers || {}) };
  const res = await fetch(API + path, { credentials: "same-origin", ...options, headers });
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
  $("#kpi-now").textContent = `${s.throughput.per_second_now.toFixed(1)}/s`;
  $("#kpi-rate").textContent = num(s.throughput.published_last_60s);
  $("#kpi-hour").textContent = num(s.throughput.published_last_hour);
  $("#kpi-parked").textContent = num(t.parked);
  $("#kpi-parked").classList.toggle("bad", t.parked > 0);
  $("#kpi-blocked").textContent = num(t.blocked_buckets);
  $("#kpi-blocked").classList.toggle("bad", t.blocked_buckets > 0);
}

// The axis top for a busiest slot of `max`: the next of 1, 2, 4, 6, 8 × 10ⁿ
// (at least 2), so that the top and its half are round numbers.
function niceTop(max) {
  const p = 10 ** Math.floor(Math.log10(Math.max(max, 1)));
  const m = [1, 2, 4, 6, 8, 10].find((k) => k * p >= max);
  return Math.max(2, m * p);
}

// Bars of published (and failed, red) per slot, scaled to a round top above
// the busiest slot.
function bars(svg, slots, label) {
  const w = 600, h = 120, pad = 4;
  const max = niceTop(Math.max(...slots.map((m) => m.published + m.failed), 0));
  const bw = w / slots.length;
  let out = "";
  slots.forEach((m, i) => {
    const ph = ((h - pad) * m.published) / max;
    const fh = ((h - pad) * m.failed) / max;
    const x = i * bw + (bw > 3 ? 1 : 0);
    const width = bw > 3 ? bw - 2 : bw;
    out += `<rect class="bar" x="${x}" y="${h - ph}" width="${width}" height="${ph}"><title>${label(m)}: ${m.published} published, ${m.failed} failed</title></rect>`;
    if (fh > 0) out += `<rect class="fail" x="${x}" y="${h - ph - fh}" width="${width}" height="${fh}"></rect>`;
  });
  svg.innerHTML = out;
  return max;
}

// The y-axis of a chart: its round top and middle, with units.
function yaxis(id, max, unit) {
  $(`#${id}-max`).textContent = `${num(max)}${unit}`;
  $(`#${id}-mid`).textContent = `${num(max / 2)}${unit}`;
}

function renderCharts(t) {
  yaxis("chart", bars($("#chart"), t.minutes, (m) => time(m.minute)), "/min");
  yaxis("live", bars($("#live"), t.seconds, (m) => time(m.second)), "/s");
}

// The lease timeline: one row per bucket over the last 5 minutes, each
// stretch coloured by the worker that held it, rebuilt from the lease
// events (fetched incrementally) and the current leases.
const WINDOW_S = 300;
const timeline = { events: [], lastId: 0, loaded: false };
// Live workers take hues in id order, spread by the golden angle over
// 25°–325° (no red: red marks take-overs and errors), so no two live workers
// share one; a gone worker keeps a pale grey-blue of its own id.
const palette = { live: new Map() };
function assignColours(workers) {
  const ids = workers.filter((w) => w.live).map((w) => w.worker_id).sort();
  palette.live = new Map(ids.map((id, i) => [id, `hsl(${(25 + ((i * 0.6180339887) % 1) * 300).toFixed(1)} 62% 48%)`]));
}
// Each worker by its name (`worker.name`, or host:pid), remembered after it
// is gone so the timeline still names it; its id's prefix if never seen.
const names = new Map();
function learnNames(workers) { for (const w of workers) names.set(w.worker_id, w.name); }
const nameOf = (id) => names.get(id) || short(id);
const colour = (id) => palette.live.get(id) ||
  `hsl(${210 + (parseInt(String(id).replace(/-/g, "").slice(0, 6), 16) % 40)} 12% 70%)`;

async function loadEvents() {
  const q = timeline.loaded ? `after=${timeline.lastId}` : `since_seconds=${WINDOW_S}`;
  const fresh = await api("/lease-events?" + q);
  timeline.loaded = true;
  for (const e of fresh) { timeline.events.push(e); timeline.lastId = Math.max(timeline.lastId, e.id); }
}

function renderTimeline(s) {
  assignColours(s.workers);
  const now = Date.parse(s.now), start = now - WINDOW_S * 1000;
  timeline.events = timeline.events.filter((e) => Date.parse(e.at) >= start);
  const buckets = s.partitions.map((p) => p.partition_key);
  const rowH = 14, w = 600, h = buckets.length * rowH;
  const x = (t) => ((Math.max(t, start) - start) / (WINDOW_S * 1000)) * w;
  const svg = $("#timeline");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.style.height = `${h}px`;
  const owners = new Set();
  let out = "";
  buckets.forEach((b, row) => {
    const p = s.partitions[row];
    const y = row * rowH;
    // Backwards from now: whoever holds it now, then before each event.
    let owner = p.lease_owner && p.lease_ttl_seconds > 0 ? p.lease_owner : null;
    let end = now;
    const evs = timeline.events.filter((e) => e.partition_key === b);
    const stretch = (from, to, who) => {
      if (!who || to <= from) return;
      owners.add(who);
      out += `<rect class="held" data-bucket="${esc(b)}" data-owner="${esc(who)}" x="${x(from)}" y="${y + 2}" width="${Math.max(0.5, x(to) - x(from))}" height="${rowH - 4}" fill="${colour(who)}"><title>${esc(b)}: ${esc(nameOf(who))}</title></rect>`;
    };
    for (let i = evs.length - 1; i >= 0; i--) {
      const e = evs[i], at = Date.parse(e.at);
      stretch(at, end, owner);
      owner = e.action === "acquire" ? e.old_owner : e.worker_id;
      end = at;
    }
    stretch(start, end, owner);
    for (const e of evs) {
      const takeover = e.action === "acquire" && e.old_owner && e.old_owner !== e.worker_id;
      const cls = e.action === "release" ? "release" : takeover ? "acquire takeover" : "acquire";
      out += `<rect class="ev ${cls}" data-action="${e.action}" data-bucket="${esc(b)}" data-worker="${esc(e.worker_id)}" data-at="${Date.parse(e.at)}" x="${x(Date.parse(e.at)) - 1}" y="${y}" width="2" height="${rowH}"><title>${time(e.at)} ${esc(b)} ${e.action} by ${esc(nameOf(e.worker_id))} (epoch ${e.new_epoch}): ${esc(e.reason)}</title></rect>`;
    }
  });
  svg.innerHTML = out;
  $("#tl-labels").innerHTML = buckets.map((b) => `<div>${esc(b)}</div>`).join("");
  const live = new Set(s.workers.filter((w) => w.live).map((w) => w.worker_id));
  $("#tl-legend").innerHTML = [...new Set([...live, ...owners])].map((id) =>
    `<span class="${live.has(id) ? "" : "gone"}" data-worker="${esc(id)}"><span class="swatch" data-colour="${esc(colour(id))}"></span><span class="mono" title="${esc(id)}">${esc(nameOf(id))}</span></span>`).join("");
  // Colours through the CSSOM: the content security policy refuses style attributes.
  for (const el of document.querySelectorAll("#tl-legend .swatch")) el.style.background = el.dataset.colour;
}

// The server's words for a worker's and a bucket's state (the same as the
// API's `state`, `outboxd status` and the metrics); here only their colour
// and what a title or a suffix adds.
const BADGE = {
  "publishing": "ok", "waiting": "ok", "blocked": "blocked", "blocked head": "blocked",
  "broker unreachable": "blocked", "broker alarm": "blocked", "unowned": "unowned",
};
const badge = (state, title, suffix = "") =>
  `<span class="badge ${BADGE[state] || "idle"}"${title ? ` title="${esc(title)}"` : ""}>${esc(state)}${esc(suffix)}</span>`;

function workerState(w, parts) {
  const title = w.state === "broker unreachable" ? w.broker_error : w.state === "broker alarm" ? w.broker_blocked : "";
  if (w.state === "blocked head") {
    const mine = parts.filter((p) => (w.mode === "no-leasing" || p.lease_owner === w.worker_id) && p.head_error);
    const retries = mine.map((p) => p.head_retry_at).filter(Boolean).sort();
    return badge(w.state, mine[0]?.head_error, retries.length ? ` · retry ${time(retries[0])}` : "");
  }
  return badge(w.state, title);
}

function renderWorkers(workers, parts) {
  $("#workers tbody").innerHTML = workers.map((w) => `
    <tr class="${w.live ? "" : "gone"}" data-worker="${esc(w.worker_id)}">
      <td class="mono name" title="${esc(w.hostname)} pid ${w.pid}">${esc(w.name)}</td>
      <td class="mono" title="${esc(w.worker_id)}">${short(w.worker_id)}</td><td>${esc(w.mode)}</td>
      <td class="state">${workerState(w, parts)}</td>
      <td>${time(w.started_at)}</td>
      <td>${w.live ? secs(w.heartbeat_ttl_seconds) : "gone"}</td>
      <td class="buckets">${w.buckets}</td>
      <td class="rate">${w.published_rate.toFixed(1)}/s</td><td>${num(w.published_total)}</td>
    </tr>`).join("") || `<tr><td colspan="9" class="muted">No workers.</td></tr>`;
}

// Streams take rows through the stream protocol, once each (the broker
// keeps each bucket's last id); queues and exchanges through AMQP confirms.
function renderDestinations(dests) {
  const sink = (d) => d.sink === "stream"
    ? `<span class="badge ok" title="stream protocol, de-duplicated by the broker: effectively once">stream</span>`
    : `<span class="badge idle" title="AMQP 0-9-1 with publisher confirms: at least once">AMQP ${esc(d.kind)}</span>`;
  const streamOnly = (d, n) => (d.sink === "stream" ? num(n) : "—");
  $("#destinations tbody").innerHTML = dests.map((d) => `
    <tr data-destination="${esc(d.kind)}:${esc(d.name)}">
      <td class="mono name">${esc(d.name) || `<span class="muted">(default exchange)</span>`}</td>
      <td class="sink">${sink(d)}</td>
      <td class="rate">${rate(d.rate)}</td><td class="delivered">${num(d.delivered)}</td>
      <td>${streamOnly(d, d.already_stored)}</td><td>${streamOnly(d, d.late)}</td>
      <td>${d.workers}</td>
    </tr>`).join("") || `<tr><td colspan="7" class="muted">Nothing delivered by a live worker yet.</td></tr>`;
}

// A blocked head's ways out, as `outboxd failed retry|park|drop`.
function headActions(p) {
  if (!p.head_id) return "";
  return ` <span class="head-actions" data-id="${p.head_id}">` +
    `<button class="head-act" data-action="retry">Retry now</button> ` +
    `<button class="danger head-act" data-action="park">Park</button> ` +
    `<button class="danger head-act" data-action="drop">Drop</button></span>`;
}

function bucketStatus(p) {
  if (p.head_error) return `${badge(p.state, p.head_error)} <span class="err">${esc(p.head_error)}</span>${headActions(p)}`;
  if (p.state === "publishing") return badge(p.state, "", ` ${rate(p.rate)}`);
  return badge(p.state);
}

function renderPartitions(parts) {
  $("#partitions tbody").innerHTML = parts.map((p) => `
    <tr data-bucket="${esc(p.partition_key)}">
      <td class="mono">${esc(p.partition_key)}</td>
      <td class="mono" title="${esc(p.lease_owner)}">${esc(nameOf(p.lease_owner))}</td>
      <td>${p.lease_epoch}</td>
      <td>${p.lease_owner && p.lease_ttl_seconds > 0 ? secs(p.lease_ttl_seconds) : "—"}</td>
      <td class="pending">${num(p.pending)}${p.pending_capped ? "+" : ""}</td>
      <td>${p.head_id ? secs(p.lag_seconds) : "—"}</td>
      <td>${p.parked ? `${num(p.parked)} <button class="danger requeue-bucket" data-bucket="${esc(p.partition_key)}">Requeue all</button>` : "0"}</td>
      <td class="status ${p.head_error ? "err" : ""}">${bucketStatus(p)}</td>
    </tr>`).join("");
}

async function refresh() {
  try {
    // The figures as soon as the summary is in; the timeline once its
    // events are too.
    const events = loadEvents();
    const s = await api("/summary");
    learnNames(s.workers);
    renderKpis(s); renderCharts(s.throughput); renderWorkers(s.workers, s.partitions);
    renderDestinations(s.destinations || []); renderPartitions(s.partitions);
    await events;
    renderTimeline(s);
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

// Each load of the message table is numbered; only the latest may render, so
// a slow answer (a long search) never overwrites the view chosen after it.
let messagesLoad = 0;
// What the table shows now (rewritten only when it changes).
let messagesHtml = "";
// The table refreshes with the page (same tab, search and page): not while
// a load is still out, not after one that failed (a stopped search is not
// run again by itself), and not a search of the Published view by key,
// which may read the whole table.
const messagesPoll = { busy: false, failed: false };
function refreshMessages() {
  if (messagesPoll.busy || messagesPoll.failed || (state.view === "published" && state.key)) return;
  loadMessages();
}

async function loadMessages() {
  const load = ++messagesLoad;
  messagesPoll.busy = true;
  try {
    messagesPoll.failed = !(await loadPage(load));
  } finally {
    if (load === messagesLoad) messagesPoll.busy = false;
  }
}

// One page of the message table; false if the load failed.
async function loadPage(load) {
  const q = new URLSearchParams({ state: state.view, limit: "50" });
  if (state.key) q.set("key", state.key);
  if (state.cursor != null) q.set("cursor", String(state.cursor));
  let page;
  try {
    page = await api("/messages?" + q);
  } catch (e) {
    if (load !== messagesLoad) return true;
    // A search the database stopped (or a database gone) says why in place of the rows.
    messagesHtml = `<tr><td colspan="9" class="err">${esc(e.message)}</td></tr>`;
    $("#messages tbody").innerHTML = messagesHtml;
    $("#next-page").disabled = true;
    return false;
  }
  if (load !== messagesLoad) return true;
  const rows = page.messages.map((m) => `
    <tr class="clickable" data-id="${m.id}">
      <td class="mono">${m.id}</td><td class="mono">${esc(m.partition_key)}</td><td>${esc(m.message_key)}</td>
      <td>${esc(m.exchange || "(default)")} → ${esc(m.routing_key)}</td><td>${time(m.created_at)}</td>
      <td>${m.attempts}</td><td>${messageState(m)}</td><td class="err">${esc(m.last_error || "")}</td>
      <td>${m.failed_at ? `<button class="danger requeue-one" data-id="${m.id}">Requeue</button>` : ""}</td>
    </tr>`).join("") || `<tr><td colspan="9" class="muted">${noMessages(page)}</td></tr>`;
  // Rewritten only when it changed: a refresh leaves rows (and the button
  // under the pointer) alone.
  if (messagesHtml !== rows) { $("#messages tbody").innerHTML = rows; messagesHtml = rows; }
  $("#next-page").disabled = page.next_cursor == null;
  $("#next-page").dataset.cursor = page.next_cursor ?? "";
  return true;
}

// What an empty page says: a deployment that deletes published rows has
// no Published history to show.
function noMessages(page) {
  if (state.view === "published" && !page.keep_published) {
    return "Published messages are deleted as they are published (outbox.keep_published = false); the charts above count them.";
  }
  return `No ${state.view} messages${state.key ? " for " + esc(state.key) : ""}.`;
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
  $("#detail-headers").textContent = visible(JSON.stringify(m.headers, null, 2));
  const p = m.payload_preview;
  $("#detail-payload-info").textContent = `(${p.encoding}${p.truncated ? ", first 4 KiB" : ""})`;
  $("#detail-payload").textContent = visible(p.text);
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

const HEAD_ACTIONS = {
  retry: (id) => `Retry message ${id} now? It is sent again at once instead of at its retry time.`,
  park: (id) => `Park message ${id}? The rest of its bucket goes on without it (later messages of its key overtake it); it waits in Failed for a requeue or a drop.`,
  drop: (id) => `Drop message ${id} for good? It will never be published. This is recorded in the audit table.`,
};

async function actOnHead(id, action) {
  if (!confirm(HEAD_ACTIONS[action](id))) return;
  try {
    await act("/head", { id, action });
  } catch (e) {
    alert(`${action} failed: ` + e.message);
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
  } else if (t.matches(".head-act")) {
    actOnHead(Number(t.closest(".head-actions").dataset.id), t.dataset.action);
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
setInterval(() => { refresh(); refreshMessages(); }, POLL_MS);
