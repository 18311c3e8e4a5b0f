// tailgate dashboard: reads and drives the admin API with the operator's
// admin token. The token stays in this tab (sessionStorage); a "#token=…"
// fragment — which browsers never send to the server — is read once and
// removed from the address bar.
import { barChart, lineChart } from "./charts.js";

const $ = (sel) => document.querySelector(sel);
const TOKEN = "tailgate.adminToken";
let token = sessionStorage.getItem(TOKEN) || "";

const frag = new URLSearchParams(location.hash.slice(1));
if (frag.get("token")) {
  token = frag.get("token");
  sessionStorage.setItem(TOKEN, token);
  history.replaceState(null, "", location.pathname + location.search);
}

$("#login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = $("#token").value.trim();
  $("#token").value = "";
  sessionStorage.setItem(TOKEN, token);
  showApp();
  refresh();
});

$("#signout").addEventListener("click", () => signIn(""));

// signIn shows the sign-in screen instead of the dashboard, saying why
// (a rejected token), and forgets the token.
function signIn(why) {
  token = "";
  sessionStorage.removeItem(TOKEN);
  $("#app").hidden = true;
  $("#outage").hidden = true;
  $("#signout").hidden = true;
  $("#signin").hidden = false;
  $("#signin-why").textContent = why;
  $("#status").textContent = "not signed in";
  $("#status").className = "muted";
  $("#token").focus();
}

function showApp() {
  $("#signin").hidden = true;
  $("#app").hidden = false;
  $("#signout").hidden = false;
}

class APIError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// api calls the admin API; the error names what the server said.
async function api(path, opts = {}) {
  const init = { method: opts.method || "GET", headers: { Authorization: "Bearer " + token } };
  if (opts.body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(opts.body);
  }
  const resp = await fetch(path, init);
  if (resp.status === 401) throw new APIError(401, "admin token rejected");
  const body = await resp.json().catch(() => null);
  if (!resp.ok) throw new APIError(resp.status, (body && body.error && body.error.message) || `${path}: HTTP ${resp.status}`);
  return body;
}

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text === undefined || text === null || text === "" ? "–" : String(text);
  if (cls) td.className = cls;
  return td;
}

function button(label, onclick, cls) {
  const td = document.createElement("td");
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  if (cls) b.className = cls;
  b.addEventListener("click", onclick);
  td.append(b);
  return td;
}

function fill(table, rows, render, empty) {
  const body = $(table + " tbody");
  if (!rows.length && empty) {
    const tr = document.createElement("tr");
    const td = cell(empty, "muted");
    td.colSpan = $(table + " thead tr").children.length;
    tr.append(td);
    body.replaceChildren(tr);
    return;
  }
  body.replaceChildren(...rows.map((r) => {
    const tr = document.createElement("tr");
    const out = render(r, tr);
    tr.append(...out);
    return tr;
  }));
}

const ms = (v) => (v === null || v === undefined ? "–" : v < 10 ? v.toFixed(2) + " ms" : v.toFixed(0) + " ms");
const ago = (s) => (s === null || s === undefined ? "–" : s.toFixed(1) + " s ago");
const pct = (v) => (v === null || v === undefined ? "–" : (100 * v).toFixed(1) + " %");
const num = (v, d = 2) => (v === null || v === undefined ? "–" : Number(v).toFixed(d));

function percentile(values, p) {
  if (!values.length) return null;
  const s = [...values].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)];
}

// ---- budgets ----

