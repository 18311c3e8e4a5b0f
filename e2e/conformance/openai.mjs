// The OpenAI-API clients: openai (npm), @ai-sdk/openai (chat, and its
// default provider, which calls the Responses API), @langchain/openai.
import OpenAI from "openai";
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, streamText, generateObject, embed, tool, jsonSchema, APICallError } from "ai";
import { ChatOpenAI, OpenAIEmbeddings } from "@langchain/openai";
import { z } from "zod";
import {
  env, row, expect, expectError, checkAbort, checkRetried, recordingFetch, newKey, ABORT_CAP,
  weatherSchema, personSchema, isPerson,
} from "./kit.mjs";

const v1 = `${env.base}/v1`;
const concKey = newKey(`conc-openai-${process.pid}`, "--max-concurrency", "1");
const user = [{ role: "user", content: "What is the weather in Paris?" }];
const weatherTool = { type: "function", function: { name: "get_weather", description: "weather", parameters: weatherSchema } };

// openai (npm)
{
  const c = new OpenAI({ baseURL: v1, apiKey: env.key });
  await row("openai (npm)", {
    plain: async () => {
      const r = await c.chat.completions.create({ model: env.model, messages: user, max_tokens: 16 });
      expect(r.choices[0].message.content.length > 0 && r.usage.completion_tokens > 0, "no answer");
    },
    stream: async () => {
      const s = await c.chat.completions.create({ model: env.model, messages: user, max_tokens: 16, stream: true, stream_options: { include_usage: true } });
      let text = "", usage;
      for await (const ch of s) {
        text += ch.choices[0]?.delta?.content ?? "";
        usage = ch.usage ?? usage;
      }
      expect(text.length > 0 && usage?.completion_tokens > 0, `stream ${text} ${JSON.stringify(usage)}`);
    },
    tools: async () => {
      const r = await c.chat.completions.create({ model: env.model, messages: user, tools: [weatherTool], tool_choice: "required" });
      const call = r.choices[0].message.tool_calls?.[0];
      expect(call?.function.name === "get_weather" && typeof JSON.parse(call.function.arguments).city === "string", "no tool call");
    },
    structured: async () => {
      const r = await c.chat.completions.create({ model: env.model, messages: user,
        response_format: { type: "json_schema", json_schema: { name: "person", schema: personSchema, strict: true } } });
      expect(isPerson(JSON.parse(r.choices[0].message.content)), r.choices[0].message.content);
    },
    embeddings: async () => {
      const r = await c.embeddings.create({ model: env.model, input: "hello" });
      expect(r.data[0].embedding.length > 0 && r.usage.prompt_tokens > 0, "no embedding");
    },
    abort: () => checkAbort("openai", async (key, signal, piece) => {
      const k = new OpenAI({ baseURL: v1, apiKey: key });
      const s = await k.chat.completions.create({ model: env.model, messages: user, max_tokens: ABORT_CAP, stream: true }, { signal });
      for await (const ch of s) if (ch.choices[0]?.delta?.content) piece();
    }),
    retry_429: async () => {
      const rec = recordingFetch();
      const k = new OpenAI({ baseURL: v1, apiKey: concKey, fetch: rec });
      await checkRetried(concKey, rec, () => k.chat.completions.create({ model: env.model, messages: user, max_tokens: 4 }));
    },
    wrong_model: () => expectError(() => c.chat.completions.create({ model: "no-such-model", messages: user }),
      (e) => e instanceof OpenAI.NotFoundError && /no-such-model/.test(e.message)),
    wrong_key: () => expectError(() => new OpenAI({ baseURL: v1, apiKey: "tg-wrong", maxRetries: 0 }).chat.completions.create({ model: env.model, messages: user }),
      (e) => e instanceof OpenAI.AuthenticationError && e.code === "invalid_api_key"),
  });
}

