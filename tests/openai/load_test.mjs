// N concurrent streaming chat completions through the official OpenAI SDK,
// all started at once: every one must complete with the exact usage
// (ignore_eos makes the completion exactly max_tokens long). Run by
// tests/integration/service_openai_sdk_test.cc, which watches the router's
// thread count and peak RSS meanwhile.
//   node load_test.mjs --base_url=URL --model=M --n=1000 --max_tokens=8
// The expected prompt_tokens of each of the 10 conversations come from the
// server's POST /tokenize (vLLM's shape) with the same messages.
import OpenAI from "openai";

const args = Object.fromEntries(
  process.argv.slice(2).map((a) => a.replace(/^--/, "").split(/=(.*)/s).slice(0, 2)));
const n = Number(args.n), maxTokens = Number(args.max_tokens);
const messagesOf = (i) => [{ role: "user", content: `Tell me story number ${i % 10}.` }];
const promptTokens = [];
for (let k = 0; k < 10; k++) {
  const r = await fetch(args.base_url.replace(/\/v1\/?$/, "") + "/tokenize", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model: args.model, messages: messagesOf(k), add_generation_prompt: true }),
  });
  promptTokens.push((await r.json()).count);
}
const client = new OpenAI({ baseURL: args.base_url, apiKey: "unused", maxRetries: 0,
                            timeout: 300_000 });
const start = Date.now();
let firstTokens = 0;
const results = await Promise.allSettled(Array.from({ length: n }, async (_, i) => {
  const stream = await client.chat.completions.create({
    model: args.model, max_tokens: maxTokens, temperature: 0, ignore_eos: true,
    stream: true, stream_options: { include_usage: true },
    messages: messagesOf(i),
  });
  let usage = null, text = "", sawToken = false;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const delta = chunk.choices[0]?.delta?.content ?? "";
    if (delta && !sawToken) { sawToken = true; firstTokens++; }
    text += delta;
  }
  return { usage, text, i };
}));
const seconds = (Date.now() - start) / 1000;
const failed = results.filter((r) => r.status === "rejected");
const badUsage = results.filter((r) => r.status === "fulfilled" &&
  !(r.value.usage && r.value.usage.completion_tokens === maxTokens &&
    r.value.usage.prompt_tokens === promptTokens[r.value.i % 10]));
console.log(`load_test: ${n} concurrent streams, ${n - failed.length} completed, ` +
            `${failed.length} failed, ${badUsage.length} with wrong usage, ${seconds.toFixed(1)} s`);
for (const f of failed.slice(0, 5)) console.log(`  failure: ${f.reason?.status} ${f.reason?.message}`);
for (const b of badUsage.slice(0, 5)) console.log(`  usage: ${JSON.stringify(b.value.usage)}`);
process.exit(failed.length === 0 && badUsage.length === 0 ? 0 : 1);