// renderBudgets shows /admin/v1/slo; a gateway without it says so.
async function renderBudgets(requests) {
  // From the request log: streams' TTFT and JSON answers' whole-answer time
  // apart — a JSON answer's first byte is its last, which is no TTFT.
  const streams = requests.filter((r) => r.stream).map((r) => r.stages_ms.ttft).filter((v) => v !== null);
  const json = requests.filter((r) => !r.stream).map((r) => r.stages_ms.total).filter((v) => v !== null);
  const line = (label, vs) => `${label} (${vs.length}): p50 ${ms(percentile(vs, 50))}, p95 ${ms(percentile(vs, 95))}, p99 ${ms(percentile(vs, 99))}`;
  const parts = [];
  if (streams.length) parts.push(line("streams TTFT p50/p95/p99 over the last requests", streams));
  if (json.length) parts.push(line("JSON answers, whole answer", json));
  $("#latency").textContent = parts.length ? parts.join(" · ") : "no requests yet";

  let slo;
  try {
    slo = (await api("/admin/v1/slo")).data || [];
  } catch (err) {
    if (err.status === 404) {
      $("#budget-status").textContent = "no SLO data: this gateway has no latency budgets configured";
      $("#budget-status").className = "muted";
      $("#budget-panel").classList.remove("over");
      fill("#budget", [], () => []);
      return null;
    }
    throw err;
  }
  const over = slo.filter((r) => r.ok === false);
  $("#budget-panel").classList.toggle("over", over.length > 0);
  $("#budget-status").className = over.length ? "err" : "ok";
  $("#budget-status").textContent = !slo.length ? "no SLO data yet (no requests evaluated)"
    : over.length ? `${over.length} stage(s) over budget: ` + over.map((r) => `${r.model} ${r.stage} (${r.kind})`).join(", ")
      : `all ${slo.length} stage budgets met`;
  const burn = (r, w) => (r.burn && r.burn[w] !== undefined ? num(r.burn[w]) : "–");
  fill("#budget", slo, (r, tr) => {
    if (r.ok === false) tr.className = "over";
    return [
      cell(r.model), cell(r.source || "all"), cell(r.kind), cell(r.stage),
      cell(ms(r.p50_ms)), cell(ms(r.p95_ms)), cell(ms(r.p99_ms)),
      cell(`${ms(r.budget_ms)} at ${r.target !== undefined ? (100 * r.target).toFixed(1) + " %" : "–"}`),
      cell(pct(r.within_ratio)), cell(burn(r, "5m")), cell(burn(r, "1h")),
      cell(r.ok === false ? "OVER" : "ok", r.ok === false ? "err" : "state-ready"),
    ];
  });
  return slo;
}

// ---- last hour ----

let lastHistory = null;

// renderKPIs fills the first line: the last minute from the history, the
// replicas and the SLO state. An outage (a served model with no ready
// replica) turns the line red.
function renderKPIs(h, replicas, slo) {
  const w = h.window || {};
  const set = (id, text, state, title) => {
    const k = $(id);
    k.querySelector(".value").textContent = text;
    k.className = "kpi" + (state ? " " + state : "");
    k.title = title || "";
  };
  const rate = (v) => (v === null || v === undefined ? "–" : v < 10 ? v.toFixed(2) : v.toFixed(1));
  const errs = w.errors || {};
  set("#kpi-rps", rate(w.requests_per_s), "", `${w.requests || 0} requests in the last ${Math.round(w.window_seconds || 0)} s`);
  set("#kpi-errors", pct(w.error_ratio), w.error_ratio > 0.05 ? "bad" : w.error_ratio > 0 ? "warn" : "",
    Object.keys(errs).length ? Object.entries(errs).map(([k, v]) => `${k}: ${v}`).join(", ") : "no errors");
  set("#kpi-ttft", ms(w.ttft_p95_ms), "", "interpolated in the TTFT histogram's buckets");
  set("#kpi-tokens", rate(w.output_tokens_per_s), "", `${rate(w.tokens_per_s)} tokens/s prompt and output`);
  set("#kpi-spend", h.spend_today === null || h.spend_today === undefined ? "—" : "$" + h.spend_today.toFixed(2), "",
    h.spend_today === null ? "no model has a price" : "since 00:00 UTC, from the ledger");
  const ready = replicas.filter((r) => r.ready).length;
  set("#kpi-replicas", `${ready}/${replicas.length}`, ready === 0 ? "bad" : ready < replicas.length ? "warn" : "ok");
  const down = outageModels(replicas);
  const over = (slo || []).filter((r) => r.ok === false);
  if (down.length) set("#kpi-slo", "outage", "bad", "no ready replica for " + down.join(", "));
  else if (over.length) set("#kpi-slo", "over budget", "bad", over.map((r) => `${r.model} ${r.stage} (${r.kind})`).join(", "));
  else if (slo && slo.length) set("#kpi-slo", "ok", "ok", `all ${slo.length} stage budgets met`);
  else set("#kpi-slo", slo ? "no data yet" : "no budgets", "");
  $("#kpis").classList.toggle("red", down.length > 0);
}

