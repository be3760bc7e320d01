// The real Codex CLI (@openai/codex, version pinned in package.json: its native binary from the
// platform package), driven by the scripted OpenAI Responses API (models/openai_responses.mjs) on
// loopback, through the real idemgate binary in front of the example MCP server, set up by the
// real `idemgate install codex` (lib.mjs installHost: the server written into
// $CODEX_HOME/config.toml under a temp HOME as a user has it, then wrapped by the install
// command; Codex needs no hook, it sends its turn id).
//
// Measured with 0.169.0 (this file's tests assert each):
// - `_meta` of tools/call: {"callId": "<the model's call_id>", "x-codex-turn-metadata": {turn_id,
//   thread_id, session_id, turn_started_at_unix_ms, model, codex_version, sandbox, …} (a JSON
//   object), "threadId", "sessionId", "windowId", "itemId": "<the function_call item's id>",
//   "progressToken": N}. turn_id is new for every prompt; threadId stays across
//   `codex exec resume`. The same over Streamable HTTP (`url = …`, to idemgate mcp --listen).
// - A follow-up prompt is `codex exec resume --last PROMPT`: the same thread, a new turn.
// - Each stdio MCP server runs in a process group of its own. Its stop (end of `codex exec`):
//   stdin closed and SIGTERM to that group at the same moment (within 15 ms), so idemgate AND
//   its upstream server get the SIGTERM from Codex; then SIGKILL to the server process it
//   started (not the group), measured 109–420 ms after the SIGTERM, about when Codex exits
//   (the "stop" test measures it with signal_server.mjs). So idemgate has ~140 ms from SIGTERM
//   to settle and flush, and its upstream is being stopped at the same time.
// - It starts MCP servers in the background: without `required = true` in the server's table
//   its first model request sometimes goes out before the server's tools are listed (1 run of 2
//   by hand). That is Codex's behaviour, not idemgate's: the lab's server entry has
//   `required = true` as a user's would, and `idemgate install` keeps it.
// - It hands the model an MCP result's structuredContent, when there is one, instead of its text
//   content ("Wall time: …\nOutput:\n{…json…}").
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import {
  EXAMPLE_SERVER,
  HERE,
  IDEMGATE,
  REPLAY_SENTENCE,
  assertInstalled,
  chargeScript,
  defer,
  executions,
  exampleServer,
  hostMeta,
  installHost,
  labDirs,
  outcomes,
  readAudit,
  requireIdemgate,
  startHost,
  toolNamed,
} from './lib.mjs';
import { killLeftoversAfter, leftoversGone } from './leftovers.mjs';
import { assertTwinCallsRanOnce } from './outcomes.mjs';
import { startModel } from './models/openai_responses.mjs';

/** The native Codex binary of the platform package (the npm wrapper only execs it). */
const CODEX_BIN = path.join(HERE, 'node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex');
const SIGNAL_SERVER = path.join(HERE, 'signal_server.mjs');

const codexHome = (d) => path.join(d.home, '.codex');
const configFile = (d) => path.join(codexHome(d), 'config.toml');

/** The scripted model as Codex's provider: written before installHost appends the servers. */
function writeProvider(d, model) {
  fs.mkdirSync(codexHome(d), { recursive: true, mode: 0o700 });
  fs.writeFileSync(
    configFile(d),
    [
      'model = "scripted-model"',
      'model_provider = "lab"',
      '',
      '[model_providers.lab]',
      'name = "lab"',
      `base_url = ${JSON.stringify(model.url)}`,
      'wire_api = "responses"',
      '',
    ].join('\n'),
    { mode: 0o600 },
  );
}

/** A lab dir with the example server installed behind idemgate, and a scripted model. */
async function setUp(t, decide = chargeScript(), more = () => '') {
  requireIdemgate();
  const d = labDirs(t, 'idemgate-codex-');
  killLeftoversAfter(t, d.dir);
  const model = await startModel(decide);
  defer(t, () => model.close());
  writeProvider(d, model);
  await installHost('codex', d, { example: { ...exampleServer(d), required: true } });
  fs.appendFileSync(configFile(d), more(d)); // servers not behind idemgate
  return { d, model };
}

/**
 * Runs one `codex exec` (with `resume: true`, `codex exec resume --last`: the next prompt of the
 * same conversation) and resolves once Codex and every MCP server it started are gone
 * (`ownServers: false`: the test's other processes, e.g. an `idemgate mcp --listen`, stay).
 */
