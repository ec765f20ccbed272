// The official OpenAI client library (npm `openai`) against `baton up` on the demo model:
// chat with and without streaming, completions, tools and tool results, the models list,
// and its error handling (401, 400, 429). The demo model is untrained, so these tests check
// the wire format and behaviour, not the words.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { isIPv4 } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';

const BIN = process.env.BT_BIN_DIR;
if (!BIN) throw new Error('BT_BIN_DIR must point at build/bin');
const KEY = 'sk-baton-test-key';
// more `baton up` flags for every cluster here (CTest's openai_client_dspark: DSpark decoding)
const UP_EXTRA = (process.env.BT_UP_EXTRA || '').split(' ').filter(Boolean);
const cache = mkdtempSync(path.join(tmpdir(), 'bt-openai-'));

// Starts `baton up` with extra flags; resolves to {proc, gateway} once the cluster runs.
function up(extra) {
  return new Promise((resolve, reject) => {
    const proc = spawn(path.join(BIN, 'baton'),
      ['up', '--port', '0', '--router-port', '0', '--threads', '1', '--log-level', 'warn', ...UP_EXTRA, ...extra],
      { env: { ...process.env, XDG_CACHE_HOME: cache }, stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    const timer = setTimeout(() => { proc.kill('SIGKILL'); reject(new Error('baton up did not start: ' + out)); }, 120000);
    proc.stdout.on('data', (d) => {
      out += d.toString();
      const m = out.match(/gateway\s+(\S+:\d+)/);
      if (m && out.includes('Ctrl-C stops it')) {
        clearTimeout(timer);
        resolve({ proc, gateway: `http://${m[1]}/v1` });
      }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`baton up exited ${code}: ${out}`)); });
  });
}

function down(c) {
  return new Promise((resolve) => {
    if (!c || c.proc.exitCode !== null) return resolve();
    c.proc.removeAllListeners('exit');
    const t = setTimeout(() => c.proc.kill('SIGKILL'), 15000);
    c.proc.on('exit', () => { clearTimeout(t); resolve(); });
    c.proc.kill('SIGTERM');
  });
}

let main;
let client;
before(async () => {
  main = await up(['--api-key', KEY, '--enable-cache-report']);
  client = new OpenAI({ baseURL: main.gateway, apiKey: KEY, maxRetries: 0, timeout: 60000 });
});
after(async () => { await down(main); });

const MODEL = 'baton-demo';

test('models list', async () => {
  const page = await client.models.list();
  const ids = page.data.map((m) => m.id);
  assert.ok(ids.includes(MODEL), `models: ${ids}`);
  assert.equal(page.data[0].object, 'model');
});

test('chat without streaming', async () => {
  const r = await client.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Hello, who are you?' }], max_tokens: 8, temperature: 0,
  });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['length', 'stop'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 8);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  // greedy is deterministic
  const again = await client.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Hello, who are you?' }], max_tokens: 8, temperature: 0,
  });
  assert.equal(again.choices[0].message.content, r.choices[0].message.content);
});

test('a developer message is a system message', async () => {
  const ask = (role) => client.chat.completions.create({
    model: MODEL, messages: [{ role, content: 'Answer in one word.' }, { role: 'user', content: 'Sky colour?' }],
    max_tokens: 6, temperature: 0,
  });
  const [dev, sys] = [await ask('developer'), await ask('system')];
  assert.equal(dev.usage.prompt_tokens, sys.usage.prompt_tokens);
  assert.equal(dev.choices[0].message.content, sys.choices[0].message.content);
});

test('chat with streaming and usage', async () => {
  const stream = await client.chat.completions.create({
    model: MODEL, messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Count to three.' }],
    max_tokens: 12, temperature: 0, stream: true, stream_options: { include_usage: true }, ignore_eos: true,
  });
  let role = null, text = '', finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      if (c.delta.content) text += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(role, 'assistant');
  assert.equal(finish, 'length');
  assert.ok(chunks >= 3, `${chunks} chunks`);
  assert.equal(usage.completion_tokens, 12);
  // the streamed text equals the non-streamed one
  const whole = await client.chat.completions.create({
    model: MODEL, messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Count to three.' }],
    max_tokens: 12, temperature: 0, ignore_eos: true,
  });
  assert.equal(text, whole.choices[0].message.content);
});

