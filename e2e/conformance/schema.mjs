// schema.mjs validates what specproxy.mjs recorded against the published
// OpenAPI specs checked into testdata/openapi (SOURCE.md says where each
// comes from): every request body against its operation's requestBody
// schema, every answer against its response schema (JSON, or each event of
// a text/event-stream), every error against the API's error shape. It
// prints one matrix cell per client, feature "schema", as the rows do.
//
//   node schema.mjs RECORDS CLIENT...
//
// Before judging, it checks itself: a recorded chat completion and Messages
// answer, each with one field's type broken, must fail, so a validator that
// accepts everything fails the kit.
import { readFileSync } from "node:fs";
import Ajv from "ajv";
import Ajv2020 from "ajv/dist/2020.js";
import YAML from "yaml";

const here = new URL("./testdata/openapi/", import.meta.url);
const opts = { strict: false, validateSchema: false, validateFormats: false, allErrors: true };

// Each API: the spec, the validator for its OpenAPI version, which paths
// (after /v1) it owns, the schema of its error body, and the schema of its
// stream events where the spec has no text/event-stream response.
const apis = [
  {
    name: "anthropic",
    doc: YAML.parse(readFileSync(new URL("anthropic.yaml", here), "utf8")),
    ajv: new Ajv(opts), // OpenAPI 3.0.3: draft-07 plus nullable
    // Where the curated file disagrees with Anthropic's own SDK types
    // (@anthropic-ai/sdk 1.17.0, resources/messages/messages.d.ts), the SDK's:
    errata: (doc) => {
      // Message.stop_sequence: `string | null` (null unless a custom stop
      // sequence ended the message; message_start always has null).
      doc.components.schemas.Message.properties.stop_sequence.nullable = true;
      // InputJSONDelta is {partial_json: string, type}; the curated file
      // requires `text`, its text delta's field.
      doc.components.schemas.InputJsonBlockDelta.required = ["partial_json", "type"];
    },
    owns: (p) => p.startsWith("/messages"),
    error: "#/components/schemas/ErrorEvent",
    events: "#/components/schemas/MessageStreamEvent",
  },
  {
    name: "openai",
    doc: JSON.parse(readFileSync(new URL("openai.json", here), "utf8")),
    ajv: new Ajv2020(opts), // OpenAPI 3.1: JSON Schema 2020-12
    owns: () => true,
    error: "#/components/schemas/ErrorResponse",
  },
];
// KNOWN: where tailgate's answers differ from the published specs because
// the engine's bodies pass through as vLLM writes them (the simulated engine
// copies vLLM, and cites the vLLM source it copies). Each entry names the
// operation and the part ("answer", "event TYPE", a trailing * for any), and
// what is read as allowed there: `nulls`, JSON paths (* any key or index)
// where a null stands for a field the spec makes optional and non-null, read
// as absent; `absent`, required properties left out. Nothing else is: a
// wrong type at these paths, or any other difference, still fails. How
// many kinds were seen goes to stderr; SCHEMA_KNOWN=1 lists them.
const KNOWN = [
  {
    // ChatMessage's annotations and function_call, UsageInfo's two details:
    // null in serving/sim/chat.go, after the vLLM models it cites
    // (vllm/entrypoints/openai/chat_completion/protocol.py,
    // vllm/entrypoints/serve/engine/protocol.py).
    op: "POST /v1/chat/completions",
    part: "answer",
    nulls: ["/choices/*/message/annotations", "/choices/*/message/function_call", "/usage/prompt_tokens_details", "/usage/completion_tokens_details"],
  },
  ...["", "/response"].map((at) => ({
    // The response object (the answer, and inside response.* events): user,
    // text and, until the stream ends, usage null; an output_text's logprobs
    // (a required list) and a function call's namespace null; no `error`,
    // no input_tokens_details.cache_write_tokens. serving/sim/responses.go
    // and responses_events.go, after the vLLM model they cite
    // (vllm/entrypoints/openai/responses/protocol.py).
    op: "POST /v1/responses",
    part: at ? "event response.*" : "answer",
    nulls: [`${at}/user`, `${at}/text`, `${at}/usage`, `${at}/output/*/content/*/logprobs`, `${at}/output/*/namespace`],
    absent: [`${at}/error`, `${at}/usage/input_tokens_details/cache_write_tokens`, `${at}/output/*/content/*/logprobs`],
  })),
  {
    // The same output item and content part as stream events carry them.
    op: "POST /v1/responses",
    part: "event response.*",
    nulls: ["/part/logprobs", "/item/content/*/logprobs", "/item/namespace"],
    absent: ["/part/logprobs", "/item/content/*/logprobs"],
  },
  {
    // Stream events are model_dump_json(exclude_unset=True), so
    // message_start's message has no role (nor type); Anthropic's SDKs fill
    // them in. serving/sim/messages.go, after
    // vllm/entrypoints/anthropic/serving.py.
    op: "POST /v1/messages",
    part: "event message_start",
    absent: ["/message/role"],
  },
];
const seenKnown = new Set();

