// The official OpenAI SDK (npm `openai`, pinned in package.json) against
// pdserve's HTTP API. Run by tests/integration/service_openai_sdk_test.cc,
// which starts the cluster and computes the expected outputs with gRPC and
// `pdserve complete`:
//   node sdk_test.mjs --base_url=http://127.0.0.1:P/v1 --expect=FILE.json
//        [--overload_url=http://127.0.0.1:Q/v1]
// Prints one line per check; exits 1 when any check fails.
import fs from "node:fs";
import OpenAI from "openai";

const args = Object.fromEntries(
  process.argv.slice(2).map((a) => a.replace(/^--/, "").split(/=(.*)/s).slice(0, 2)));
const expect = JSON.parse(fs.readFileSync(args.expect, "utf8"));
const client = new OpenAI({ baseURL: args.base_url, apiKey: "unused", maxRetries: 0 });
const model = expect.model;
let failures = 0;

function check(name, ok, detail = "") {
  console.log(`${ok ? "ok  " : "FAIL"} ${name}${detail ? ": " + detail : ""}`);
  if (!ok) failures++;
}
const idsOf = (tokens) => tokens.map((t) => Number(String(t).replace("token_id:", "")));
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

// 1. A streamed chat completion, greedy, with usage: the ids are what
//    `pdserve complete` gives on the rendered prompt.
{
  const stream = await client.chat.completions.create({
    model, messages: expect.chat.messages, max_tokens: expect.chat.max_tokens,
    temperature: 0, stream: true, stream_options: { include_usage: true },
    logprobs: true, return_tokens_as_token_ids: true,
  });
  let text = "", ids = [], usage = null, role = null, finish = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta?.role) role = c.delta.role;
      text += c.delta?.content ?? "";
      ids.push(...idsOf((c.logprobs?.content ?? []).map((e) => e.token)));
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  check("streamed chat: role assistant", role === "assistant", role);
  check("streamed chat: greedy ids equal pdserve complete on the rendered prompt",
        same(ids, expect.chat.output_ids), `${JSON.stringify(ids)} vs ${JSON.stringify(expect.chat.output_ids)}`);
  check("streamed chat: text", text === expect.chat.text, JSON.stringify(text));
  check("streamed chat: finish_reason", finish === expect.chat.finish_reason, finish);
  check("streamed chat: include_usage gives usage",
        usage && usage.prompt_tokens === expect.chat.prompt_tokens &&
          usage.completion_tokens === ids.length &&
          usage.total_tokens === usage.prompt_tokens + usage.completion_tokens,
        JSON.stringify(usage));
}

// 1b. Logprob tokens are read in context: they concatenate to the content,
//     their bytes to its UTF-8, and greedy's top alternative reads as the
//     chosen token.
{
  const r = await client.chat.completions.create({
    model, messages: expect.chat.messages, max_tokens: 16, temperature: 0,
    logprobs: true, top_logprobs: 2, ignore_eos: true,
  });
  const c = r.choices[0];
  const entries = c.logprobs.content;
  const joined = entries.map((e) => e.token).join("");
  check("chat logprobs: tokens concatenate to the content",
        entries.length === 16 && joined === c.message.content,
        `${JSON.stringify(joined)} vs ${JSON.stringify(c.message.content)}`);
  check("chat logprobs: bytes concatenate to the content's UTF-8",
        Buffer.from(entries.flatMap((e) => e.bytes)).equals(Buffer.from(c.message.content, "utf8")));
  check("chat logprobs: greedy's top alternative is the chosen token, read alike",
        entries.every((e) => e.top_logprobs.length === 2 && e.top_logprobs[0].token === e.token &&
                      e.top_logprobs[0].logprob === e.logprob),
        JSON.stringify(entries.slice(0, 3)));
}

// 2. A non-streamed completion of the reference prompt.
{
  const r = await client.completions.create({
    model, prompt: expect.completion.prompt_ids, max_tokens: expect.completion.max_tokens,
    temperature: 0, logprobs: 0, return_tokens_as_token_ids: true,
  });
  check("completion: object", r.object === "text_completion" && r.id.startsWith("cmpl-"), r.id);
  check("completion: greedy ids equal the reference",
        same(idsOf(r.choices[0].logprobs.tokens), expect.completion.output_ids));
  check("completion: usage", r.usage.completion_tokens === expect.completion.output_ids.length &&
        r.usage.prompt_tokens === expect.completion.prompt_ids.length, JSON.stringify(r.usage));
}