// @ai-sdk/openai: openai.chat(model) and openai(model), the Responses API.
for (const [name, pick] of [
  ["@ai-sdk/openai chat", (p) => p.chat(env.model)],
  ["@ai-sdk/openai responses", (p) => p(env.model)],
]) {
  const p = createOpenAI({ baseURL: v1, apiKey: env.key });
  const model = pick(p);
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
    embeddings: name.endsWith("chat") ? async () => {
      const r = await embed({ model: p.embedding(env.model), value: "hello" });
      expect(r.embedding.length > 0, "no embedding");
    } : undefined,
    abort: () => checkAbort(name.replace(/\W+/g, "-"), async (key, signal, piece) => {
      const m = pick(createOpenAI({ baseURL: v1, apiKey: key }));
      const r = streamText({ model: m, prompt: "Write a long story", maxOutputTokens: ABORT_CAP, abortSignal: signal });
      for await (const t of r.textStream) if (t) piece();
    }),
    retry_429: async () => {
      const rec = recordingFetch();
      const m = pick(createOpenAI({ baseURL: v1, apiKey: concKey, fetch: rec }));
      // 16: the least max_output_tokens the Responses API takes (the schema column checks requests too).
      await checkRetried(concKey, rec, () => generateText({ model: m, prompt: "hi", maxOutputTokens: 16 }));
    },
    wrong_model: () => expectError(() => generateText({ model: name.endsWith("chat") ? p.chat("no-such-model") : p("no-such-model"), prompt: "hi", maxRetries: 0 }),
      (e) => APICallError.isInstance(e) && e.statusCode === 404 && /no-such-model/.test(e.message)),
    wrong_key: () => expectError(() => generateText({ model: pick(createOpenAI({ baseURL: v1, apiKey: "tg-wrong" })), prompt: "hi", maxRetries: 0 }),
      (e) => APICallError.isInstance(e) && e.statusCode === 401 && /invalid API key/.test(e.message)),
  });
}

// @langchain/openai
{
  const mk = (o = {}) => new ChatOpenAI({ model: env.model, apiKey: env.key, configuration: { baseURL: v1 }, maxTokens: 16, ...o });
  const chat = mk();
  await row("@langchain/openai", {
    plain: async () => {
      const r = await chat.invoke("What is the weather in Paris?");
      expect(typeof r.content === "string" && r.content.length > 0 && r.usage_metadata?.output_tokens > 0, "no answer");
    },
    stream: async () => {
      let text = "";
      for await (const ch of await chat.stream("What is the weather in Paris?")) text += ch.content;
      expect(text.length > 0, "no stream");
    },
    tools: async () => {
      const r = await mk({ maxTokens: 256 }).bindTools([weatherTool], { tool_choice: "required" }).invoke("What is the weather in Paris?");
      expect(r.tool_calls?.[0]?.name === "get_weather" && typeof r.tool_calls[0].args.city === "string", `no tool call ${JSON.stringify(r.tool_calls)}`);
    },
    structured: async () => {
      const r = await mk({ maxTokens: 256 }).withStructuredOutput(z.object({ name: z.string(), age: z.number().int() }), { name: "person", method: "jsonSchema" }).invoke("A person");
      expect(isPerson(r), JSON.stringify(r));
    },
    embeddings: async () => {
      const e = new OpenAIEmbeddings({ model: env.model, apiKey: env.key, configuration: { baseURL: v1 } });
      const v = await e.embedQuery("hello");
      expect(v.length > 0, "no embedding");
    },
    abort: () => checkAbort("langchain", async (key, signal, piece) => {
      const m = new ChatOpenAI({ model: env.model, apiKey: key, configuration: { baseURL: v1 }, maxTokens: ABORT_CAP });
      for await (const ch of await m.stream("Write a long story", { signal })) if (ch.content) piece();
    }),
    retry_429: async () => {
      const rec = recordingFetch();
      const m = new ChatOpenAI({ model: env.model, apiKey: concKey, configuration: { baseURL: v1, fetch: rec }, maxTokens: 4 });
      await checkRetried(concKey, rec, () => m.invoke("hi"));
    },
    wrong_model: () => expectError(() => mk({ model: "no-such-model", maxRetries: 0 }).invoke("hi"),
      (e) => (e.status === 404 || e.lc_error_code === "MODEL_NOT_FOUND") && /no-such-model/.test(e.message)),
    wrong_key: () => expectError(() => mk({ apiKey: "tg-wrong", maxRetries: 0 }).invoke("hi"),
      (e) => (e.status === 401 || e.lc_error_code === "MODEL_AUTHENTICATION") && /invalid API key/.test(e.message)),
  });
}
