// tailgate's edge as a Cloudflare Worker: the same selection as
// `tailgate edge` (serving/edge), reading the same public status of each
// regional gateway (GET /edge/v1/status).
//
// Configuration (wrangler.toml [vars] or workerd text bindings):
//   REGIONS        "eu=https://eu.example.com,us=https://us.example.com"
//   PREFER         a region that wins near ties ("" : none)
//   POLL_MS        status age after which it is polled again (default 1000)
//   POLL_TIMEOUT_MS bound of one poll (default 800)
//   SWITCH_MARGIN  fraction another region must be better by (default 0.2)
//   SWITCH_POLLS   polls in a row it must be (default 3)
//   QUEUE_WEIGHT   median TTFTs per request queued ahead per replica (default 1)
//   MAX_PEEK       bytes of a body held to read its model and retry (default 1048576)
//   EDGE_TOKEN     the regions' edge token (a gateway's DIR/edge.token), sent on
//                  the status polls; a secret: npx wrangler secret put EDGE_TOKEN
//
// A Worker has no background loop: the first request of an isolate polls
// every region and waits for it; later requests poll in the background
// (ctx.waitUntil) when the status is older than POLL_MS. State (RTT EWMA,
// routes with their hysteresis) lives per isolate.
//
// The Worker forwards the request untouched (method, headers, body bytes):
// it never reads a key or bills. It reads a JSON body's "model" from at most
// MAX_PEEK bytes. A request whose connection to a region fails before an
// answer (fetch throws: the dial failed, or the region died before its
// response headers) goes to the next region at once when its body was
// held whole, as does one a region refused with a 503; serving/edge
// follows the same rule. A model a region reports no TTFT samples for is
// unknown, not fastest: it counts the slowest median other regions report
// (serving/edge/select.go's rule). Answers carry X-Tailgate-Region.

const STATUS_PATH = "/edge/v1/status";
const RTT_ALPHA = 0.3;
const TIE_MARGIN = 0.05;

let state = null; // per isolate

function config(env) {
  const regions = String(env.REGIONS || "")
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean)
    .map((s, idx) => {
      const eq = s.indexOf("=");
      return { idx, name: s.slice(0, eq), base: s.slice(eq + 1).replace(/\/+$/, "") };
    });
  const num = (v, d) => (v === undefined || v === "" || Number(v) <= 0 ? d : Number(v));
  return {
    regions,
    prefer: regions.findIndex((r) => r.name === env.PREFER),
    pollMs: num(env.POLL_MS, 1000),
    pollTimeoutMs: num(env.POLL_TIMEOUT_MS, 800),
    switchMargin: num(env.SWITCH_MARGIN, 0.2),
    switchPolls: num(env.SWITCH_POLLS, 3),
    queueWeight: num(env.QUEUE_WEIGHT, 1),
    maxPeek: num(env.MAX_PEEK, 1 << 20),
    edgeToken: String(env.EDGE_TOKEN || "").trim(),
  };
}

function init(env) {
  const cfg = config(env);
  return {
    cfg,
    regions: cfg.regions.map((r) => ({ ...r, healthy: false, draining: false, rtt: 0, status: null })),
    routes: new Map(), // model → {current, challenger, wins, order}
    polledAt: 0,
    polling: null,
  };
}

async function pollOne(st, r) {
  const start = Date.now();
  try {
    const resp = await fetch(r.base + STATUS_PATH, {
      signal: AbortSignal.timeout(st.cfg.pollTimeoutMs),
      headers: { accept: "application/json", authorization: "Bearer " + st.cfg.edgeToken },
    });
    if (resp.status !== 200) throw new Error("status " + resp.status);
    const s = await resp.json();
    const rtt = (Date.now() - start) / 1000;
    r.rtt = r.rtt === 0 ? rtt : r.rtt + RTT_ALPHA * (rtt - r.rtt);
    r.healthy = true;
    r.draining = !!s.draining;
    r.status = s;
  } catch (e) {
    r.healthy = false;
  }
}

async function pollAll(st) {
  await Promise.all(st.regions.map((r) => pollOne(st, r)));
  st.polledAt = Date.now();
  reroute(st, true);
}