// 2b. logit_bias as the SDK sends it: -100 on greedy's first token bans it.
{
  const first = expect.completion.output_ids[0];
  const r = await client.completions.create({
    model, prompt: expect.completion.prompt_ids, max_tokens: 6,
    temperature: 0, logprobs: 0, return_tokens_as_token_ids: true,
    logit_bias: { [String(first)]: -100 },
  });
  const ids = idsOf(r.choices[0].logprobs.tokens);
  check("logit_bias -100 bans greedy's token", ids.length === 6 && !ids.includes(first),
        `${JSON.stringify(ids)} (banned ${first})`);
}

// 2c. echo with logprobs, as lm-eval-harness scores a continuation: the
//     prompt's tokens come first, the first with null, each other scored.
{
  const prompt = expect.completion.prompt_ids;
  const r = await client.completions.create({
    model, prompt, max_tokens: 1, temperature: 0, echo: true, logprobs: 1,
    return_tokens_as_token_ids: true,
  });
  const lp = r.choices[0].logprobs;
  check("echo + logprobs: prompt then output tokens",
        same(idsOf(lp.tokens), [...prompt, expect.completion.output_ids[0]]),
        JSON.stringify(lp.tokens));
  check("echo + logprobs: the first prompt token has none",
        lp.token_logprobs[0] === null && lp.top_logprobs[0] === null);
  check("echo + logprobs: every later token scored",
        lp.token_logprobs.slice(1).every((x) => typeof x === "number" && x <= 0) &&
        lp.top_logprobs.slice(1).every((t) => t !== null && Object.keys(t).length === 1),
        JSON.stringify(lp.token_logprobs));
}

// 2d. vLLM's prompt_logprobs on chat: on the response, null then one entry
//     per prompt token, each with the token itself (rank, logprob, text)
//     and its most likely alternative.
{
  const r = await client.chat.completions.create({
    model, messages: expect.chat.messages, max_tokens: 1, temperature: 0, prompt_logprobs: 1,
  });
  const pl = r.prompt_logprobs;
  check("chat prompt_logprobs: null, then one entry per prompt token",
        Array.isArray(pl) && pl.length === expect.chat.prompt_tokens && pl[0] === null,
        JSON.stringify(pl?.slice(0, 2)));
  check("chat prompt_logprobs: each the token and its best alternative",
        Array.isArray(pl) && pl.slice(1).every((e) => {
          const v = Object.values(e);
          return v.length >= 1 && v.length <= 2 && v.some((x) => x.rank === 1) &&
                 v.every((x) => Number.isInteger(x.rank) && x.logprob <= 0 &&
                                typeof x.decoded_token === "string");
        }), JSON.stringify(pl?.slice(1, 3)));
}

// 3. Seeded sampling equals gRPC with the same seed.
{
  const r = await client.completions.create({
    model, prompt: expect.seeded.prompt, max_tokens: expect.seeded.max_tokens,
    temperature: expect.seeded.temperature, top_p: expect.seeded.top_p, seed: expect.seeded.seed,
  });
  check("seeded completion equals gRPC with the same seed", r.choices[0].text === expect.seeded.text,
        `${JSON.stringify(r.choices[0].text)} vs ${JSON.stringify(expect.seeded.text)}`);
}

// 4. n = 3 gives three choices.
{
  const r = await client.chat.completions.create({
    model, messages: expect.chat.messages, max_tokens: 8, n: 3, temperature: 1.0, seed: 5,
  });
  check("n=3 gives 3 choices", r.choices.length === 3 &&
        r.choices.every((c, i) => c.index === i && c.message.role === "assistant"),
        `${r.choices.length} choices`);
  check("n=3 usage counts the prompt once", r.usage.prompt_tokens === expect.chat.prompt_tokens,
        JSON.stringify(r.usage));
}