test('the prefix cache: a prompt sent again and the next turn of its conversation report cached tokens, and answer as before', async () => {
  const system = `Session ${process.pid}-${Date.now()}. You are a careful assistant who answers in full sentences, ` +
    'names the steps of every calculation, and says so when a question cannot be answered from what was given.';
  const turn1 = [{ role: 'system', content: system }, { role: 'user', content: 'What is seven times six?' }];
  const ask = { model: MODEL, max_tokens: 8, temperature: 0, ignore_eos: true, chat_template_kwargs: { thinking: false } };
  const first = await client.chat.completions.create({ ...ask, messages: turn1 });
  const p = first.usage.prompt_tokens;
  assert.ok(p > 64, `a prompt of ${p} tokens: too short to show the cache`);
  assert.equal(first.usage.prompt_tokens_details.cached_tokens, 0);
  const again = await client.chat.completions.create({ ...ask, messages: turn1 });
  // the prefill kept the state at the prompt's last multiple of 64 tokens (and where its user
  // turn starts, which may lie past it)
  const found = again.usage.prompt_tokens_details.cached_tokens;
  assert.ok(found >= Math.floor((p - 1) / 64) * 64 && found < p, `again: ${found} of ${p} cached`);
  assert.equal(again.choices[0].message.content, first.choices[0].message.content);
  const turn2 = [...turn1, { role: 'assistant', content: first.choices[0].message.content },
    { role: 'user', content: 'And eight times six?' }];
  const next = await client.chat.completions.create({ ...ask, messages: turn2 });
  const cached = next.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= 64 && cached < next.usage.prompt_tokens, `turn 2: ${cached} of ${next.usage.prompt_tokens} cached`);
});

test('the prefix cache: conversations that share a system prompt share its state', async () => {
  const system = `Desk ${process.pid}-${Date.now()}. You answer questions about arithmetic and nothing else, ` +
    'and you say which rule of arithmetic each step of an answer uses, and which step could go wrong and how.';
  const ask = { model: MODEL, max_tokens: 4, temperature: 0, ignore_eos: true, chat_template_kwargs: { thinking: false } };
  // long questions: the states a prompt's prefill keeps at multiples of 64 tokens lie past
  // the system prompt; only the point the router marks, where the user turn starts, is in it
  const question = (q) => `${q} Please list, one per line and in order, every step of the calculation, then check it a second way. `.repeat(3);
  const a = await client.chat.completions.create({ ...ask, messages: [{ role: 'system', content: system }, { role: 'user', content: question('What is 17 times 23?') }] });
  assert.equal(a.usage.prompt_tokens_details.cached_tokens, 0);
  const b = await client.chat.completions.create({ ...ask, messages: [{ role: 'system', content: system }, { role: 'user', content: question('What is 19 times 29?') }] });
  const shared = b.usage.prompt_tokens_details.cached_tokens;
  assert.ok(shared > 0 && shared < b.usage.prompt_tokens - 64, `the second conversation: ${shared} of ${b.usage.prompt_tokens} cached`);
});

test('n choices: each the one-choice answer with seed + index, streamed under its index', async () => {
  const ask = { model: MODEL, messages: [{ role: 'user', content: 'Pick a word.' }], max_tokens: 5, temperature: 1, ignore_eos: true };
  const r = await client.chat.completions.create({ ...ask, n: 3, seed: 11 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  assert.equal(r.usage.completion_tokens, 15);
  for (let i = 0; i < 3; i++) {
    const one = await client.chat.completions.create({ ...ask, seed: 11 + i });
    assert.equal(r.choices[i].message.content, one.choices[0].message.content, `choice ${i}`);
    assert.equal(r.usage.prompt_tokens, one.usage.prompt_tokens);
  }
  const stream = await client.chat.completions.create({ ...ask, n: 3, seed: 11, stream: true, stream_options: { include_usage: true } });
  const text = ['', '', ''];
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) if (c.delta.content) text[c.index] += c.delta.content;
  }
  assert.deepEqual(text, r.choices.map((c) => c.message.content));
  assert.equal(usage.completion_tokens, 15);
});