async function exec(t, d, prompt, { resume = false, ownServers = true } = {}) {
  const args = ['exec', '--dangerously-bypass-approvals-and-sandbox', '--skip-git-repo-check'];
  if (resume) args.push('resume', '--last');
  args.push(prompt);
  const host = startHost(t, CODEX_BIN, args, {
    env: { ...d.env, CODEX_HOME: codexHome(d) },
    cwd: d.project,
  });
  host.end(); // `codex exec` reads stdin to its end as more of the prompt when it is not a tty
  const run = await host.done();
  assert.equal(run.code, 0, `codex exited ${run.code ?? run.signal}\n${host.output()}`);
  assert.match(run.stdout, /done/, `the scripted conversation ended\n${host.output()}`);
  // Codex gives each MCP server a process group of its own: wait for them by the test's dir.
  if (ownServers) await leftoversGone(d.dir);
  return { ...run, serversGoneAt: Date.now() };
}

/** Codex's _meta, as the example server received it; returns them. */
function assertMetaShape(d) {
  const metas = hostMeta(d.ledger);
  assert.ok(metas.length > 0, 'at least one execution');
  for (const m of metas) {
    assert.deepEqual(
      Object.keys(m).sort(),
      ['callId', 'itemId', 'progressToken', 'sessionId', 'threadId', 'windowId', 'x-codex-turn-metadata'],
      JSON.stringify(m),
    );
    const turn = m['x-codex-turn-metadata'];
    assert.equal(typeof turn, 'object', 'x-codex-turn-metadata is a JSON object, not a string');
    assert.match(turn.turn_id, /^[0-9a-f-]{36}$/, JSON.stringify(turn));
    assert.equal(turn.thread_id, m.threadId);
    assert.match(m.callId, /^call_/, 'the model’s call_id is passed on');
  }
  return metas;
}

/** Which of the model's tool results carried idemgate's replay sentence. */
const replays = (model) => model.toolResults.map((r) => r.text.includes(REPLAY_SENTENCE));

test('Codex: set up by idemgate install, a model retry within a prompt runs once, and the retry is logged as replayed', async (t) => {
  const { d, model } = await setUp(t);
  // The config Codex ran with is the install command's work: the server wrapped, the rest kept.
  const config = assertInstalled('codex', d, 'example', exampleServer(d));
  assert.match(config, /^required = true$/m, 'install kept the entry’s other keys');
  await exec(t, d, 'Please charge the customer.');
  assert.equal(executions(d.ledger), 1, 'the retry did not charge again');
  // Read right after Codex stopped idemgate: nothing may be missing.
  const attempts = await readAudit(d.store, { tool: 'charge' });
  assert.deepEqual(outcomes(attempts), { claimed: 1, executed: 1, replayed: 1 }, JSON.stringify(attempts));
  for (const a of attempts) assert.match(a.detail ?? '', /x-codex-turn-metadata/, `scoped by Codex's turn: ${JSON.stringify(a)}`);
  assert.equal(model.toolResults.length, 2, JSON.stringify(model.toolResults));
  for (const r of model.toolResults) assert.ok(!r.isError, r.text);
  t.diagnostic(`_meta: ${JSON.stringify(assertMetaShape(d)[0])}`);
});

test('Codex: the replay sentence reaches the model (a tool answering text)', async (t) => {
  const ticket = { title: 'Printer on fire' };
  const { d, model } = await setUp(t, ({ prompt, results, tools }) => {
    if (!/ticket/.test(prompt)) return { text: 'ok' };
    const name = toolNamed(tools, 'create_ticket');
    return results.length < 2 ? { calls: [{ name, arguments: ticket }] } : { text: 'done' };
  });
  await exec(t, d, 'Please open a ticket.');
  assert.equal(executions(d.ledger, 'create_ticket'), 1, 'the retry did not open a second ticket');
  assert.deepEqual(replays(model), [false, true], `what the model got back: ${JSON.stringify(model.toolResults)}`);
});

// Codex hands the model an MCP result's structuredContent instead of its content when there is
// one, and idemgate's replay sentence is a content block: the model reads the stored charge as
// if it had just been made. Kept as a todo (it runs and reports) until idemgate says "replayed"
// in a way Codex passes on.
test('Codex: the replay sentence reaches the model (a tool answering structuredContent)', { todo: 'Codex shows structuredContent only, and the replay sentence is a text block' }, async (t) => {
  const { d, model } = await setUp(t);
  await exec(t, d, 'Please charge the customer.');
  assert.equal(executions(d.ledger), 1);
  assert.deepEqual(replays(model), [false, true], `what the model got back: ${JSON.stringify(model.toolResults)}`);
});

