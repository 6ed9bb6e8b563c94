// A product backend on Node: the official openai SDK with only baseURL and apiKey changed.
// Env: BASE_URL (e.g. https://127.0.0.1:8000/v1), API_KEY (a backend key), MODEL; NODE_EXTRA_CA_CERTS
// trusts the stack's development CA. Prints one JSON object for the Python test to check.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: process.env.API_KEY });
const model = process.env.MODEL;
const messages = [{ role: "user", content: "Say hello from Node." }];

const { data: chat, response } = await client.chat.completions
  .create({ model, messages, n: 2, max_tokens: 8, temperature: 0.9, logprobs: true, top_logprobs: 1, user: "node-user" })
  .withResponse();

const stream = await client.chat.completions.create({
  model, messages, max_tokens: 6, stream: true, stream_options: { include_usage: true },
});
let streamed = "";
let streamUsage = null;
let streamIds = null;
for await (const chunk of stream) {
  if (chunk.apprentice) streamIds = chunk.apprentice.interaction_ids;
  for (const c of chunk.choices) streamed += c.delta?.content ?? "";
  if (chunk.usage) streamUsage = chunk.usage;
}

const models = [];
for await (const m of client.models.list()) models.push(m.id);

let notFound = null;
try {
  await client.chat.completions.create({ model: "no-such-model", messages, max_tokens: 2 });
} catch (e) {
  notFound = { status: e.status, code: e.code ?? e.error?.code };
}

console.log(JSON.stringify({
  id: chat.id,
  choices: chat.choices.map((c) => ({ text: c.message.content, finish: c.finish_reason, logprobs: c.logprobs.content.map((t) => t.logprob) })),
  usage: chat.usage,
  apprentice: chat.apprentice,
  headerIds: response.headers.get("x-apprentice-interaction-ids"),
  headerVersion: response.headers.get("x-apprentice-policy-version"),
  streamed, streamUsage, streamIds, models, notFound,
}));
