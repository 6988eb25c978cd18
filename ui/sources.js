// outboxd all-sources overview: polls api/sources and renders one row per
// source, healthy or why not. No framework, no CDN.
"use strict";

// The session's key (see app.js): taken from the login's redirect.
const SESSION_KEY = "outboxd-session-key";
if (location.hash.startsWith("#k=")) {
  localStorage.setItem(SESSION_KEY, location.hash.slice(3));
  history.replaceState(null, "", location.pathname + location.search);
}

const BASE = document.body.dataset.base;
const POLL_MS = 2000;
const $ = (sel) => document.querySelector(sel);
const esc = (s) => String(s ?? "")
  .replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const num = (n) => Number(n ?? 0).toLocaleString("en-US");
const secs = (s) => {
  if (s == null) return "—";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 120) return `${s.toFixed(1)} s`;
  if (s < 7200) return `${(s / 60).toFixed(1)} min`;
  return `${(s / 3600).toFixed(1)} h`;
};

function row(s) {
  const health = s.healthy
    ? '<span class="badge ok">healthy</span>'
    : '<span class="badge blocked">unhealthy</span>';
  // An unhealthy source's figures are unknown, not zero.
  const figure = (v) => (s.healthy ? v : "—");
  return `<tr data-source="${esc(s.name)}" class="${s.healthy ? "healthy" : "unhealthy"}">
    <td class="name"><a href="${esc(s.href)}">${esc(s.name)}</a></td>
    <td class="health">${health}</td>
    <td class="workers">${figure(num(s.workers_live))}</td>
    <td class="pending">${figure(num(s.pending) + (s.pending_capped ? "+" : ""))}</td>
    <td class="lag">${figure(secs(s.max_lag_seconds))}</td>
    <td class="blocked">${figure(num(s.blocked_buckets))}</td>
    <td class="parked">${figure(num(s.parked))}</td>
    <td class="rate">${figure(num(s.published_last_60s))}</td>
    <td class="err">${esc(s.error ?? "")}</td>
  </tr>`;
}

async function refresh() {
  try {
    const res = await fetch(BASE + "/api/sources", {
      credentials: "same-origin",
      headers: { "X-Outboxd-Session": localStorage.getItem(SESSION_KEY) || "" },
    });
    if (res.status === 401) { location.href = BASE + "/login"; return; }
    if (!res.ok) throw new Error(res.statusText);
    const sources = await res.json();
    $("#sources tbody").innerHTML = sources.map(row).join("");
    const healthy = sources.filter((s) => s.healthy);
    $("#kpi-sources").textContent = num(sources.length);
    $("#kpi-unhealthy").textContent = num(sources.length - healthy.length);
    $("#kpi-unhealthy").classList.toggle("bad", healthy.length < sources.length);
    $("#kpi-pending").textContent = num(healthy.reduce((n, s) => n + s.pending, 0));
    $("#kpi-blocked").textContent = num(healthy.reduce((n, s) => n + s.blocked_buckets, 0));
    $("#kpi-rate").textContent = num(healthy.reduce((n, s) => n + s.published_last_60s, 0));
    $("#updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    $("#updated").textContent = `cannot reach outboxd: ${e.message}`;
  }
}

if (document.body.dataset.auth === "token") $("#logout").hidden = false;
refresh();
setInterval(refresh, POLL_MS);