test('completions of a batch of prompts: n choices each, prompt-major', async () => {
  const ask = { model: MODEL, max_tokens: 3, temperature: 0, ignore_eos: true };
  const r = await client.completions.create({ ...ask, prompt: ['Hello', 'The sky is'], n: 2 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);
  const a = await client.completions.create({ ...ask, prompt: 'Hello' });
  const b = await client.completions.create({ ...ask, prompt: 'The sky is' });
  assert.deepEqual(r.choices.map((c) => c.text), [a.choices[0].text, a.choices[0].text, b.choices[0].text, b.choices[0].text]);
  assert.equal(r.usage.prompt_tokens, a.usage.prompt_tokens + b.usage.prompt_tokens);
  assert.equal(r.usage.completion_tokens, 12);
});

test('completions, text and token ids, streaming', async () => {
  const r = await client.completions.create({ model: MODEL, prompt: 'The capital of France is', max_tokens: 5, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
  assert.ok(r.usage.completion_tokens >= 1);
  const ids = await client.completions.create({ model: MODEL, prompt: [0, 40, 41, 42], max_tokens: 4, temperature: 0, ignore_eos: true });
  assert.equal(ids.usage.prompt_tokens, 4);
  assert.equal(ids.usage.completion_tokens, 4);
  const stream = await client.completions.create({ model: MODEL, prompt: [0, 40, 41, 42], max_tokens: 4, temperature: 0, stream: true, ignore_eos: true });
  let text = '';
  for await (const chunk of stream) for (const c of chunk.choices) text += c.text;
  assert.equal(text, ids.choices[0].text);
});

test('tools and tool results', async () => {
  const tools = [{
    type: 'function',
    function: {
      name: 'get_weather', description: 'Weather for a city',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    },
  }];
  const r = await client.chat.completions.create({
    model: MODEL, tools, tool_choice: 'auto', max_tokens: 6, temperature: 0,
    messages: [
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c": 18}' },
    ],
  });
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.ok(['length', 'stop', 'tool_calls'].includes(r.choices[0].finish_reason));
  // thinking mode and an effort are accepted
  const t = await client.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Think.' }], max_tokens: 4, temperature: 0,
    chat_template_kwargs: { thinking: true }, reasoning_effort: 'high',
  });
  assert.equal(t.choices[0].message.role, 'assistant');
});

test('thinking asked three ways: the same prompt, and the same reasoning/content split', async () => {
  // the router's reasoning parser and the chat encoder decided "thinking" each by its own
  // rule: {thinking: 1} rendered a thinking prompt parsed as plain content, and a top-level
  // enable_thinking a plain prompt parsed as reasoning
  const ask = (extra) => client.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Think.' }], max_tokens: 8, temperature: 0, ignore_eos: true, ...extra,
  });
  const want = (await ask({ chat_template_kwargs: { thinking: true } })).choices[0].message;
  for (const extra of [{ chat_template_kwargs: { thinking: 1 } }, { enable_thinking: true },
    { chat_template_kwargs: { thinking: null, enable_thinking: true } }]) {
    const got = (await ask(extra)).choices[0].message;
    assert.equal(got.reasoning_content, want.reasoning_content, JSON.stringify(extra));
    assert.equal(got.content, want.content, JSON.stringify(extra));
  }
});

test('tool_choice none: no tools in the prompt, reasoning still parsed', async () => {
  const ask = (extra) => client.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Weather?' }], max_tokens: 8, temperature: 0, ignore_eos: true,
    chat_template_kwargs: { thinking: true }, ...extra,
  });
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: {} } } }];
  const want = (await ask({})).choices[0].message;
  const got = (await ask({ tools, tool_choice: 'none' })).choices[0].message;
  assert.equal(got.reasoning_content, want.reasoning_content);
  assert.equal(got.content, want.content);
  assert.ok(!got.tool_calls || got.tool_calls.length === 0);
});

test('matched_stop names the stop string that ended the answer', async () => {
  const ask = (extra) => client.completions.create({
    model: MODEL, prompt: 'The', max_tokens: 24, temperature: 0, ignore_eos: true, ...extra,
  });
  const full = (await ask({})).choices[0];
  assert.equal(full.matched_stop, null);
  const text = full.text;
  assert.ok([...text].length >= 6, `too little text: ${JSON.stringify(text)}`);
  const stop = [...text].slice(3, 5).join(''); // (whole code points)
  const cut = (await ask({ stop: [stop] })).choices[0];
  assert.equal(cut.finish_reason, 'stop');
  assert.equal(cut.matched_stop, stop);
  assert.ok(text.startsWith(cut.text) && !cut.text.includes(stop));
});

test('logprobs', async () => {
  const r = await client.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 3, temperature: 0, logprobs: true, top_logprobs: 2, ignore_eos: true,
  });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 3);
  for (const e of lp) {
    assert.ok(e.logprob <= 0);
    assert.equal(e.top_logprobs.length, 2);
    assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
    assert.equal(e.logprob, e.top_logprobs[0].logprob); // greedy takes the most likely
  }
});

