// The real Gemini CLI (@google/gemini-cli, version pinned in package.json), driven by the scripted
// Gemini API (models/gemini.mjs: streamGenerateContent SSE) on loopback, through the real
// idemgate binary in front of the example MCP server, set up by the real `idemgate install
// gemini-cli` (lib.mjs installHost: the server written into ~/.gemini/settings.json under a temp
// HOME as a user has it, then wrapped, and the BeforeAgent hook added, by the install command).
//
// Measured with 0.61.0 (this file's tests assert each):
// - `_meta` of tools/call: {"progressToken": "<a random UUID per call>"} and nothing else: no
//   session, no turn, no call id. Without the prompt hook two prompts with the same call share
//   one key (the arguments, for the session window).
// - A follow-up prompt is another run, `gemini --resume latest -p PROMPT` (the same
//   conversation, a new process: a new MCP server and a new idemgate).
// - Its stop (end of a -p run): SIGTERM to each stdio MCP server, its stdin closed 38–372 ms
//   later (over the lab's runs), then Gemini CLI exits (91–454 ms after the SIGTERM) without waiting for
//   the server and never sends SIGKILL: a server that ignores SIGTERM lives on, orphaned (the
//   "stop" test measures it with signal_server.mjs). So idemgate's own grace is the only bound on
//   its stop.
// - Measured once, not asserted here: without the prompt hook two prompts with the same charge
//   gave 1 execution and 3 replays (the second prompt's charge answered from the first, by its
//   arguments); a BeforeAgent hook that fails blocks the prompt ("Agent execution blocked: …")
//   while `gemini -p` still exits 0. Hooks need no setting to run (hooksConfig.enabled defaults
//   to true in its settings schema).
// - Before the main request it asks its model router's classifier (…:generateContent, JSON with
//   a complexity score); the scripted model answers it (models/gemini.mjs).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import {
  HERE,
  IDEMGATE,
  REPLAY_SENTENCE,
  alive,
  assertInstalled,
  chargeScript,
  defer,
  executions,
  exampleServer,
  hasCommand,
  hostMeta,
  installHost,
  killPid,
  labDirs,
  outcomes,
  readAudit,
  requireIdemgate,
  startHost,
} from './lib.mjs';
import { killLeftoversAfter, leftoversGone } from './leftovers.mjs';
import { assertTwinCallsRanOnce } from './outcomes.mjs';
import { startModel } from './models/gemini.mjs';

const GEMINI_JS = path.join(HERE, 'node_modules/@google/gemini-cli/bundle/gemini.js');
const SIGNAL_SERVER = path.join(HERE, 'signal_server.mjs');

const settingsFile = (d) => path.join(d.home, '.gemini/settings.json');

/** The API key auth Gemini CLI asks for, and no update checks or usage statistics. */
function writeSettings(d) {
  fs.mkdirSync(path.dirname(settingsFile(d)), { recursive: true, mode: 0o700 });
  const settings = {
    security: { auth: { selectedType: 'gemini-api-key' } },
    general: { enableAutoUpdate: false, enableAutoUpdateNotification: false },
    privacy: { usageStatisticsEnabled: false },
  };
  fs.writeFileSync(settingsFile(d), JSON.stringify(settings, null, 2) + '\n', { mode: 0o600 });
}

/** A lab dir with the example server installed behind idemgate, and a scripted model. */
async function setUp(t, decide = chargeScript(), more = () => ({})) {
  requireIdemgate();
  const d = labDirs(t, 'idemgate-gemini-');
  killLeftoversAfter(t, d.dir);
  const model = await startModel(decide);
  defer(t, () => model.close());
  writeSettings(d);
  await installHost('gemini-cli', d, { example: exampleServer(d) });
  // Servers not behind idemgate.
  const settings = JSON.parse(fs.readFileSync(settingsFile(d), 'utf8'));
  Object.assign(settings.mcpServers, more(d));
  fs.writeFileSync(settingsFile(d), JSON.stringify(settings, null, 2) + '\n');
  return { d, model };
}

/** Starts one `gemini -p` run (with `resume: true`, the next prompt of the last conversation). */
function startGemini(t, d, model, prompt, { resume = false } = {}) {
  const args = [GEMINI_JS, '--yolo', ...(resume ? ['--resume', 'latest'] : []), '-p', prompt];
  const host = startHost(t, process.execPath, args, {
    env: {
      ...d.env,
      GOOGLE_GEMINI_BASE_URL: model.url,
      GEMINI_API_KEY: 'lab-key',
      GEMINI_CLI_TRUST_WORKSPACE: 'true',
    },
    cwd: d.project,
  });
  host.end();
  return host;
}

/** Runs one prompt and resolves once Gemini CLI and every MCP server it started are gone. */
async function prompt(t, d, model, text, opts) {
  const host = startGemini(t, d, model, text, opts);
  const run = await host.done();
  assert.equal(run.code, 0, `gemini exited ${run.code ?? run.signal}\n${host.output()}`);
  assert.match(run.stdout, /done/, `the scripted conversation ended\n${host.output()}`);
  await leftoversGone(d.dir); // Gemini CLI does not wait for its servers to exit
  return run;
}