for (const a of apis) {
  a.errata?.(a.doc);
  discriminators(a.doc, a.doc);
  if (a.name === "openai") unions(a.doc);
  nullables(a.doc);
  a.ajv.addSchema(a.doc, a.name);
  a.validators = new Map();
  a.check = (ref, value) => {
    let v = a.validators.get(ref);
    if (!v) a.validators.set(ref, (v = a.ajv.compile({ $ref: a.name + ref })));
    return v(value) ? [] : v.errors;
  };
}

// OpenAPI's discriminator with a mapping picks the one schema the tag names;
// JSON Schema's oneOf (or anyOf) alone cannot (Anthropic's events all declare `type` as
// the same enum). Rewrite each such oneOf to: the tag is one of the mapping's
// keys, and the schema it maps to holds; without the tag, any of them.
// OpenAI's discriminators name no mapping; each member's tag is a
// one-value enum, which gives the mapping.
function discriminators(v, doc) {
  if (Array.isArray(v)) return v.forEach((x) => discriminators(x, doc));
  if (!v || typeof v !== "object") return;
  for (const x of Object.values(v)) discriminators(x, doc);
  const members = v.oneOf ?? v.anyOf;
  const d = v.discriminator;
  let tag, mapping;
  if (Array.isArray(members) && d?.mapping) [tag, mapping] = [d.propertyName, d.mapping];
  else if (Array.isArray(members) && d) [tag, mapping] = [d.propertyName, derivedMapping(members, d.propertyName, doc)];
  // A union whose members carry distinct one-value `type` tags is read the
  // same way, declared or not (OpenAI's output items), as its SDKs
  // dispatch it.
  else if (Array.isArray(members) && members.length > 1) [tag, mapping] = ["type", derivedMapping(members, "type", doc)];
  if (mapping && Object.keys(mapping).length > 1) {
    const keys = Object.keys(mapping);
    const untagged = members.filter((m) => !Object.values(mapping).includes(m.$ref));
    v.allOf = [
      ...(v.allOf ?? []),
      ...keys.map((k) => ({ if: { type: "object", required: [tag], properties: { [tag]: { const: k } } }, then: { $ref: mapping[k] } })),
      { if: { type: "object", required: [tag], properties: { [tag]: { enum: keys } } }, else: { anyOf: untagged.length ? untagged : members } },
    ];
    delete v.oneOf;
    delete v.anyOf;
  }
  delete v.discriminator;
}

// derivedMapping maps each member's one tag value to the member's $ref
// (members without one are left out), or is undefined where two members
// share a value.
function derivedMapping(members, tag, doc) {
  const resolve = (x) => (x?.$ref ? resolve(pointer(doc, x.$ref)) : x);
  const m = {};
  for (const member of members) {
    if (!member.$ref) continue;
    const t = resolve(resolve(member)?.properties?.[tag]);
    const vals = t?.const !== undefined ? [t.const] : t?.enum;
    if (vals?.length !== 1) continue;
    if (m[vals[0]]) return undefined;
    m[vals[0]] = member.$ref;
  }
  return m;
}

function pointer(doc, ref) {
  return ref.slice(2).split("/").reduce((o, k) => o?.[k.replace(/~1/g, "/").replace(/~0/g, "~")], doc);
}

// unions reads the OpenAI spec's remaining oneOf as anyOf: its unions
// overlap (an input message {role, content} is both an EasyInputMessage
// and an InputMessage), and the SDKs generated from it take the first
// member that fits, as anyOf does.
function unions(v) {
  if (Array.isArray(v)) return v.forEach(unions);
  if (!v || typeof v !== "object") return;
  for (const x of Object.values(v)) unions(x);
  if (Array.isArray(v.oneOf)) {
    v.anyOf = v.anyOf ? [{ anyOf: v.anyOf }, { anyOf: v.oneOf }] : v.oneOf;
    delete v.oneOf;
  }
}