test('completions logprobs: a count of alternatives, offsets in characters', async () => {
  const r = await client.completions.create({
    model: MODEL, prompt: 'The', max_tokens: 4, temperature: 0, logprobs: 2, ignore_eos: true,
  });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, 4);
  assert.equal(lp.token_logprobs.length, 4);
  let offset = 0;
  for (let i = 0; i < 4; i++) {
    assert.equal(Object.keys(lp.top_logprobs[i]).length <= 2, true);
    assert.ok(Object.keys(lp.top_logprobs[i]).length >= 1);
    assert.equal(lp.text_offset[i], offset);
    offset += [...lp.tokens[i]].length; // characters (code points), as OpenAI counts them
  }
});

test('presence and frequency penalties, logit_bias', async () => {
  const ask = (extra) => client.completions.create({
    model: MODEL, prompt: 'The', max_tokens: 24, temperature: 0, ignore_eos: true, return_token_ids: true, ...extra,
  });
  const plain = await ask({});
  const favoured = await ask({ presence_penalty: -2, frequency_penalty: -2 });
  const ids = (r) => r.choices[0].token_ids ?? r.choices[0].text;
  // negative penalties favour tokens already generated: a repeat, and other text than greedy
  const toks = favoured.choices[0].token_ids;
  if (toks) assert.ok(new Set(toks).size < toks.length, `no token repeated: ${toks}`);
  assert.notDeepEqual(ids(favoured), ids(plain));
  // the same request twice: the same text (the counts start afresh)
  assert.deepEqual(ids(await ask({ presence_penalty: -2, frequency_penalty: -2 })), ids(favoured));
  // logit_bias: +100 on one id makes greedy pick it every time, the first token included
  const forced = await ask({ logit_bias: { 42: 100 } });
  if (forced.choices[0].token_ids) assert.ok(forced.choices[0].token_ids.every((t) => t === 42), `${forced.choices[0].token_ids}`);
  assert.notDeepEqual(ids(forced), ids(plain));
  await assert.rejects(ask({ logit_bias: { 42: 101 } }),
    (e) => e instanceof OpenAI.BadRequestError && /logit_bias/.test(e.message));
});

// the demo model's byte-level vocabulary, from the one demo-v<version> the cluster wrote
function demoVocab() {
  const dirs = readdirSync(path.join(cache, 'baton')).filter((d) => /^demo-v[0-9]+$/.test(d));
  assert.equal(dirs.length, 1, `demo model directories: ${dirs}`);
  return JSON.parse(readFileSync(path.join(cache, 'baton', dirs[0], 'tokenizer.json'))).model.vocab;
}

