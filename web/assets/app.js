// tailgate dashboard: reads the admin API with the operator's admin token.
// The token stays in this browser (localStorage); a "#token=…" fragment is
// accepted once and removed from the address bar.
"use strict";

const $ = (sel) => document.querySelector(sel);
let token = localStorage.getItem("tailgate.adminToken") || "";

const frag = new URLSearchParams(location.hash.slice(1));
if (frag.get("token")) {
  token = frag.get("token");
  localStorage.setItem("tailgate.adminToken", token);
  history.replaceState(null, "", location.pathname);
}

$("#login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = $("#token").value.trim();
  localStorage.setItem("tailgate.adminToken", token);
  refresh();
});

async function api(path) {
  const resp = await fetch(path, { headers: { Authorization: "Bearer " + token } });
  if (resp.status === 401) throw new Error("admin token rejected");
  if (!resp.ok) throw new Error(path + ": HTTP " + resp.status);
  return (await resp.json()).data;
}

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text === undefined || text === null ? "–" : String(text);
  if (cls) td.className = cls;
  return td;
}

function fill(table, rows, render) {
  const body = $(table + " tbody");
  body.replaceChildren(...rows.map((r) => {
    const tr = document.createElement("tr");
    tr.append(...render(r));
    return tr;
  }));
}

const ms = (v) => (v === null || v === undefined ? "–" : v < 10 ? v.toFixed(2) + " ms" : v.toFixed(0) + " ms");
const ago = (s) => (s === null || s === undefined ? "–" : s.toFixed(1) + " s ago");

function percentile(values, p) {
  if (!values.length) return null;
  const s = [...values].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)];
}

async function refresh() {
  if (!token) {
    $("#status").textContent = "paste the admin token to connect";
    return;
  }
  try {
    const [replicas, requests, usage] = await Promise.all([
      api("/admin/v1/replicas"), api("/admin/v1/requests?limit=50"), api("/admin/v1/usage"),
    ]);
    const ready = replicas.filter((r) => r.ready).length;
    $("#status").textContent = `${ready}/${replicas.length} replicas ready · updated ${new Date().toLocaleTimeString()}`;
    $("#status").className = ready ? "" : "err";
    fill("#replicas", replicas, (r) => [
      cell(r.id), cell(r.state, "state-" + r.state), cell(r.reason || ""), cell(r.engine || (r.static ? "static" : "")),
      cell((r.models || []).join(", ")), cell(r.inflight), cell(r.engine_waiting), cell(r.engine_running),
      cell(r.kv_cache_usage === undefined ? null : (100 * r.kv_cache_usage).toFixed(0) + " %"),
      cell(r.recent_ttft_ms ? ms(r.recent_ttft_ms) : null), cell(ago(r.last_ok_age_seconds)),
    ]);
    const ttfts = requests.map((r) => r.stages_ms.ttft).filter((v) => v !== null);
    $("#latency").textContent = ttfts.length
      ? `last ${ttfts.length} requests: TTFT p50 ${ms(percentile(ttfts, 50))}, p95 ${ms(percentile(ttfts, 95))}, p99 ${ms(percentile(ttfts, 99))}`
      : "no requests yet";
    fill("#requests", requests, (r) => [
      cell(new Date(r.time).toLocaleTimeString()), cell(r.tenant), cell(r.model), cell(r.replica),
      cell(r.status, r.status >= 400 ? "err" : ""), cell(r.outcome), cell(r.attempts),
      cell(r.prompt_tokens + r.completion_tokens), cell(ms(r.stages_ms.gateway)), cell(ms(r.stages_ms.upstream_ttft)),
      cell(ms(r.stages_ms.engine_ttft)), cell(ms(r.stages_ms.network)), cell(ms(r.stages_ms.ttft)), cell(ms(r.stages_ms.total)),
    ]);
    fill("#usage", usage, (u) => [
      cell(u.tenant), cell(u.key_prefix), cell(u.model), cell(u.requests), cell(u.prompt_tokens),
      cell(u.completion_tokens), cell(u.cost.toFixed(6)),
    ]);
  } catch (err) {
    $("#status").textContent = err.message;
    $("#status").className = "err";
  }
}

refresh();
setInterval(refresh, 2000);
