// trim-openai.mjs reduces OpenAI's published openapi.json to the operations
// tailgate serves and every component they reach through $ref, so the kit
// checks in ~10 % of a 3.4 MB file. Reproduce openai.json with
//
//   git -C openai-openapi show <commit>:openapi.json > /tmp/openapi.json
//   node trim-openai.mjs /tmp/openapi.json > openai.json
//
// (the commit is in SOURCE.md). Nothing is rewritten: the paths kept keep
// only the methods listed below, and components.* keep only what is reached.
import { readFileSync } from "node:fs";

const keep = {
  "/chat/completions": ["post"],
  "/completions": ["post"],
  "/embeddings": ["post"],
  "/responses": ["post"],
  "/models": ["get"],
  "/models/{model}": ["get"],
};
// Reached by the kit's validator directly, not through a path: the error body.
const roots = ["#/components/schemas/ErrorResponse"];

const spec = JSON.parse(readFileSync(process.argv[2], "utf8"));
const out = { ...spec, paths: {}, components: {} };
delete out.webhooks;
delete out["x-oaiMeta"];
const todo = [...roots];
for (const [p, methods] of Object.entries(keep)) {
  const item = spec.paths[p];
  if (!item) throw new Error(`spec has no path ${p}`);
  out.paths[p] = {};
  for (const m of methods) {
    if (!item[m]) throw new Error(`spec has no ${m} ${p}`);
    out.paths[p][m] = item[m];
    collect(item[m]);
  }
  if (item.parameters) out.paths[p].parameters = item.parameters;
}
const seen = new Set();
while (todo.length) {
  const ref = todo.pop();
  if (seen.has(ref)) continue;
  seen.add(ref);
  const [, kind, name] = ref.match(/^#\/components\/([^/]+)\/(.+)$/) || [];
  if (!kind) throw new Error(`unexpected $ref ${ref}`);
  const v = spec.components[kind]?.[name];
  if (v === undefined) throw new Error(`dangling $ref ${ref}`);
  (out.components[kind] ??= {})[name] = v;
  collect(v);
}
for (const kind of Object.keys(out.components)) {
  out.components[kind] = Object.fromEntries(Object.entries(out.components[kind]).sort(([a], [b]) => a.localeCompare(b)));
}
process.stdout.write(JSON.stringify(out, null, 1) + "\n");

function collect(v) {
  if (Array.isArray(v)) return v.forEach(collect);
  if (v && typeof v === "object") {
    if (typeof v.$ref === "string") todo.push(v.$ref);
    for (const [k, x] of Object.entries(v)) if (!k.startsWith("x-")) collect(x);
  }
}
