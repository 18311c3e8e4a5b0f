// The Messages API's clients: @anthropic-ai/sdk on its 0.x and 1.x lines
// (npm aliases anthropic-sdk-0 and anthropic-sdk-1), @ai-sdk/anthropic.
// They send the key as x-api-key and read errors in Anthropic's shape.
import Anthropic0 from "anthropic-sdk-0";
import Anthropic1 from "anthropic-sdk-1";
import { createAnthropic } from "@ai-sdk/anthropic";
import { generateText, streamText, generateObject, tool, jsonSchema, APICallError } from "ai";
import { z } from "zod";
import {
  env, row, expect, expectError, checkAbort, checkRetried, recordingFetch, newKey, ABORT_CAP,
  weatherSchema, personSchema, isPerson,
} from "./kit.mjs";

const concKey = newKey(`conc-anthropic-${process.pid}`, "--max-concurrency", "1");
const messages = [{ role: "user", content: "What is the weather in Paris?" }];

for (const [name, Anthropic] of [
  ["@anthropic-ai/sdk 0.x", Anthropic0],
  ["@anthropic-ai/sdk 1.x", Anthropic1],
]) {
  const mk = (o = {}) => new Anthropic({ baseURL: env.base, apiKey: env.key, ...o });
  const c = mk();
  await row(name, {
    plain: async () => {
      const m = await c.messages.create({ model: env.model, max_tokens: 16, messages });
      expect(m.content[0]?.type === "text" && m.usage.output_tokens > 0, JSON.stringify(m));
      const n = await c.messages.countTokens({ model: env.model, messages });
      expect(n.input_tokens === m.usage.input_tokens, `count_tokens ${n.input_tokens}, messages billed ${m.usage.input_tokens}`);
    },
    stream: async () => {
      const s = c.messages.stream({ model: env.model, max_tokens: 16, messages });
      let text = "";
      s.on("text", (t) => (text += t));
      const m = await s.finalMessage();
      expect(text.length > 0 && m.usage.output_tokens > 0, `stream ${text}`);
    },
    tools: async () => {
      const m = await c.messages.create({ model: env.model, max_tokens: 256, messages,
        tools: [{ name: "get_weather", description: "weather", input_schema: weatherSchema }], tool_choice: { type: "any" } });
      const t = m.content.find((b) => b.type === "tool_use");
      expect(t?.name === "get_weather" && typeof t.input.city === "string" && m.stop_reason === "tool_use", JSON.stringify(m.content));
    },
    // Structured output the way Anthropic documents it for any model: a
    // forced tool whose input is the object.
    structured: async () => {
      const m = await c.messages.create({ model: env.model, max_tokens: 256, messages: [{ role: "user", content: "A person" }],
        tools: [{ name: "person", description: "a person", input_schema: personSchema }], tool_choice: { type: "tool", name: "person" } });
      const t = m.content.find((b) => b.type === "tool_use");
      expect(isPerson(t?.input), JSON.stringify(m.content));
    },
    abort: () => checkAbort(name.replace(/\W+/g, "-"), async (key, signal, piece) => {
      const s = await mk({ apiKey: key }).messages.create({ model: env.model, max_tokens: ABORT_CAP, messages, stream: true }, { signal });
      for await (const ev of s) if (ev.type === "content_block_delta") piece();
    }),
    retry_429: async () => {
      const rec = recordingFetch();
      const k = mk({ apiKey: concKey, fetch: rec });
      await checkRetried(concKey, rec, () => k.messages.create({ model: env.model, max_tokens: 4, messages }));
    },
    wrong_model: () => expectError(() => c.messages.create({ model: "no-such-model", max_tokens: 4, messages }),
      (e) => e instanceof Anthropic.NotFoundError && e.error?.error?.type === "not_found_error" && /no-such-model/.test(e.message)),
    wrong_key: () => expectError(() => mk({ apiKey: "tg-wrong", maxRetries: 0 }).messages.create({ model: env.model, max_tokens: 4, messages }),
      (e) => e instanceof Anthropic.AuthenticationError && e.error?.error?.type === "authentication_error"),
  });
}

// @ai-sdk/anthropic
{
  const name = "@ai-sdk/anthropic";
  const p = createAnthropic({ baseURL: `${env.base}/v1`, apiKey: env.key });
  const model = p(env.model);
  const tools = { get_weather: tool({ description: "weather", inputSchema: jsonSchema(weatherSchema) }) };
  await row(name, {
    plain: async () => {
      const r = await generateText({ model, prompt: "What is the weather in Paris?", maxOutputTokens: 16 });
      expect(r.text.length > 0 && r.usage.outputTokens > 0, `no answer ${JSON.stringify(r.usage)}`);
    },
    stream: async () => {
      const r = streamText({ model, prompt: "What is the weather in Paris?", maxOutputTokens: 16 });
      let text = "";
      for await (const t of r.textStream) text += t;
      expect(text.length > 0 && (await r.usage).outputTokens > 0, "no stream");
    },
    tools: async () => {
      const r = await generateText({ model, prompt: "What is the weather in Paris?", tools, toolChoice: "required" });
      expect(r.toolCalls[0]?.toolName === "get_weather" && typeof r.toolCalls[0].input.city === "string", `no tool call ${JSON.stringify(r.content)}`);
    },
    structured: async () => {
      const r = await generateObject({ model, schema: z.object({ name: z.string(), age: z.number().int() }), prompt: "A person" });
      expect(isPerson(r.object), JSON.stringify(r.object));
    },
    abort: () => checkAbort("ai-sdk-anthropic", async (key, signal, piece) => {
      const m = createAnthropic({ baseURL: `${env.base}/v1`, apiKey: key })(env.model);
      const r = streamText({ model: m, prompt: "Write a long story", maxOutputTokens: ABORT_CAP, abortSignal: signal });
      for await (const t of r.textStream) if (t) piece();
    }),
    retry_429: async () => {
      const rec = recordingFetch();
      const m = createAnthropic({ baseURL: `${env.base}/v1`, apiKey: concKey, fetch: rec })(env.model);
      await checkRetried(concKey, rec, () => generateText({ model: m, prompt: "hi", maxOutputTokens: 4 }));
    },
    wrong_model: () => expectError(() => generateText({ model: p("no-such-model"), prompt: "hi", maxRetries: 0 }),
      (e) => APICallError.isInstance(e) && e.statusCode === 404 && /no-such-model/.test(e.message)),
    wrong_key: () => expectError(() => generateText({ model: createAnthropic({ baseURL: `${env.base}/v1`, apiKey: "tg-wrong" })(env.model), prompt: "hi", maxRetries: 0 }),
      (e) => APICallError.isInstance(e) && e.statusCode === 401 && /invalid API key/.test(e.message)),
  });
}