function renderHistory(h) {
  lastHistory = h;
  const pts = h.data || [];
  const charts = $("#charts");
  if (!pts.length) {
    $("#series-status").textContent = `collecting: one point every ${h.interval_seconds} s`;
    charts.replaceChildren();
    return;
  }
  const rebuilt = pts.filter((p) => p.from_ledger);
  $("#series-status").textContent = `${pts.length} points, one every ${h.interval_seconds} s` + (rebuilt.length
    ? `; until ${new Date(rebuilt[rebuilt.length - 1].time).toLocaleTimeString()} rebuilt from the ledger at the gateway's start (no replica load)`
    : "");
  const times = pts.map((p) => new Date(p.time));
  const per = (p, v) => (p.seconds > 0 ? v / p.seconds : 0);
  const classes = [...new Set(pts.flatMap((p) => Object.keys(p.errors || {})))].sort();
  const ttftChart = (title, answer) => lineChart(title, times, ["p50", "p95", "p99"].map((q) => ({
    name: q, values: pts.map((p) => (p.ttft_ms && p.ttft_ms[answer] ? p.ttft_ms[answer][q] : null)),
  })), " ms");
  const replicas = [...new Set(pts.flatMap((p) => Object.keys(p.replicas || {})))].sort();
  const tenants = [...new Set(pts.flatMap((p) => Object.keys(p.tenant_spent || {})))].sort();
  const figs = [
    lineChart("request rate and errors (per second)", times, [
      { name: "requests", values: pts.map((p) => per(p, p.requests)) },
      ...classes.map((c) => ({ name: c, values: pts.map((p) => per(p, (p.errors || {})[c] || 0)) })),
    ], "/s"),
    // Streams and JSON answers apart: a JSON answer's first byte is its
    // last, and mixed in it would pass for a slow stream.
    ttftChart("time to first token, streams", "stream"),
    ttftChart("JSON answers, whole answer", "json"),
    lineChart("hedges and their overhead", times, [
      { name: "hedges won", values: pts.map((p) => p.hedges_won) },
      { name: "hedges lost", values: pts.map((p) => p.hedges_lost) },
      { name: "overhead tokens", values: pts.map((p) => p.hedge_overhead_tokens) },
    ]),
    lineChart("in flight per replica", times, replicas.map((r) => ({ name: r, values: pts.map((p) => (p.replicas[r] ? p.replicas[r].inflight : null)) }))),
    lineChart("engine queue per replica", times, replicas.map((r) => ({ name: r, values: pts.map((p) => (p.replicas[r] ? p.replicas[r].engine_waiting : null)) }))),
    lineChart("KV cache use per replica", times, replicas.map((r) => ({ name: r, values: pts.map((p) => (p.replicas[r] ? 100 * p.replicas[r].kv_cache_usage : null)) })), " %"),
    lineChart("spend per tenant ($, cumulative)", times, tenants.map((t) => ({ name: t, values: pts.map((p) => (p.tenant_spent || {})[t] ?? null) }))),
  ];
  charts.replaceChildren(...figs);
}

// ---- replicas ----

let openReplica = "";

function ejectionsOf(r) {
  // The gateway counts each replica's ejections (every reason of
  // tailgate_ejections_total); an older gateway only has the transitions
  // into "ejected".
  if (typeof r.ejections === "number") return r.ejections;
  const t = (lastHistory && lastHistory.transitions && lastHistory.transitions[r.id]) || [];
  return t.filter((x) => x.to === "ejected").length;
}

// whyOut is the table's reason cell: the state's reason, and for a replica
// that is back, why it last went away.
function whyOut(r) {
  const why = r.reason || "";
  const l = r.last_loss;
  if (!l || r.state === "lost") return why;
  const last = `last lost ${new Date(l.at).toLocaleTimeString()}: ${l.reason}`;
  return why ? why + " · " + last : last;
}

function renderReplicas(replicas) {
  const ready = replicas.filter((r) => r.ready).length;
  $("#status").textContent = `${ready}/${replicas.length} replicas ready · updated ${new Date().toLocaleTimeString()}`;
  $("#status").className = ready ? "" : "err";
  fill("#replicas", replicas, (r, tr) => {
    tr.className = "clickable";
    tr.addEventListener("click", () => { openReplica = openReplica === r.id ? "" : r.id; renderReplicaDetail(replicas); });
    return [
      cell(r.id), cell(r.state, "state-" + r.state), cell(whyOut(r), "wrap"), cell(r.engine || (r.static ? "static" : "")),
      cell((r.models || []).join(", "), "wrap"), cell(r.inflight), cell(r.engine_waiting), cell(r.engine_running),
      cell(r.kv_cache_usage === undefined ? null : (100 * r.kv_cache_usage).toFixed(0) + " %"),
      cell(r.ttft_estimate_ms ? ms(r.ttft_estimate_ms) : null), cell(ago(r.last_ok_age_seconds)), cell(ejectionsOf(r)),
    ];
  });
  renderReplicaDetail(replicas);
  renderOutage(replicas);
}