/** Gemini CLI's _meta, as the example server received it. */
function assertMetaShape(d) {
  const metas = hostMeta(d.ledger);
  assert.ok(metas.length > 0, 'at least one execution');
  for (const m of metas) {
    assert.deepEqual(Object.keys(m), ['progressToken'], JSON.stringify(m));
    assert.match(m.progressToken, /^[0-9a-f-]{36}$/, 'a random UUID');
  }
  return metas;
}

const replays = (model) => model.toolResults.map((r) => r.text.includes(REPLAY_SENTENCE));

test('Gemini CLI: set up by idemgate install, a model retry within a prompt runs once, and the retry is logged as replayed', async (t) => {
  const { d, model } = await setUp(t);
  // The settings Gemini CLI ran with are the install command's work: the server wrapped, the hook.
  assertInstalled('gemini-cli', d, 'example', exampleServer(d));
  await prompt(t, d, model, 'Please charge the customer.');
  assert.equal(executions(d.ledger), 1, 'the retry did not charge again');
  // Read right after Gemini CLI and its servers are gone: nothing may be missing.
  const attempts = await readAudit(d.store, { tool: 'charge' });
  assert.deepEqual(outcomes(attempts), { claimed: 1, executed: 1, replayed: 1 }, JSON.stringify(attempts));
  // The replay sentence reached the model with the retry's result.
  assert.deepEqual(replays(model), [false, true], JSON.stringify(model.toolResults));
  for (const r of model.toolResults) assert.ok(!r.isError, r.text);
  t.diagnostic(`_meta: ${JSON.stringify(assertMetaShape(d)[0])}; detail: ${attempts.map((a) => a.detail).join(' | ')}`);
});

test('Gemini CLI: two prompts (gemini -p, then gemini --resume latest -p), a retry in each: 2 executions, 2 replayed', async (t) => {
  assert.ok(hasCommand('hook'), `${IDEMGATE} has no \`idemgate hook\` (issue 35 item 2): Gemini CLI sends no turn id, so without the prompt hook the second prompt's charge is replayed from the first`);
  const { d, model } = await setUp(t);
  await prompt(t, d, model, 'Please charge the customer.');
  await prompt(t, d, model, 'Please charge the customer again.', { resume: true });
  assert.equal(executions(d.ledger), 2, 'the second prompt charged again; each retry did not');
  const attempts = await readAudit(d.store, { tool: 'charge' });
  assert.deepEqual(outcomes(attempts), { claimed: 2, executed: 2, replayed: 2 }, JSON.stringify(attempts));
  for (const a of attempts) assert.match(a.detail ?? '', /hook:turn/, `scoped by the prompt hook: ${JSON.stringify(a)}`);
  assert.deepEqual(replays(model), [false, true, false, true], JSON.stringify(model.toolResults));
  assertMetaShape(d);
});

test('Gemini CLI: two identical tool calls in one model message run once', async (t) => {
  const { d, model } = await setUp(t);
  await prompt(t, d, model, 'Please charge the customer twice at once.');
  t.diagnostic(`outcomes: ${JSON.stringify(await assertTwinCallsRanOnce(d, model))}`);
});

test('Gemini CLI: its own stop (SIGTERM, then stdin closed, no SIGKILL) leaves no attempt unlogged', async (t) => {
  const signalLog = (d) => path.join(d.dir, 'signals.jsonl');
  const { d, model } = await setUp(t, chargeScript(), (d) => ({
    recorder: { command: 'node', args: [SIGNAL_SERVER], env: { SIGNAL_LOG: signalLog(d) } },
  }));
  const host = startGemini(t, d, model, 'Please charge the customer.');
  const exit = await host.exited;
  assert.equal(exit.code, 0, host.output());
  const events = () => fs.readFileSync(signalLog(d), 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
  const recorder = events()[0].pid;
  // Gemini CLI is gone and sent no SIGKILL: the recorder, which ignores SIGTERM, lives on.
  assert.ok(alive(recorder), `the recorder was killed: ${JSON.stringify(events())}`);
  killPid(recorder);
  await leftoversGone(d.dir); // idemgate and the example server stop on their own
  const goneAt = Date.now();
  const attempts = await readAudit(d.store, { tool: 'charge' });
  assert.deepEqual(outcomes(attempts), { claimed: 1, executed: 1, replayed: 1 }, 'every attempt is in the audit log');

  const after = events();
  const signals = after.filter((e) => e.event.startsWith('SIG'));
  assert.deepEqual(signals.map((e) => e.event), ['SIGTERM'], JSON.stringify(after));
  const end = after.find((e) => e.event === 'stdin-end');
  assert.ok(end, `stdin closed after the SIGTERM: ${JSON.stringify(after)}`);
  t.diagnostic(`stop: SIGTERM, stdin end ${end.ms} ms after it, no SIGKILL; gemini exited ${exit.exitedAt - signals[0].at} ms after the SIGTERM, idemgate was gone ${goneAt - signals[0].at} ms after it`);
});