test('response_format json_object and json_schema: every answer that stops is a JSON object, an instance of the schema', async () => {
  // the untrained model's strings run long: a bias toward '"' and '}' (where the grammar allows
  // them) closes most objects within max_tokens; without the grammar it puts them anywhere
  const vocab = demoVocab();
  const logit_bias = { [vocab['"']]: 8, [vocab['}']]: 8 };
  const ask = (extra) => client.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Answer in JSON.' }], max_tokens: 200, n: 6,
    seed: 11, logit_bias, ...extra,
  });
  const isObject = (s) => { try { const v = JSON.parse(s); return v !== null && typeof v === 'object' && !Array.isArray(v); } catch { return false; } };
  const on = await ask({ response_format: { type: 'json_object' } });
  const stopped = on.choices.filter((c) => c.finish_reason === 'stop');
  assert.ok(stopped.length >= 3, `${stopped.length} of 6 stopped`);
  for (const c of stopped) assert.ok(isObject(c.message.content), `not an object: ${JSON.stringify(c.message.content)}`);
  const off = await ask({});
  assert.equal(off.choices.filter((c) => isObject(c.message.content)).length, 0);
  // json_schema, as the SDK sends it (strict): every answer that stops is an instance
  const schema = {
    type: 'object', additionalProperties: false, required: ['city', 'days', 'unit'],
    properties: { city: { type: 'string', maxLength: 24 }, days: { type: 'integer', minimum: 1, maximum: 14 }, unit: { enum: ['C', 'F'] } },
  };
  const typed = await ask({ response_format: { type: 'json_schema', json_schema: { name: 'forecast', strict: true, schema } } });
  const done = typed.choices.filter((c) => c.finish_reason === 'stop');
  assert.ok(done.length >= 3, `${done.length} of 6 stopped`);
  for (const c of done) {
    const v = JSON.parse(c.message.content);
    assert.deepEqual(Object.keys(v), ['city', 'days', 'unit'], c.message.content);
    assert.ok(typeof v.city === 'string' && [...v.city].length <= 24 && Number.isInteger(v.days) && v.days >= 1 && v.days <= 14 &&
      ['C', 'F'].includes(v.unit), c.message.content);
  }
  // a discriminated union (Pydantic's Field(discriminator='kind')): each answer that stops is one
  // branch, the one its kind names
  const pets = {
    type: 'object', additionalProperties: false, required: ['pet'], properties: { pet: { anyOf: [
      { type: 'object', additionalProperties: false, required: ['kind', 'lives'],
        properties: { kind: { const: 'cat' }, lives: { type: 'integer', minimum: 0, maximum: 9 } } },
      { type: 'object', additionalProperties: false, required: ['kind', 'breed'],
        properties: { kind: { const: 'dog' }, breed: { type: 'string', maxLength: 8 } } },
    ] } },
  };
  const told = await ask({ response_format: { type: 'json_schema', json_schema: { name: 'pets', strict: true, schema: pets } } });
  const told_done = told.choices.filter((c) => c.finish_reason === 'stop');
  assert.ok(told_done.length >= 3, `${told_done.length} of 6 stopped`);
  for (const c of told_done) {
    const { pet } = JSON.parse(c.message.content);
    if (pet.kind === 'cat') {
      assert.deepEqual(Object.keys(pet), ['kind', 'lives'], c.message.content);
      assert.ok(Number.isInteger(pet.lives) && pet.lives >= 0 && pet.lives <= 9, c.message.content);
    } else {
      assert.deepEqual(Object.keys(pet), ['kind', 'breed'], c.message.content);
      assert.ok(pet.kind === 'dog' && typeof pet.breed === 'string' && [...pet.breed].length <= 8, c.message.content);
    }
  }
  // patterns, formats and a number's bounds: each answer that stops holds them, as JavaScript's
  // own RegExp and node:net read them
  const shaped = {
    type: 'object', additionalProperties: false, required: ['code', 'day', 'host', 'note', 'score'],
    properties: {
      code: { type: 'string', pattern: '^[A-Z]{2}-\\d{3}$' }, day: { type: 'string', format: 'date' },
      host: { type: 'string', format: 'ipv4' }, note: { type: 'string', pattern: '^(ok|"q"|\\\\)+$' },
      score: { type: 'number', exclusiveMinimum: -0.5, maximum: 1 },
    },
  };
  // (about half of these long answers close within max_tokens, plain or speculative: 12 of them)
  const held = await ask({ n: 12, response_format: { type: 'json_schema', json_schema: { name: 'shaped', strict: true, schema: shaped } } });
  const ended = held.choices.filter((c) => c.finish_reason === 'stop');
  assert.ok(ended.length >= 3, `${ended.length} of 12 stopped`);
  for (const c of ended) {
    const v = JSON.parse(c.message.content);
    assert.deepEqual(Object.keys(v), ['code', 'day', 'host', 'note', 'score'], c.message.content);
    assert.ok(typeof v.score === 'number' && v.score > -0.5 && v.score <= 1, c.message.content);
    assert.match(v.code, new RegExp(shaped.properties.code.pattern, 'u'));
    assert.match(v.note, new RegExp(shaped.properties.note.pattern, 'u'));
    assert.match(v.day, /^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$/);
    assert.ok(isIPv4(v.host), c.message.content);
  }
  await assert.rejects(ask({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: {
    type: 'object', properties: { a: { type: 'string', pattern: '^(?!x)' } } } } } }),
  (e) => e instanceof OpenAI.BadRequestError && /lookaround/.test(e.message));  // SGLang's regex, sent as an extra body field: the whole answer matches it
  const regex = '(yes|no|maybe)(, [a-z]{2,6}){0,3}[.!]';
  const matched = await client.completions.create({ model: MODEL, prompt: 'Well', max_tokens: 60, n: 6, seed: 4, regex });
  const whole = matched.choices.filter((c) => c.finish_reason === 'stop');
  assert.ok(whole.length >= 4, `${whole.length} of 6 stopped`);
  for (const c of whole) assert.match(c.text, new RegExp(`^(?:${regex})$`, 'u'));
});