// renderFleet shows /admin/v1/fleet: the fleet controller's models and its
// last actions (a failing provider as failed starts and the next try).
function renderFleet(f) {
  const models = (f && f.models) || [];
  $("#fleet-panel").hidden = !models.length;
  if (!models.length) return;
  $("#fleet-provider").textContent = f.provider ? "provider: " + f.provider : "";
  fill("#fleet", models, (m) => [
    cell(m.model), cell(m.min), cell(m.max), cell(m.desired), cell(m.current), cell(m.ready), cell(m.draining),
    cell(m.waiting), cell(m.failures, m.failures ? "state-failed" : ""),
    cell(m.next_retry ? new Date(m.next_retry).toLocaleTimeString() : null),
  ]);
  fill("#fleet-actions", (f.actions || []).slice(0, 20), (a) => [
    cell(new Date(a.time).toLocaleTimeString()), cell(a.model), cell(a.kind), cell(a.replica), cell(a.reason, "wrap"),
    cell(a.outcome, a.outcome === "ok" ? "state-ready" : "state-failed"), cell(a.error, "wrap"),
  ], "no action yet");
}

// renderOutage shows, above everything, each model that replicas serve but
// none is ready to: every request for it is answered 503. A lost replica
// (its worker stopped sending heartbeats) stays listed, saying why.
function outageModels(replicas) {
  const models = [...new Set(replicas.flatMap((r) => r.models || []))].sort();
  return models.filter((m) => !replicas.some((r) => r.ready && (r.models || []).includes(m)));
}

function renderOutage(replicas) {
  const down = outageModels(replicas);
  const box = $("#outage");
  box.hidden = down.length === 0;
  box.replaceChildren();
  if (!down.length) return;
  box.append(`Outage: no ready replica for ${down.join(", ")} — requests for ${down.length > 1 ? "them" : "it"} are answered 503.`);
  const ul = document.createElement("ul");
  for (const r of replicas.filter((x) => (x.models || []).some((m) => down.includes(m)))) {
    const li = document.createElement("li");
    li.textContent = `${r.id}: ${r.state}${r.reason ? " — " + r.reason : ""}`;
    ul.append(li);
  }
  box.append(ul);
}

function renderReplicaDetail(replicas) {
  const box = $("#replica-detail");
  const r = replicas.find((x) => x.id === openReplica);
  if (!r) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  const h = document.createElement("h3");
  h.textContent = `replica ${r.id} — ${r.address}`;
  const probe = document.createElement("p");
  probe.textContent = `last successful probe/heartbeat: ${ago(r.last_ok_age_seconds)}; now ${r.state}${r.reason ? " (" + r.reason + ")" : ""}`;
  const trans = document.createElement("table");
  trans.className = "transitions";
  trans.innerHTML = "<thead><tr><th>when</th><th>from</th><th>to</th><th>reason</th></tr></thead><tbody></tbody>";
  const ts = ((lastHistory && lastHistory.transitions && lastHistory.transitions[r.id]) || []).slice().reverse();
  trans.tBodies[0].append(...ts.map((t) => {
    const tr = document.createElement("tr");
    tr.append(cell(new Date(t.time).toLocaleTimeString()), cell(t.from || "(first seen)"), cell(t.to, "state-" + t.to), cell(t.reason, "wrap"));
    return tr;
  }));
  const log = document.createElement("pre");
  log.className = "engine-log";
  log.textContent = r.engine_log && r.engine_log.length ? r.engine_log.join("\n") : "(the engine reported no error)";
  const lh = document.createElement("h4");
  lh.textContent = "engine's last error";
  const th = document.createElement("h4");
  th.textContent = "state history";
  box.replaceChildren(h, probe, th, trans, lh, log);
}

// ---- requests ----

let openRequest = "";

function filterQuery() {
  const q = new URLSearchParams({ limit: "100" });
  for (const [k, v] of new FormData($("#filters"))) if (String(v).trim()) q.set(k, String(v).trim());
  return q.toString();
}

$("#filters").addEventListener("submit", (ev) => { ev.preventDefault(); refresh(); });
$("#filters").addEventListener("reset", () => setTimeout(refresh, 0));

