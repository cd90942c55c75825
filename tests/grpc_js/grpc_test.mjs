// @grpc/grpc-js, Node.js's gRPC library (pinned in package.json), against
// pdserve's public Generation API, loading proto/pdserve/v1/generate.proto
// at run time as a client in another language would. Run by
// tests/integration/service_openai_sdk_test.cc (GrpcJsTest), which starts
// the clusters and writes the expected outputs:
//   node grpc_test.mjs --target=127.0.0.1:P --proto=FILE --expect=FILE.json
//        [--overload_target=127.0.0.1:Q]
// Prints one line per check; exits 1 when any check fails.
import fs from "node:fs";
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

const args = Object.fromEntries(
  process.argv.slice(2).map((a) => a.replace(/^--/, "").split(/=(.*)/s).slice(0, 2)));
const expect = JSON.parse(fs.readFileSync(args.expect, "utf8"));
// Field names as in the .proto; int64 and enums as JS numbers and strings.
const definition = protoLoader.loadSync(args.proto, {
  keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
});
const { Generation } = grpc.loadPackageDefinition(definition).pdserve.v1;
const client = new Generation(args.target, grpc.credentials.createInsecure());
let failures = 0;

function check(name, ok, detail = "") {
  console.log(`${ok ? "ok  " : "FAIL"} ${name}${detail ? ": " + detail : ""}`);
  if (!ok) failures++;
}
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
const deadline = (seconds) => new Date(Date.now() + seconds * 1000);

function unary(method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: deadline(30) }, (err, response) =>
      err ? reject(err) : resolve(response));
  });
}

// Runs a Generate stream to its end: the messages, and the error if it
// failed. `onMessage(call, message)` sees each message as it arrives.
function generate(request, onMessage = () => {}, target = client) {
  return new Promise((resolve) => {
    const messages = [];
    const call = target.Generate(request, { deadline: deadline(60) });
    call.on("data", (m) => { messages.push(m); onMessage(call, m); });
    call.on("error", (error) => resolve({ messages, error }));
    call.on("end", () => resolve({ messages, error: null }));
  });
}
const idsOf = (messages) => messages.flatMap((m) => m.tokens.map((t) => t.id));
const textOf = (messages) => messages.map((m) => m.text).join("");
const last = (messages) => messages[messages.length - 1] ?? {};

// 1. GetModelInfo.
{
  const info = await unary("GetModelInfo", {});
  check("GetModelInfo describes the served model",
        info.model === expect.model && info.vocab_size === 512 && info.max_context === 512 &&
        info.eos_token_ids.includes(2) && info.num_decode_workers === 1,
        JSON.stringify(info));
}

// 2. Greedy token-id prompts stream the reference outputs, the last message
//    with the usage and every stage's timing.
for (const [i, ref] of expect.references.entries()) {
  const { messages, error } = await generate({
    token_ids: { ids: ref.prompt_ids }, max_tokens: ref.max_new_tokens,
    sampling: { temperature: 0 },
  });
  const end = last(messages);
  check(`reference ${i}: greedy ids equal the reference`,
        !error && same(idsOf(messages), ref.output_ids),
        error ? error.message : `${idsOf(messages).length} tokens`);
  check(`reference ${i}: last message finished, with usage and timings`,
        end.finished === true && end.finish_reason === "length" &&
        end.usage?.prompt_tokens === ref.prompt_ids.length &&
        end.usage?.completion_tokens === ref.max_new_tokens &&
        end.timings?.prefill_location === "prefill_worker" && end.timings?.e2e > 0 &&
        same(end.prompt_ids, ref.prompt_ids),
        JSON.stringify({ finish_reason: end.finish_reason, usage: end.usage,
                         prefill_location: end.timings?.prefill_location }));
}

// 3. A text prompt: tokenized by the router, text streamed in pieces.
{
  const tok = await unary("Tokenize", { text: expect.text.prompt });
  check("Tokenize gives the router's ids", same(tok.ids, expect.text.prompt_ids),
        JSON.stringify(tok.ids));
  const { messages, error } = await generate({
    text: expect.text.prompt, max_tokens: expect.text.max_tokens, sampling: { temperature: 0 },
  });
  check("text prompt: streamed text and ids equal the C++ client's",
        !error && textOf(messages) === expect.text.text && same(idsOf(messages), expect.text.ids),
        error ? error.message : JSON.stringify(textOf(messages)));
}

// 4. Seeded sampling is reproducible across clients.
{
  const s = expect.seeded;
  const { messages, error } = await generate({
    token_ids: { ids: s.prompt_ids }, max_tokens: s.max_tokens,
    sampling: { temperature: s.temperature, top_p: s.top_p, seed: s.seed },
  });
  check("seeded sampling equals the C++ client's with the same seed",
        !error && same(idsOf(messages), s.ids), error ? error.message : "");
}

// 5. Errors arrive as gRPC statuses with pdserve's messages.
{
  const { messages, error } = await generate({ token_ids: { ids: [1, 100000] }, max_tokens: 4 });
  check("an id outside the vocabulary -> INVALID_ARGUMENT naming it",
        error?.code === grpc.status.INVALID_ARGUMENT && messages.length === 0 &&
        error.details.includes("100000"),
        error ? `${error.code} ${error.details}` : "no error");
  const empty = await generate({ max_tokens: 4 });
  check("no prompt -> INVALID_ARGUMENT", empty.error?.code === grpc.status.INVALID_ARGUMENT,
        empty.error ? empty.error.details : "no error");
}

// 6. Cancelling a stream after its first tokens ends it with CANCELLED (the
//    C++ side then checks that no worker holds KV for it).
{
  let cancelledAfter = -1;
  const { messages, error } = await generate({
    token_ids: { ids: expect.references[0].prompt_ids }, max_tokens: 400, ignore_eos: true,
  }, (call, m) => {
    if (cancelledAfter < 0 && m.tokens.length > 0) {
      cancelledAfter = idsOf([m]).length;
      call.cancel();
    }
  });
  check("a cancelled stream ends with CANCELLED before its 400 tokens",
        error?.code === grpc.status.CANCELLED && idsOf(messages).length < 400,
        `${error ? error.code : "no error"} after ${idsOf(messages).length} tokens`);
}

// 7. An overloaded router answers RESOURCE_EXHAUSTED with its retry hint in
//    the trailing metadata.
if (args.overload_target) {
  const small = new Generation(args.overload_target, grpc.credentials.createInsecure());
  const results = await Promise.all(Array.from({ length: 6 }, () => generate(
    { token_ids: { ids: [1, 400, 500] }, max_tokens: 100, ignore_eos: true }, () => {}, small)));
  const refused = results.filter((r) => r.error?.code === grpc.status.RESOURCE_EXHAUSTED);
  check("overload -> RESOURCE_EXHAUSTED with retry-after-ms in the trailers",
        refused.length > 0 && refused.length < 6 &&
        refused.every((r) => same(r.error.metadata.get("retry-after-ms"), [expect.retry_after_ms])),
        `${refused.length} of 6 refused; retry-after-ms ` +
        JSON.stringify(refused[0]?.error.metadata.get("retry-after-ms")));
  small.close();
}

client.close();
console.log(failures === 0 ? "grpc_test: all checks passed" : `grpc_test: ${failures} check(s) failed`);
process.exit(failures === 0 ? 0 : 1);