// OpenAPI 3.0's nullable adds null to the schema's type; where a schema has
// no type (a $ref, an anyOf) the spec's authors mean the same: null or the
// schema. Ajv takes nullable only beside type, so those become anyOf; a
// nullable enum takes null among its values (a stream's finish_reason is
// null until the last chunk, which both APIs document). (The
// OpenAI spec is 3.1 but still writes nullable in places; read the same.)
function nullables(v) {
  if (Array.isArray(v)) return v.forEach(nullables);
  if (!v || typeof v !== "object") return;
  for (const x of Object.values(v)) nullables(x);
  if (v.nullable === false && v.type === undefined) delete v.nullable;
  if (v.nullable === true && Array.isArray(v.enum) && !v.enum.includes(null)) v.enum = [...v.enum, null];
  if (v.nullable === true && v.type === undefined) {
    const inner = { ...v };
    delete inner.nullable;
    for (const k of Object.keys(v)) delete v[k];
    v.anyOf = [inner, { type: "null" }];
  }
}

// operation finds the spec operation of a method and path (/v1/... with a
// query): the API and the operation object, or undefined.
function operation(method, fullPath) {
  const p = fullPath.split("?")[0].replace(/^\/v1(?=\/)/, "");
  for (const a of apis) {
    if (!a.owns(p)) continue;
    for (const [tpl, item] of Object.entries(a.doc.paths)) {
      const re = new RegExp("^" + tpl.replace(/\{[^}]+\}/g, "[^/]+") + "$");
      if (re.test(p) && item[method.toLowerCase()]) return { api: a, op: item[method.toLowerCase()] };
    }
    return undefined;
  }
}

const schemaRef = (content, type) => content?.[type]?.schema?.$ref;

// sse splits a text/event-stream body into its events ({event, data}); a
// body cut short (an aborted stream) loses its last, partial event.
function sse(body, complete) {
  const parts = body.split(/\r?\n\r?\n/);
  const tail = parts.pop();
  if (complete && tail.trim()) parts.push(tail);
  return parts
    .map((part) => {
      const ev = { event: "", data: [] };
      for (const line of part.split(/\r?\n/)) {
        if (line.startsWith("event:")) ev.event = line.slice(6).trim();
        else if (line.startsWith("data:")) ev.data.push(line.slice(5).replace(/^ /, ""));
      }
      return { event: ev.event, data: ev.data.join("\n") };
    })
    .filter((e) => e.data !== "");
}

// judge validates one body (part: "request", "answer", "error" or "event
// TYPE") against the schema at ref, reading it as KNOWN allows, and returns
// its problems as text.
function judge(api, where, part, ref, body) {
  const rules = KNOWN.filter((k) => k.op === where && (k.part === part || (k.part.endsWith("*") && part.startsWith(k.part.slice(0, -1)))));
  if (rules.length) {
    body = structuredClone(body);
    for (const k of rules) for (const p of k.nulls ?? []) if (dropNull(body, p.split("/").slice(1))) seenKnown.add(`${where} ${part}: ${p} null`);
  }
  const errs = api.check(ref, body).filter((e) => {
    if (e.keyword === "if") return false; // its branch's own errors say what
    if (e.keyword !== "required") return true;
    const p = `${e.instancePath}/${e.params.missingProperty}`;
    const k = rules.find((k) => (k.absent ?? []).some((a) => match(a, p)));
    if (k) seenKnown.add(`${where} ${part}: ${p} absent`);
    return !k;
  });
  return errs.slice(0, 12).map((e) => `${where} ${part} ${e.instancePath || "/"} ${e.message}${e.params?.allowedValues ? " " + JSON.stringify(e.params.allowedValues) : ""}`);
}

const match = (pattern, path) => new RegExp("^" + pattern.replace(/\*/g, "[^/]+") + "$").test(path);

// dropNull removes the value at path (segments, * any key) where it is null.
function dropNull(v, path) {
  if (!v || typeof v !== "object") return false;
  const [k, ...rest] = path;
  const keys = k === "*" ? Object.keys(v) : [k];
  let dropped = false;
  for (const key of keys) {
    if (!(key in v)) continue;
    if (rest.length) dropped = dropNull(v[key], rest) || dropped;
    else if (v[key] === null) {
      delete v[key];
      dropped = true;
    }
  }
  return dropped;
}

// problems lists what one exchange breaks of its spec.
// AGENTS are clients whose requests are not judged, only the answers they
// get: Claude Code sends Messages API features newer than the curated spec
// (adaptive thinking, system-role messages; agents.mjs).
const AGENTS = new Set(["claude-code"]);