function renderRequests(requests, inflight) {
  $("#inflight-count").textContent = `(${inflight.length})`;
  fill("#inflight", inflight, (r) => [
    cell(r.id), cell(r.tenant), cell(r.key_prefix), cell(r.endpoint), cell(ms(r.age_ms)),
  ], "nothing in flight");
  fill("#requests", requests, (r, tr) => {
    tr.className = "clickable" + (r.id === openRequest ? " open" : "");
    tr.dataset.id = r.id;
    tr.addEventListener("click", () => { openRequest = openRequest === r.id ? "" : r.id; renderRequestDetail(requests); });
    return [
      cell(new Date(r.time).toLocaleTimeString()), cell(r.id), cell(r.tenant), cell(r.model), cell(r.stream ? "stream" : "JSON"),
      cell(r.replica), cell(r.status, r.status >= 400 ? "err" : ""), cell(r.outcome), cell(r.attempts + (r.hedged ? " (hedged)" : "")),
      cell(r.prompt_tokens + r.completion_tokens), cell(r.stream ? ms(r.stages_ms.ttft) : "–"), cell(ms(r.stages_ms.total)),
    ];
  }, "no request matches");
  renderRequestDetail(requests);
}

// keyNames maps a key id to how the keys table shows the key, for the
// request detail (a request row carries the key's id only).
let keyNames = new Map();

function keyLabel(id) {
  const k = keyNames.get(id);
  if (!k) return id || "none";
  return k.name ? `${k.name} (${k.prefix})` : k.prefix;
}

const STAGES = ["gateway", "connect", "upstream_ttft", "engine_queue", "engine_ttft", "network", "ttft", "total"];

// renderRequestDetail shows the open request in the side panel beside the
// list (it stays in view while the list scrolls).
function renderRequestDetail(requests) {
  const box = $("#request-detail");
  for (const tr of document.querySelectorAll("#requests tbody tr")) tr.classList.toggle("open", tr.dataset.id === openRequest);
  const r = requests.find((x) => x.id === openRequest);
  box.parentElement.classList.toggle("open", !!r);
  if (!r) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  const close = document.createElement("button");
  close.type = "button";
  close.className = "close";
  close.textContent = "Close";
  close.addEventListener("click", () => { openRequest = ""; renderRequestDetail(requests); });
  const h = document.createElement("h3");
  h.textContent = `request ${r.id}`;
  const when = document.createElement("p");
  when.className = "when";
  when.textContent = `${new Date(r.time).toLocaleString()} · key ${keyLabel(r.key_id)}`;
  const facts = document.createElement("p");
  facts.textContent = `${r.stream ? "stream" : "JSON answer"} · tenant ${r.tenant} · model ${r.model} · status ${r.status} (${r.outcome})` +
    (r.error ? ` · error: ${r.error}` : "") + ` · tokens ${r.prompt_tokens} in, ${r.completion_tokens} out` +
    (r.hedge_overhead_tokens ? `, ${r.hedge_overhead_tokens} burned by a losing hedge` : "");
  const att = document.createElement("p");
  att.textContent = `attempts: ${r.attempts}${r.hedged ? ", hedged" : ""}; answered by ${r.replica || "no replica"}.`;
  // Every attempt, not only the winner: times are after the request arrived.
  const at = document.createElement("table");
  at.className = "attempts";
  at.innerHTML = "<thead><tr><th>#</th><th>replica</th><th>role</th><th>outcome</th><th>start</th>" +
    "<th>first token</th><th>end</th><th>tokens in/out</th><th>reason</th></tr></thead><tbody></tbody>";
  at.tBodies[0].append(...(r.attempt_log || []).map((a) => {
    const tr = document.createElement("tr");
    tr.className = "attempt-" + a.outcome;
    tr.append(cell(a.n), cell(a.replica), cell(a.role), cell(a.outcome, a.outcome === "failed" ? "err" : ""),
      cell(ms(a.start_ms)), cell(a.ttft_ms === null ? "none" : "+" + ms(a.ttft_ms)), cell(ms(a.end_ms)),
      cell(`${a.prompt_tokens}/${a.completion_tokens}`), cell(a.reason || "–"));
    return tr;
  }));
  const st = document.createElement("table");
  st.className = "stages";
  st.innerHTML = "<thead><tr><th>stage</th><th>time</th></tr></thead><tbody></tbody>";
  st.tBodies[0].append(...STAGES.map((s) => {
    const tr = document.createElement("tr");
    tr.append(cell(s === "ttft" && !r.stream ? "ttft (whole answer)" : s), cell(ms(r.stages_ms[s])));
    return tr;
  }));
  box.replaceChildren(close, h, when, facts, att, at, st);
}

// ---- tenants and keys ----

