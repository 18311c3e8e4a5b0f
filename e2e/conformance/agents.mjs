// A coding agent: Claude Code (@anthropic-ai/claude-code, its npm release),
// set up as the README's Clients section shows — ANTHROPIC_BASE_URL at the
// gateway (no /v1), the key as ANTHROPIC_API_KEY, every model tier mapped to
// the served model, its output cap within the model's context — and run
// headless (`claude -p`, Claude Code's print mode) in a scratch HOME. One
// cell, plain: the agent's answer comes back (it streams every turn), the
// turn is billed to the key's tenant. specproxy.mjs records its exchanges
// for the schema column, which judges the answers only: Claude Code sends
// Messages API features newer than the curated spec (adaptive thinking,
// system-role messages), so its requests are its own business.
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { env, row, expect, newKey, usage } from "./kit.mjs";

const claude = new URL("./node_modules/.bin/claude", import.meta.url).pathname;

function run(args, extraEnv) {
  return new Promise((resolve, reject) => {
    execFile(claude, args, { env: { ...process.env, ...extraEnv }, timeout: 120000, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      if (err && !stdout) return reject(new Error(`claude ${args.join(" ")}: ${err.message} ${stderr.slice(-500)}`));
      resolve(stdout);
    }).stdin?.end();
  });
}

await row("claude-code", {
  plain: async () => {
    const tenant = `claude-code-${process.pid}`;
    const key = newKey(tenant);
    const home = mkdtempSync(join(tmpdir(), "tg-claude-"));
    try {
      const out = await run(["-p", "Say hello", "--output-format", "json"], {
        HOME: home,
        ANTHROPIC_BASE_URL: env.base,
        ANTHROPIC_API_KEY: key,
        ANTHROPIC_MODEL: env.model,
        ANTHROPIC_DEFAULT_OPUS_MODEL: env.model,
        ANTHROPIC_DEFAULT_SONNET_MODEL: env.model,
        ANTHROPIC_DEFAULT_HAIKU_MODEL: env.model,
        CLAUDE_CODE_MAX_OUTPUT_TOKENS: "4096",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
      });
      const r = JSON.parse(out);
      expect(r.type === "result" && r.is_error === false && typeof r.result === "string" && r.result.length > 0, `claude -p: ${out.slice(0, 400)}`);
      const u = usage(tenant);
      expect(u.requests > 0 && u.completion_tokens > 0 && u.completion_tokens >= r.usage.output_tokens, `billed ${JSON.stringify(u)}, claude counted ${JSON.stringify(r.usage)}`);
    } finally {
      rmSync(home, { recursive: true, force: true });
    }
  },
});