// modelCost is the model's median TTFT plus its queue penalty; a model
// without a median (no samples yet: a fresh or restarted region) is
// unknown, not fast, and counts unknown[id], the slowest median the other
// regions report for it (serving/edge/select.go's rule).
function modelCost(m, queueWeight, unknown) {
  let ahead = m.waiting || 0;
  if (m.slots > 0) ahead = Math.max(ahead, (m.inflight || 0) - m.slots);
  const queued = m.ready_replicas > 0 ? Math.max(ahead, 0) / m.ready_replicas : 0;
  const p50 = m.ttft_p50_seconds > 0 ? m.ttft_p50_seconds : unknown.get(m.id) || 0;
  return p50 + queueWeight * queued * p50;
}

// unknownMedians maps each model to the slowest median of the regions
// that may take its requests and have one (none: 0, and the round trips
// and queues decide alone).
function unknownMedians(st) {
  const out = new Map();
  for (const r of st.regions) {
    if (!r.healthy || r.draining) continue;
    for (const m of (r.status && r.status.models) || []) {
      if (m.ttft_p50_seconds > 0 && m.ready_replicas > 0 && m.ttft_p50_seconds > (out.get(m.id) || 0)) out.set(m.id, m.ttft_p50_seconds);
    }
  }
  return out;
}

// expected returns a request's expected first-token time in r, or null
// when r may not take it.
function expected(r, model, queueWeight, unknown) {
  if (!r.healthy || r.draining) return null;
  const models = (r.status && r.status.models) || [];
  if (model === "") {
    let best = null;
    for (const m of models) {
      if (m.ready_replicas > 0) {
        const c = modelCost(m, queueWeight, unknown);
        if (best === null || c < best) best = c;
      }
    }
    return r.rtt + (best === null ? 0 : best);
  }
  const m = models.find((x) => x.id === model);
  if (!m || m.ready_replicas === 0) return null;
  return r.rtt + modelCost(m, queueWeight, unknown);
}

function rank(st, model) {
  const out = [];
  const unknown = unknownMedians(st);
  for (const r of st.regions) {
    const score = expected(r, model, st.cfg.queueWeight, unknown);
    if (score !== null) out.push({ idx: r.idx, score });
  }
  const eff = (x) => (x.idx === st.cfg.prefer ? x.score * (1 - TIE_MARGIN) : x.score);
  out.sort((a, b) => eff(a) - eff(b) || a.idx - b.idx);
  return out;
}

// update is serving/edge's route.update: hysteresis on the current region.
function update(rt, rs, margin, polls, round) {
  if (rs.length === 0) {
    Object.assign(rt, { current: -1, challenger: -1, wins: 0, order: [] });
    return;
  }
  const best = rs[0];
  const cur = rs.findIndex((x) => x.idx === rt.current);
  if (cur < 0) {
    Object.assign(rt, { current: best.idx, challenger: -1, wins: 0 });
  } else if (best.idx === rt.current) {
    Object.assign(rt, { challenger: -1, wins: 0 });
  } else if (!round) {
    // between rounds: no wins counted
  } else if (best.score < rs[cur].score * (1 - margin)) {
    if (rt.challenger !== best.idx) Object.assign(rt, { challenger: best.idx, wins: 0 });
    rt.wins++;
    if (rt.wins >= polls) Object.assign(rt, { current: best.idx, challenger: -1, wins: 0 });
  } else {
    Object.assign(rt, { challenger: -1, wins: 0 });
  }
  rt.order = [rt.current, ...rs.filter((x) => x.idx !== rt.current).map((x) => x.idx)];
}

function reroute(st, round) {
  const models = new Set([""]);
  for (const r of st.regions) for (const m of (r.status && r.status.models) || []) models.add(m.id);
  for (const m of models) {
    let rt = st.routes.get(m);
    if (!rt) st.routes.set(m, (rt = { current: -1, challenger: -1, wins: 0, order: [] }));
    update(rt, rank(st, m), st.cfg.switchMargin, st.cfg.switchPolls, round);
  }
}

function order(st, model) {
  const rt = st.routes.get(model) || st.routes.get("");
  return rt ? rt.order : [];
}