function renderTenants(tenants) {
  const pts = (lastHistory && lastHistory.data) || [];
  const spendHour = (name) => {
    const vs = pts.map((p) => (p.tenant_spent || {})[name]).filter((v) => v !== undefined);
    return vs.length > 1 ? "$" + (vs[vs.length - 1] - vs[0]).toFixed(6) : "–";
  };
  fill("#tenants", tenants, (t) => [
    cell(t.name), cell(t.budget_tokens || "unlimited"), cell(t.spent_tokens), cell(t.budget_micros ? t.budget.toFixed(6) : "unlimited"),
    cell(t.spent || anyPriced() ? t.spent.toFixed(6) : "—"), periodCell(t), usedCell(t),
    cell(t.reserved_tokens), cell(anyPriced() ? spendHour(t.name) : "—"),
    button("set budget", () => {
      const f = $("#budget-form");
      f.tenant.value = t.name;
      f.budget_tokens.value = t.budget_tokens;
      f.budget.value = t.budget_micros ? t.budget : 0;
      f.budget_period.value = "";
      f.budget_alert_percent.value = t.budget_alert_percent || "";
      f.budget_tokens.focus();
    }),
  ], "no tenant yet: a tenant is created with its first key");
}

// periodCell says how a tenant's budget counts: a lifetime total or a
// calendar period (UTC) and when it resets.
function periodCell(t) {
  if (!t.budget_period) return cell("lifetime");
  const at = t.budget_resets_at ? new Date(t.budget_resets_at).toISOString().slice(0, 16).replace("T", " ") + " UTC" : "";
  return cell(at ? `${t.budget_period}, resets ${at}` : t.budget_period);
}

// usedRatio is the share of the tenant's budget used in its period: the
// gateway's own measure (tailgate_budget_used_ratio) when it has one, else
// the larger of the token and money shares; null without a budget.
function usedRatio(t) {
  if (t.budget_used_ratio !== null && t.budget_used_ratio !== undefined) return t.budget_used_ratio;
  const shares = [];
  if (t.budget_tokens) shares.push((t.budget_period ? t.period_spent_tokens : t.spent_tokens) / t.budget_tokens);
  if (t.budget_micros) shares.push((t.budget_period ? t.period_spent_micros : t.spent_micros) / t.budget_micros);
  return shares.length ? Math.max(...shares) : null;
}

// usedCell shows the share used, amber from the alert percent on, red when
// used up.
function usedCell(t) {
  const r = usedRatio(t);
  if (r === null) return cell("no budget", "muted");
  const alert = t.budget_alert_percent || 80;
  const cls = r >= 1 ? "err budget-used" : 100 * r >= alert ? "warn budget-alert" : "";
  return cell(`${(100 * r).toFixed(1)} % (alert at ${alert} %)`, cls);
}

function renderKeys(keys) {
  const sel = $("#filters").key;
  const ids = keys.map((k) => k.id).join(",");
  if (sel.dataset.ids !== ids) { // rebuilt only when keys come or go, so an open list stays open
    const chosen = sel.value;
    sel.replaceChildren(new Option("any key", ""), ...keys.map((k) => new Option(`${k.name || k.prefix} (${k.tenant})`, k.id)));
    sel.value = chosen;
    sel.dataset.ids = ids;
  }
  fill("#keys", keys, (k) => {
    const state = k.revoked ? "revoked" : k.expired ? "expired" : "active";
    const row = [
      cell(k.prefix), cell(k.name), cell(k.owner), cell(k.tenant), cell(k.rpm || "∞"), cell(k.tpm || "∞"), cell(k.max_concurrency || "∞"),
      cell(k.models.length ? k.models.join(", ") : "all"), cell(k.requests), cell(k.spent_tokens),
      cell(k.spent || anyPriced() ? k.spent.toFixed(6) : "—"), cell(k.last_used_at ? new Date(k.last_used_at).toLocaleString() : "never"),
      cell(k.expires_at ? new Date(k.expires_at).toLocaleString() : "never"),
      cell(state, state === "active" ? "state-ready" : "err"),
    ];
    const td = document.createElement("td");
    if (!k.revoked) {
      td.append(button("edit", () => editKey(k)).firstChild, " ", button("rotate", () => rotateKey(k), "rotate").firstChild, " ",
        button("revoke", () => revokeKey(k), "danger").firstChild);
    }
    row.push(td);
    return row;
  }, "no key yet");
}

function editKey(k) {
  const f = $("#key-edit");
  f.hidden = false;
  $("#edit-prefix").textContent = k.prefix;
  f.ref.value = k.id;
  f.rpm.value = k.rpm;
  f.tpm.value = k.tpm;
  f.max_concurrency.value = k.max_concurrency;
  f.expires.value = "";
  f.querySelector(".msg").textContent = "";
}