test('tool_choice required and named: the answer is a call of the tools, its arguments fit', async () => {
  // a cluster with the tool-call parser; integer parameters, so that each ends at the next
  // '<' (biased up: the untrained model would otherwise write digits to the 64-digit cap)
  const c = await up(['--api-key', KEY, '--tool-call-parser', 'deepseekv41']);
  try {
    const cl = new OpenAI({ baseURL: c.gateway, apiKey: KEY, maxRetries: 0, timeout: 60000 });
    const vocab = demoVocab();
    const fn = (name) => ({ type: 'function', function: { name, parameters: {
      type: 'object', properties: { a: { type: 'integer' }, b: { type: 'integer' } }, required: ['a', 'b'] } } });
    const ask = (tool_choice) => cl.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'Compute it.' }], tools: [fn('add'), fn('mul')],
      tool_choice, max_tokens: 400, n: 4, seed: 2, logit_bias: { [vocab['<']]: 8 },
    });
    for (const [choice, names, one] of [['required', ['add', 'mul'], false], [{ type: 'function', function: { name: 'mul' } }, ['mul'], true]]) {
      const r = await ask(choice);
      const called = r.choices.filter((x) => x.finish_reason === 'tool_calls');
      assert.ok(called.length >= 2, `${called.length} of 4 called a tool: ${JSON.stringify(r.choices.map((x) => x.message))}`);
      for (const x of called) {
        if (one) assert.equal(x.message.tool_calls.length, 1);
        for (const call of x.message.tool_calls) {
          assert.ok(names.includes(call.function.name), call.function.name);
          const args = JSON.parse(call.function.arguments);
          assert.deepEqual(Object.keys(args), ['a', 'b'], call.function.arguments);
          assert.ok(Number.isInteger(args.a) && Number.isInteger(args.b), call.function.arguments);
        }
      }
    }
    await assert.rejects(ask({ type: 'function', function: { name: 'div' } }),
      (e) => e instanceof OpenAI.BadRequestError && /div/.test(e.message));
    // a tool whose parameters list no properties takes any: each call's arguments an object
    const free = await cl.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'Note it.' }], max_tokens: 400, n: 4, seed: 3,
      tools: [{ type: 'function', function: { name: 'note', parameters: { type: 'object' } } }],
      tool_choice: { type: 'function', function: { name: 'note' } }, logit_bias: { [vocab['<']]: 8 },
    });
    const noted = free.choices.filter((x) => x.finish_reason === 'tool_calls');
    assert.ok(noted.length >= 2, `${noted.length} of 4 called it: ${JSON.stringify(free.choices.map((x) => x.message))}`);
    for (const x of noted) {
      assert.equal(x.message.tool_calls.length, 1);
      assert.equal(x.message.tool_calls[0].function.name, 'note');
      const args = JSON.parse(x.message.tool_calls[0].function.arguments);
      assert.ok(args !== null && typeof args === 'object' && !Array.isArray(args), x.message.tool_calls[0].function.arguments);
      for (const k of Object.keys(args)) assert.match(k, /^[A-Za-z0-9_.-]+$/);
    }
  } finally {
    await down(c);
  }
});

test('errors: 401 and 400', async () => {
  const bad = new OpenAI({ baseURL: main.gateway, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  await assert.rejects(client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }], temperature: 7 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /temperature/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }], n: 65 }),
    (e) => e instanceof OpenAI.BadRequestError && /'n'/.test(e.message));
  await assert.rejects(client.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'x' }],
    response_format: { type: 'json_schema', json_schema: { name: 'r', schema: { type: 'object', properties: { a: { type: 'string', format: 'idn-email' } } } } },
  }), (e) => e instanceof OpenAI.BadRequestError && /response_format/.test(e.message) && /format 'idn-email' is not supported/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model: MODEL, messages: [] }),
    (e) => e instanceof OpenAI.BadRequestError && /messages/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
});

test('errors: 429 when the router queue is full', async () => {
  const small = await up(['--api-key', KEY, '--max-running-requests', '1', '--max-queued-requests', '0']);
  try {
    const c = new OpenAI({ baseURL: small.gateway, apiKey: KEY, maxRetries: 0, timeout: 60000 });
    const reqs = [0, 1, 2].map(() => c.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'long' }], max_tokens: 400, temperature: 0, ignore_eos: true,
    }));
    const results = await Promise.allSettled(reqs);
    const ok = results.filter((r) => r.status === 'fulfilled').length;
    const limited = results.filter((r) => r.status === 'rejected' && r.reason instanceof OpenAI.RateLimitError && r.reason.status === 429);
    assert.equal(ok, 1, JSON.stringify(results.map((r) => r.status)));
    assert.equal(limited.length, 2);
  } finally {
    await down(small);
  }
});
