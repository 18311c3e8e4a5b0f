// The conformance kit's shared parts: the gateway under test (from the
// environment scripts/conformance.sh sets), keys made with `tailgate keys
// create`, usage read with `tailgate usage --json`, a fetch that records the
// statuses a client saw, and the cells of the matrix.
import { execFileSync } from "node:child_process";

globalThis.AI_SDK_LOG_WARNINGS = false;

export const env = {
  base: process.env.TG_BASE, // http://127.0.0.1:PORT (no /v1)
  key: process.env.TG_KEY, // the demo key
  bin: process.env.TG_BIN, // the tailgate binary
  data: process.env.TG_DATA, // its data directory
  model: process.env.TG_MODEL || "tailgate-sim",
};
for (const [k, v] of Object.entries(env)) {
  if (!v) throw new Error(`conformance: ${k} is not set (run scripts/conformance.sh)`);
}

// newKey creates a key for a new tenant and returns its secret.
export function newKey(tenant, ...flags) {
  const out = execFileSync(env.bin, ["keys", "create", "--data", env.data, "--tenant", tenant, ...flags], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  return out.trim().split("\n").pop().trim();
}

// usage is the tenant's totals from `tailgate usage --json`.
export function usage(tenant) {
  const rows = JSON.parse(execFileSync(env.bin, ["usage", "--data", env.data, "--tenant", tenant, "--json"], { encoding: "utf8" }));
  const sum = { requests: 0, prompt_tokens: 0, completion_tokens: 0 };
  for (const r of rows) for (const k of Object.keys(sum)) sum[k] += r[k] || 0;
  return sum;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// recordingFetch is a fetch that records every response status it saw.
export function recordingFetch() {
  const statuses = [];
  const f = async (input, init) => {
    const res = await fetch(input, init);
    statuses.push(res.status);
    return res;
  };
  f.statuses = statuses;
  return f;
}

// holdSlot takes the key's one concurrency slot with a short stream and
// resolves once it is admitted (its first event read); done() resolves when
// the stream has ended. A client's request meanwhile gets 429 with
// Retry-After: 1 (a slot frees when a request ends), retries, and succeeds.
// 40 tokens hold it about 0.75 s (the sim's 15 ms a token): long enough for
// the client's first try to arrive through specproxy on a busy machine,
// short enough for its retry after a second to get in.
export async function holdSlot(key) {
  const res = await fetch(`${env.base}/v1/chat/completions`, {
    method: "POST",
    headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
    body: JSON.stringify({ model: env.model, stream: true, max_tokens: 40, messages: [{ role: "user", content: "hold" }] }),
  });
  if (res.status !== 200) throw new Error(`holder: ${res.status} ${await res.text()}`);
  const reader = res.body.getReader();
  await reader.read();
  const done = (async () => {
    while (!(await reader.read()).done) {}
  })();
  return { done };
}

// checkRetried runs call (which must use a client on key whose fetch is
// rec) while the key's slot is held: the client must have seen a 429 and
// succeeded after it.
export async function checkRetried(key, rec, call) {
  const h = await holdSlot(key);
  await call();
  await h.done;
  const i = rec.statuses.indexOf(429);
  if (i < 0) throw new Error(`no 429 seen (statuses ${rec.statuses}); the slot was not held`);
  if (rec.statuses.slice(i).indexOf(200) < 0) throw new Error(`no success after the 429 (statuses ${rec.statuses})`);
}

// checkAbort runs stream(key, signal, onPiece) on a fresh tenant's key,
// aborts after a few pieces, and checks the ledger billed what was
// received: at least the pieces the client got, far less than the cap.
export async function checkAbort(name, stream) {
  const tenant = `abort-${name}-${process.pid}`;
  const key = newKey(tenant);
  const ac = new AbortController();
  let pieces = 0;
  try {
    await stream(key, ac.signal, () => {
      pieces++;
      if (pieces === 3) ac.abort();
    });
  } catch (e) {
    if (!ac.signal.aborted) throw e;
  }
  if (pieces < 3) throw new Error(`only ${pieces} pieces before the stream ended`);
  let u;
  for (let i = 0; i < 50; i++) {
    u = usage(tenant);
    if (u.requests > 0 && u.completion_tokens > 0) break;
    await sleep(100);
  }
  if (!(u.completion_tokens >= 3 && u.completion_tokens < ABORT_CAP)) {
    throw new Error(`billed ${JSON.stringify(u)} after 3 pieces of a ${ABORT_CAP}-token cap`);
  }
}

// ABORT_CAP is the output cap of an aborted stream: well above what it
// produces before the abort.
export const ABORT_CAP = 400;

// The matrix's features, in column order.
export const FEATURES = ["plain", "stream", "tools", "structured", "embeddings", "abort", "retry_429", "wrong_model", "wrong_key"];

// A row: run each feature's check, print one JSON line per cell.
export async function row(client, checks) {
  // specproxy.mjs tags what follows with this client, for schema.mjs.
  await fetch(`${env.base}/_kit/row`, { method: "POST", body: client });
  for (const f of FEATURES) {
    const check = checks[f];
    if (check === undefined) continue; // not in the client's API
    let cell = { client, feature: f, pass: true };
    try {
      await withTimeout(check(), 30000);
    } catch (e) {
      cell = { client, feature: f, pass: false, error: String(e?.stack || e).split("\n").slice(0, 3).join(" | ") };
    }
    console.log(JSON.stringify(cell));
  }
}

function withTimeout(p, ms) {
  let t;
  return Promise.race([p, new Promise((_, rej) => (t = setTimeout(() => rej(new Error(`timed out after ${ms} ms`)), ms)))]).finally(() =>
    clearTimeout(t),
  );
}

export function expect(cond, what) {
  if (!cond) throw new Error(what);
}

// expectError runs call and checks the error it throws.
export async function expectError(call, check) {
  let err;
  try {
    await call();
  } catch (e) {
    err = e;
  }
  if (!err) throw new Error("no error");
  if (!check(err)) throw new Error(`unexpected error ${err?.constructor?.name}: ${err?.status ?? err?.statusCode} ${err?.message}`);
}

// The request shapes every row uses.
export const weatherSchema = {
  type: "object",
  properties: { city: { type: "string" }, days: { type: "integer" } },
  required: ["city", "days"],
  additionalProperties: false,
};
export const personSchema = {
  type: "object",
  properties: { name: { type: "string" }, age: { type: "integer" } },
  required: ["name", "age"],
  additionalProperties: false,
};
export const isPerson = (o) => o && typeof o.name === "string" && Number.isInteger(o.age);