// rotateKey gives the key a new secret (same identity, limits and spend);
// the old secret keeps working for a day, as with `tailgate keys rotate`.
async function rotateKey(k) {
  const who = k.name ? `${k.name} (${k.prefix})` : k.prefix;
  if (!confirm(`Rotate key ${who} of ${k.tenant}? It gets a new secret; the old one keeps working for 24 h.`)) return;
  try {
    const out = await api("/admin/v1/keys/" + encodeURIComponent(k.id) + "/rotate", { method: "POST", body: { grace: "24h" } });
    $("#secret-what").textContent = `New secret of ${who}`;
    $("#secret-value").textContent = out.secret;
    $("#new-secret").hidden = false;
    say("#key-form", `key ${who} rotated: the old secret works until ${new Date(out.key.previous_secret_until).toLocaleString()}`);
  } catch (err) {
    say("#key-form", err.message, true);
  }
  refresh();
}

async function revokeKey(k) {
  if (!confirm(`Revoke key ${k.prefix} of ${k.tenant}? Requests with it are refused at once.`)) return;
  try {
    await api("/admin/v1/keys/" + encodeURIComponent(k.id), { method: "DELETE" });
    say("#key-form", `key ${k.prefix} revoked`);
  } catch (err) {
    say("#key-form", err.message, true);
  }
  refresh();
}

function say(form, text, bad) {
  const m = $(form + " .msg");
  m.textContent = text;
  m.className = "msg " + (bad ? "err" : "ok");
}

// int reads a whole number field; "" is undefined (left out of the request).
function int(v) {
  v = String(v).trim();
  return v === "" ? undefined : Number.parseInt(v, 10);
}

$("#key-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const f = ev.target;
  const body = { tenant: f.tenant.value.trim() };
  for (const n of ["name", "owner"]) if (f[n].value.trim()) body[n] = f[n].value.trim();
  for (const n of ["rpm", "tpm", "max_concurrency"]) if (int(f[n].value) !== undefined) body[n] = int(f[n].value);
  const models = f.models.value.split(",").map((s) => s.trim()).filter(Boolean);
  if (models.length) body.models = models;
  if (f.expires.value.trim()) body.expires = f.expires.value.trim();
  try {
    const out = await api("/admin/v1/keys", { method: "POST", body });
    $("#secret-what").textContent = "New key";
    $("#secret-value").textContent = out.secret;
    $("#new-secret").hidden = false;
    say("#key-form", `key ${out.key.prefix} created for ${out.key.tenant}`);
    f.reset();
  } catch (err) {
    say("#key-form", err.message, true);
  }
  refresh();
});

// Copy puts the secret on the clipboard; where the page may not (plain
// http off localhost is no secure context) it selects the secret for Ctrl-C.
$("#secret-copy").addEventListener("click", async () => {
  const b = $("#secret-copy");
  try {
    await navigator.clipboard.writeText($("#secret-value").textContent);
    b.textContent = "Copied";
  } catch {
    const r = document.createRange();
    r.selectNodeContents($("#secret-value"));
    const sel = getSelection();
    sel.removeAllRanges();
    sel.addRange(r);
    b.textContent = "Selected: press Ctrl-C";
  }
});

$("#secret-done").addEventListener("click", () => {
  $("#secret-copy").textContent = "Copy";
  $("#secret-value").textContent = "";
  $("#new-secret").hidden = true;
});

$("#key-edit").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const f = ev.target;
  const body = {};
  for (const n of ["rpm", "tpm", "max_concurrency"]) if (int(f[n].value) !== undefined) body[n] = int(f[n].value);
  if (f.expires.value.trim()) body.expires = f.expires.value.trim();
  try {
    const out = await api("/admin/v1/keys/" + encodeURIComponent(f.ref.value), { method: "PATCH", body });
    say("#key-edit", `saved ${(out.key || out).prefix || ""}`);
    f.hidden = true;
  } catch (err) {
    say("#key-edit", err.message, true);
  }
  refresh();
});
$("#edit-cancel").addEventListener("click", () => { $("#key-edit").hidden = true; });