// 4a. A completion without max_tokens gets OpenAI's default of 16 tokens.
{
  const r = await client.completions.create({ model, prompt: "Tom", ignore_eos: true });
  check("completions without max_tokens generate 16 tokens (OpenAI's default)",
        r.usage.completion_tokens === 16 && r.choices[0].finish_reason === "length",
        JSON.stringify(r.usage));
}

// 4b. models.list and models.retrieve.
{
  const list = await client.models.list();
  check("models.list names the served model", list.data.length === 1 && list.data[0].id === model,
        JSON.stringify(list.data.map((m) => m.id)));
  const one = await client.models.retrieve(model);
  check("models.retrieve returns it", one.id === model && one.object === "model", JSON.stringify(one));
}

// 5. Errors surface as the SDK's error classes, with pdserve's messages.
async function expectError(name, fn, status, part) {
  try {
    await fn();
    check(name, false, "no error");
  } catch (e) {
    check(name, e instanceof OpenAI.APIError && e.status === status && String(e.message).includes(part),
          `${e.constructor.name} ${e.status}: ${e.message}`);
    return e;
  }
}
await expectError("unknown model -> NotFoundError 404",
  () => client.chat.completions.create({ model: "no-such-model", messages: expect.chat.messages }),
  404, "no-such-model");
await expectError("models.retrieve of another model -> NotFoundError 404",
  () => client.models.retrieve("no-such-model"), 404, "no-such-model");
const badTemperature = await expectError("temperature -1 -> BadRequestError 400",
  () => client.completions.create({ model, prompt: "Hi", temperature: -1 }),
  400, "temperature must be >= 0");
check("the error's param names the field", badTemperature?.param === "temperature",
      String(badTemperature?.param));
// Said as OpenAI and vLLM say it, which LiteLLM and LangChain recognise.
const tooLong = await expectError("over-long prompt -> BadRequestError 400",
  () => client.completions.create({ model, prompt: "a ".repeat(2000), max_tokens: 10 }),
  400, "This model's maximum context length is 512 tokens.");
const asked = /However, you requested (\d+) tokens \((\d+) in the prompt, 10 in the completion\)\. Please reduce the length of the prompt or completion\.$/
  .exec(String(tooLong?.error?.message));
check("it says what was asked", asked !== null && Number(asked[1]) === Number(asked[2]) + 10,
      String(tooLong?.error?.message));
check("with OpenAI's code and the field", tooLong?.code === "context_length_exceeded" &&
      tooLong?.param === "max_tokens", `${tooLong?.code} ${tooLong?.param}`);
const tooLongChat = await expectError("over-long conversation -> BadRequestError 400",
  () => client.chat.completions.create({ model,
    messages: [{ role: "user", content: "a ".repeat(2000) }] }),
  400, "This model's maximum context length is 512 tokens. However, the messages have ");
check("a chat's is about its messages", tooLongChat?.code === "context_length_exceeded" &&
      tooLongChat?.param === "messages", `${tooLongChat?.code} ${tooLongChat?.param}`);
await expectError("a template's raise_exception -> BadRequestError 400",
  () => client.chat.completions.create({ model, messages: [
    { role: "user", content: "a" }, { role: "user", content: "b" }] }),
  400, "alternate");

// 6. 429 with Retry-After from an overloaded router.
if (args.overload_url) {
  const small = new OpenAI({ baseURL: args.overload_url, apiKey: "unused", maxRetries: 0 });
  const results = await Promise.allSettled(Array.from({ length: 8 }, () =>
    small.completions.create({ model, prompt: "Hi", max_tokens: 100, ignore_eos: true })));
  const limited = results.filter((r) => r.status === "rejected" && r.reason.status === 429);
  check("overload -> RateLimitError 429 with Retry-After",
        limited.length > 0 && limited.every((r) => r.reason instanceof OpenAI.RateLimitError &&
          Number(r.reason.headers?.["retry-after"]) >= 1 &&
          r.reason.headers?.["retry-after-ms"] === expect.retry_after_ms),
        `${limited.length} of 8 limited; retry-after ${limited[0]?.reason.headers?.["retry-after"]}, ` +
        `retry-after-ms ${limited[0]?.reason.headers?.["retry-after-ms"]}`);
}

console.log(failures === 0 ? "sdk_test: all checks passed" : `sdk_test: ${failures} check(s) failed`);
process.exit(failures === 0 ? 0 : 1);