export function problems(r) {
  const where = `${r.method} ${r.path.split("?")[0]}`;
  const found = operation(r.method, r.path);
  if (!found) return [`${where}: no such operation in the specs`];
  const { api, op } = found;
  const out = [];
  const json = (text, what) => {
    try {
      return JSON.parse(text);
    } catch {
      out.push(`${where} ${what}: not JSON: ${text.slice(0, 80)}`);
    }
  };
  let req;
  if (r.req && !AGENTS.has(r.client)) {
    const ref = schemaRef(op.requestBody?.content, "application/json");
    req = json(r.req, "request");
    if (ref && req !== undefined) out.push(...judge(api, where, "request", ref, req));
  }
  if (r.status === undefined) return out; // no answer (client gone first)
  if (r.status >= 400) {
    const body = json(r.res, `${r.status} answer`);
    if (body !== undefined) out.push(...judge(api, where, "error", api.error, body));
    return out;
  }
  const content = op.responses?.[String(r.status)]?.content;
  if (r.resType.startsWith("text/event-stream")) {
    const ref = schemaRef(content, "text/event-stream") || api.events;
    if (!ref) return [...out, `${where}: the spec has no event stream here`];
    for (const ev of sse(r.res, r.complete)) {
      if (ev.data === "[DONE]") continue;
      const body = json(ev.data, "event");
      if (body === undefined) continue;
      out.push(...judge(api, where, `event ${body?.type ?? ""}`.trim(), ref, body));
      if (api.events && ev.event && ev.event !== body.type) out.push(`${where} event: named ${ev.event}, its data is ${body.type}`);
    }
    return out;
  }
  const ref = schemaRef(content, "application/json");
  if (!ref) return [...out, `${where}: the spec has no ${r.status} answer of type ${r.resType}`];
  if (!r.complete) return out;
  let body = json(r.res, `${r.status} answer`);
  if (body === undefined) return out;
  // Asked for base64, an embedding is a base64 string (the API reference's
  // encoding_format); the published schema describes only the float list.
  if (where === "POST /v1/embeddings" && req?.encoding_format === "base64") {
    body = structuredClone(body);
    for (const d of body.data ?? []) {
      if (typeof d.embedding === "string") d.embedding = [...new Float32Array(Uint8Array.from(Buffer.from(d.embedding, "base64")).buffer)];
    }
  }
  out.push(...judge(api, where, "answer", ref, body));
  return out;
}

// selfCheck breaks one field's type in a recorded answer of each API and
// returns what the validator failed to notice.
function selfCheck(recs) {
  const missed = [];
  const cases = [
    ["POST /v1/chat/completions", (b) => (b.created = String(b.created))],
    ["POST /v1/messages", (b) => (b.usage.output_tokens = String(b.usage.output_tokens))],
  ];
  for (const [what, breakIt] of cases) {
    const r = recs.find((r) => `${r.method} ${r.path.split("?")[0]}` === what && r.status === 200 && r.resType.startsWith("application/json") && r.complete);
    if (!r) {
      missed.push(`${what}: no recorded answer to break`);
      continue;
    }
    if (problems(r).length) continue; // already failing: reported below
    const b = JSON.parse(r.res);
    breakIt(b);
    if (!problems({ ...r, res: JSON.stringify(b) }).length) missed.push(`${what}: an answer with a field of the wrong type passed`);
  }
  return missed;
}

const [recordsFile, ...clients] = process.argv.slice(2);
const recs = readFileSync(recordsFile, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
const missed = selfCheck(recs);
for (const m of missed) console.error(`schema.mjs self-check: ${m}`);
for (const client of clients) {
  const mine = recs.filter((r) => r.client === client);
  const all = [...new Set(mine.flatMap(problems))];
  let cell = { client, feature: "schema", pass: true };
  if (!mine.length) cell = { ...cell, pass: false, error: "no exchanges recorded" };
  else if (all.length) cell = { ...cell, pass: false, error: `${all.length} problem(s) in ${mine.length} exchanges: ${all.slice(0, 4).join(" | ")}` };
  else if (missed.length) cell = { ...cell, pass: false, error: `the validator's self-check failed: ${missed.join("; ")}` };
  console.log(JSON.stringify(cell));
}
if (seenKnown.size) console.error(`schema.mjs: known differences from the specs (vLLM's bodies, see KNOWN in schema.mjs) seen: ${seenKnown.size} kinds`);
if (process.env.SCHEMA_KNOWN === "1") for (const k of [...seenKnown].sort()) console.error(`  ${k}`);