test('Codex: two prompts (codex exec, then codex exec resume), a retry in each: 2 executions, 2 replayed', async (t) => {
  const { d, model } = await setUp(t);
  await exec(t, d, 'Please charge the customer.');
  await exec(t, d, 'Please charge the customer again.', { resume: true });
  assert.equal(executions(d.ledger), 2, 'the second prompt charged again; each retry did not');
  const attempts = await readAudit(d.store, { tool: 'charge' });
  assert.deepEqual(outcomes(attempts), { claimed: 2, executed: 2, replayed: 2 }, JSON.stringify(attempts));
  const metas = assertMetaShape(d);
  assert.equal(metas[0].threadId, metas[1].threadId, 'resume continued the same thread');
  assert.notEqual(metas[0]['x-codex-turn-metadata'].turn_id, metas[1]['x-codex-turn-metadata'].turn_id, 'a new turn');
  assert.equal(model.toolResults.length, 4, JSON.stringify(model.toolResults));
});

test('Codex: two identical tool calls in one model message run once', async (t) => {
  const { d, model } = await setUp(t);
  await exec(t, d, 'Please charge the customer twice at once.');
  t.diagnostic(`outcomes: ${JSON.stringify(await assertTwinCallsRanOnce(d, model))}`);
});

test('Codex: its own stop (stdin closed and SIGTERM, then SIGKILL) leaves no attempt unlogged', async (t) => {
  // Beside idemgate, a server that records the signals Codex sends and ignores them.
  const signalLog = (d) => path.join(d.dir, 'signals.jsonl');
  const { d } = await setUp(t, chargeScript(), (d) =>
    [
      '',
      '[mcp_servers.recorder]',
      `command = ${JSON.stringify(process.execPath)}`,
      `args = [${JSON.stringify(SIGNAL_SERVER)}]`,
      `env = { SIGNAL_LOG = ${JSON.stringify(signalLog(d))} }`,
      '',
    ].join('\n'),
  );
  const log = signalLog(d);
  const run = await exec(t, d, 'Please charge the customer.');
  // The audit log as it is the moment Codex and its servers are gone.
  const attempts = await readAudit(d.store, { tool: 'charge' });
  assert.deepEqual(outcomes(attempts), { claimed: 1, executed: 1, replayed: 1 }, 'every attempt is in the audit log');

  const events = fs.readFileSync(log, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
  const signals = events.filter((e) => e.event.startsWith('SIG'));
  assert.deepEqual(signals.map((e) => e.event), ['SIGTERM'], JSON.stringify(events));
  const end = events.find((e) => e.event === 'stdin-end');
  assert.ok(end && Math.abs(end.at - signals[0].at) < 50, `stdin closed with the SIGTERM: ${JSON.stringify(events)}`);
  // exec() waited for the recorder, which ignores SIGTERM and stays after its stdin ends, to be
  // gone: Codex SIGKILLed it.
  t.diagnostic(`stop: stdin end and SIGTERM together (${end.at - signals[0].at} ms apart), SIGKILL; the recorder was gone ${run.serversGoneAt - signals[0].at} ms after the SIGTERM, codex exited ${run.exitedAt - signals[0].at} ms after it`);
});

test('Codex over Streamable HTTP (url) to idemgate mcp --listen: a retry replays, with the same _meta', async (t) => {
  requireIdemgate();
  const d = labDirs(t, 'idemgate-codex-http-');
  killLeftoversAfter(t, d.dir);
  const proxy = startHost(t, IDEMGATE, ['mcp', '--store', d.store, '--listen', '127.0.0.1:0', '--', 'node', EXAMPLE_SERVER], {
    env: { ...d.env, EXAMPLE_LEDGER: d.ledger },
    cwd: d.project,
  });
  const [, url] = await proxy.stderr.waitFor(/idemgate: listening on (http:\/\/127\.0\.0\.1:\d+\/mcp)/, 15000);
  const model = await startModel(chargeScript());
  defer(t, () => model.close());
  writeProvider(d, model);
  await installHost('codex', d, { example: { url, required: true } });

  await exec(t, d, 'Please charge the customer.', { ownServers: false });
  assert.equal(executions(d.ledger), 1, 'the retry did not charge again');
  // The proxy outlives the host: stop it the way an operator does, then read its audit log.
  process.kill(proxy.pid, 'SIGTERM');
  const stopped = await proxy.done();
  assert.equal(stopped.code, 0, `idemgate mcp --listen exited ${stopped.code ?? stopped.signal}\n${proxy.output()}`);
  const attempts = await readAudit(d.store, { tool: 'charge' });
  assert.deepEqual(outcomes(attempts), { claimed: 1, executed: 1, replayed: 1 }, JSON.stringify(attempts));
  for (const a of attempts) assert.match(a.detail ?? '', /x-codex-turn-metadata/, JSON.stringify(a));
  t.diagnostic(`_meta over HTTP: ${JSON.stringify(assertMetaShape(d)[0])}`);
});