function apiError(status, code, message) {
  return new Response(
    JSON.stringify({ error: { message, type: "server_error", param: null, code } }) + "\n",
    { status, headers: { "content-type": "application/json" } },
  );
}

// peek holds up to maxPeek bytes of the body: the bytes to send, whether
// they are the whole body, and the model a JSON body names.
async function peek(request, maxPeek) {
  if (!request.body) return { body: null, whole: true, model: "" };
  const reader = request.body.getReader();
  const chunks = [];
  let n = 0;
  let done = false;
  while (n <= maxPeek) {
    const r = await reader.read();
    if (r.done) {
      done = true;
      break;
    }
    chunks.push(r.value);
    n += r.value.byteLength;
  }
  const head = new Uint8Array(n);
  let off = 0;
  for (const c of chunks) {
    head.set(c, off);
    off += c.byteLength;
  }
  let model = "";
  const ct = (request.headers.get("content-type") || "").split(";")[0].trim();
  if (ct === "application/json" || ct === "") {
    const m = /"model"\s*:\s*"((?:[^"\\]|\\.)*)"/.exec(new TextDecoder().decode(head.subarray(0, Math.min(n, maxPeek))));
    if (m) {
      try {
        model = JSON.parse('"' + m[1] + '"');
      } catch {}
    }
  }
  if (done) return { body: head, whole: true, model };
  const rest = new ReadableStream({
    start(c) {
      c.enqueue(head);
    },
    async pull(c) {
      const r = await reader.read();
      if (r.done) c.close();
      else c.enqueue(r.value);
    },
  });
  return { body: rest, whole: false, model };
}

export default {
  async fetch(request, env, ctx) {
    if (!state) state = init(env);
    const st = state;
    if (st.regions.length === 0) return apiError(500, "no_region_configured", "set REGIONS to NAME=URL,... in the Worker's vars");
    if (!st.cfg.edgeToken) return apiError(500, "no_edge_token", "set the EDGE_TOKEN secret to the regions' edge token (a gateway's DIR/edge.token): npx wrangler secret put EDGE_TOKEN");
    if (st.polledAt === 0) {
      st.polling = st.polling || pollAll(st).finally(() => (st.polling = null));
      await st.polling;
    } else if (Date.now() - st.polledAt >= st.cfg.pollMs && !st.polling) {
      st.polling = pollAll(st).finally(() => (st.polling = null));
      ctx.waitUntil(st.polling);
    }

    const { body, whole, model } = await peek(request, st.cfg.maxPeek);
    const regions = order(st, model);
    if (regions.length === 0) return apiError(503, "no_region", "no healthy region can take the request now; try again shortly");
    const url = new URL(request.url);
    // X-Forwarded-For names the client (Cloudflare's CF-Connecting-IP; a
    // client's own is dropped), as tailgate edge sends it: a region
    // trusting its edges applies its per-address shares to the client.
    const headers = new Headers(request.headers);
    headers.delete("x-forwarded-for");
    const client = request.headers.get("cf-connecting-ip");
    if (client) headers.set("x-forwarded-for", client);
    let lastErr = null;
    for (let n = 0; n < regions.length; n++) {
      if (n > 0 && !whole) break;
      const r = st.regions[regions[n]];
      if ((!r.healthy || r.draining) && n < regions.length - 1) continue;
      const target = r.base + url.pathname + url.search;
      try {
        const resp = await fetch(target, {
          method: request.method,
          headers,
          body: body instanceof Uint8Array ? body.slice() : body, // a fetch may detach the buffer it sent
          redirect: "manual",
        });
        if (resp.status === 503 && whole && n < regions.length - 1) {
          // The region refused it (no ready replica, draining): nothing
          // ran there, so the next region takes it at once.
          await resp.body?.cancel();
          continue;
        }
        const out = new Response(resp.body, resp);
        out.headers.set("X-Tailgate-Region", r.name);
        return out;
      } catch (e) {
        // fetch threw before an answer: the connection failed; the region
        // leaves the routes until a poll brings it back.
        lastErr = e;
        r.healthy = false;
        reroute(st, false);
      }
    }
    return apiError(502, "no_region_reachable", "no region could be reached: " + (lastErr ? lastErr.message : "none tried"));
  },
};