$("#budget-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const f = ev.target;
  const body = {};
  if (int(f.budget_tokens.value) !== undefined) body.budget_tokens = int(f.budget_tokens.value);
  if (String(f.budget.value).trim() !== "") body.budget_micros = Math.round(Number(f.budget.value) * 1e6);
  if (f.budget_period.value) body.budget_period = f.budget_period.value;
  if (int(f.budget_alert_percent.value) !== undefined) body.budget_alert_percent = int(f.budget_alert_percent.value);
  try {
    const t = await api("/admin/v1/tenants/" + encodeURIComponent(f.tenant.value.trim()), { method: "PATCH", body });
    say("#budget-form", `budget of ${t.name}: ${t.budget_tokens || "unlimited"} tokens, ${t.budget_micros ? "$" + t.budget : "no money limit"}, ${t.budget_period || "lifetime total"}`);
  } catch (err) {
    say("#budget-form", err.message, true);
  }
  refresh();
});

// money renders an amount for a model: "—" when the model has no price
// (its requests cost nothing by configuration, not $0.000000 of use).
function money(amount, model) {
  const priced = (lastHistory && lastHistory.priced) || {};
  return amount || priced[model] ? amount.toFixed(6) : "—";
}

function anyPriced() {
  const h = lastHistory || {};
  return h.spend_today !== null && h.spend_today !== undefined;
}

// usageQuery is the usage form's range and grouping as admin API
// parameters (by overrides the form's grouping).
function usageQuery(by) {
  const f = $("#usage-form");
  const q = new URLSearchParams();
  for (const n of ["since", "until"]) if (f[n].value.trim()) q.set(n, f[n].value.trim());
  const group = by === undefined ? f.by.value : by;
  if (group) q.set("by", group);
  return q.toString();
}

// loadUsage asks for usage totals; a range the API refuses (a 400 naming
// since, until or by) is said beside the form, with no rows.
async function loadUsage(query) {
  try {
    return await api("/admin/v1/usage?" + query);
  } catch (err) {
    if (err.status !== 400) throw err;
    say("#usage-form", err.message, true);
    return { data: [] };
  }
}

$("#usage-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  $("#usage-form .msg").textContent = "";
  refresh();
});

// renderUsageChart draws requests and tokens per day over the form's range
// (a range with no since: the last 30 days).
function renderUsageChart(days) {
  days = [...days].sort((a, b) => (a.period < b.period ? -1 : 1));
  const labels = days.map((d) => d.period);
  $("#usage-chart").replaceChildren(
    barChart("requests per day (UTC)", labels, [{ name: "requests", values: days.map((d) => d.requests) }]),
    barChart("tokens per day (UTC)", labels, [
      { name: "prompt", values: days.map((d) => d.prompt_tokens) },
      { name: "completion", values: days.map((d) => d.completion_tokens) },
    ]),
  );
}

function renderUsage(usage) {
  fill("#usage", usage, (u) => [
    cell(u.period), cell(u.tenant), cell(u.key_name || u.key_prefix), cell(u.model), cell(u.requests), cell(u.prompt_tokens),
    cell(u.completion_tokens), cell(money(u.cost, u.model)), cell(u.rejected),
  ], "no usage yet");
}

// ---- refresh ----

let busy = false;

async function refresh() {
  if (!token) {
    if ($("#signin").hidden) signIn("");
    return;
  }
  if (busy) return;
  busy = true;
  try {
    const [replicas, requests, inflight, usage, tenants, keys, hist] = await Promise.all([
      api("/admin/v1/replicas"), api("/admin/v1/requests?" + filterQuery()), api("/admin/v1/requests/inflight"),
      loadUsage(usageQuery()), api("/admin/v1/tenants"), api("/admin/v1/keys"), api("/admin/v1/history"),
    ]);
    const range = $("#usage-form").since.value.trim() ? usageQuery("day") : "since=30d&" + usageQuery("day");
    renderUsageChart((await loadUsage(range)).data);
    keyNames = new Map(keys.data.map((k) => [k.id, k]));
    renderHistory(hist);
    renderReplicas(replicas.data);
    renderRequests(requests.data, inflight.data);
    renderTenants(tenants.data);
    renderKeys(keys.data);
    renderUsage(usage.data);
    renderFleet(await api("/admin/v1/fleet"));
    const slo = await renderBudgets(requests.data);
    renderKPIs(hist, replicas.data, slo);
    document.body.dataset.loaded = String(Date.now());
  } catch (err) {
    if (err.status === 401) {
      signIn("admin token rejected: paste the current one (DIR/admin.token).");
      return;
    }
    $("#status").textContent = err.message;
    $("#status").className = "err";
  } finally {
    busy = false;
  }
}

if (token) showApp();
refresh();
setInterval(refresh, 2000);
