// An agent SDK's MCP client: the OpenAI Agents SDK (@openai/agents, version pinned in
// package.json) running in this process, its MCPServerStdio starting the real idemgate binary in
// front of the example MCP server, its model the scripted OpenAI Responses API
// (models/openai_responses.mjs; the SDK's plain `run` asks `stream: false`).
//
// Measured with @openai/agents 0.20.0 (its MCP client is @modelcontextprotocol/client 2.x; this
// file's tests assert each):
// - `_meta` of tools/call: none at all — no `_meta` member, not even a progressToken — unless
//   the application passes a `toolMetaResolver` to MCPServerStdio, whose object becomes the
//   call's `_meta`. So idemgate finds no turn, no session and no call id: the key falls back to
//   the arguments for `window` (1 h). A retry within a run is replayed; so is a deliberate
//   identical repeat in the next run, on the same connection or a new one. An application that
//   wants the repeat to run gives each run a turn id:
//       toolMetaResolver: ({ runContext }) => ({ 'dev.idemgate/turnId': runContext.context.turnId })
//   and the "turn id per run" test shows it works.
// - `clientInfo.name` in initialize is the MCPServerStdio's `name`, not the SDK's.
// - It first probes the 2026-07-28 dialect (`server/discover`); when that fails it stops that
//   process and starts the server again with `initialize`: two idemgate processes (and two
//   example servers) per connect().
// - Its stop (`server.close()`): stdin closed; if the process is still there 2 s later SIGTERM;
//   2 s after that SIGKILL (@modelcontextprotocol/client's StdioClientTransport.close; the "stop"
//   test measures it with signal_server.mjs).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { Agent, MCPServerStdio, OpenAIResponsesModel, run, setTracingDisabled } from '@openai/agents';
import OpenAI from 'openai';
import {
  EXAMPLE_SERVER,
  HERE,
  IDEMGATE,
  REPLAY_SENTENCE,
  chargeScript,
  defer,
  executions,
  hostMeta,
  labDirs,
  outcomes,
  pidGone,
  readAudit,
  readLedger,
  readPids,
  requireIdemgate,
} from './lib.mjs';
import { assertTwinCallsRanOnce } from './outcomes.mjs';
import { startModel } from './models/openai_responses.mjs';

const SIGNAL_SERVER = path.join(HERE, 'signal_server.mjs');

setTracingDisabled(true); // no trace export to api.openai.com

/** An agent on the scripted model (its own client: the SDK's default one outlives a test). */
function labAgent(model, server) {
  const client = new OpenAI({ apiKey: 'lab-key', baseURL: model.url, maxRetries: 0 });
  return new Agent({
    name: 'lab',
    instructions: 'Use the tools.',
    mcpServers: [server],
    model: new OpenAIResponsesModel(client, 'scripted-model'),
  });
}

/**
 * A lab dir, a scripted model, and `idemgate mcp` in front of the
 * example server as an MCPServerStdio (connected; closed when the test ends). `serverOpts` is
 * passed on to MCPServerStdio (toolMetaResolver).
 */
async function setUp(t, { decide = chargeScript(), serverOpts = {} } = {}) {
  requireIdemgate();
  const d = labDirs(t, 'idemgate-agents-');
  const model = await startModel(decide);
  defer(t, () => model.close());
  const server = new MCPServerStdio({
    name: 'example',
    command: IDEMGATE,
    args: ['mcp', '--store', d.store, '--', 'node', EXAMPLE_SERVER],
    env: { ...d.env, EXAMPLE_LEDGER: d.ledger },
    cwd: d.project,
    ...serverOpts,
  });
  await server.connect();
  defer(t, () => server.close());
  return { d, model, server, agent: labAgent(model, server) };
}

async function runPrompt(agent, prompt, options) {
  const result = await run(agent, prompt, options);
  assert.equal(result.finalOutput, 'done', 'the scripted conversation ended');
  return result;
}

const replays = (model) => model.toolResults.map((r) => r.text.includes(REPLAY_SENTENCE));

test('Agents SDK: a model retry within a run executes once, is logged as replayed, and the model reads the replay sentence', async (t) => {
  const { d, model, server, agent } = await setUp(t);
  await runPrompt(agent, 'Please charge the customer.');
  await server.close(); // the SDK's own stop; the audit log is read right after it
  assert.equal(executions(d.ledger), 1, 'the retry did not charge again');
  const attempts = await readAudit(d.store, { tool: 'charge' });
  assert.deepEqual(outcomes(attempts), { claimed: 1, executed: 1, replayed: 1 }, JSON.stringify(attempts));
  assert.deepEqual(replays(model), [false, true], JSON.stringify(model.toolResults));
  // It started the server twice: once for its server/discover probe, once with initialize.
  assert.equal(readPids(d.ledger).length, 2, 'two example servers started');
  // What it sends: no _meta at all.
  assert.deepEqual(readLedger(d.ledger).map((e) => e.meta && Object.keys(e.meta).filter((k) => !k.startsWith('dev.idemgate/'))), [[]]);
  t.diagnostic(`_meta: ${JSON.stringify(hostMeta(d.ledger)[0])}; detail: ${attempts.map((a) => a.detail).join(' | ')}`);
});

test('Agents SDK: it sends no turn id, so a deliberate repeat in the next run is replayed too (args fallback)', async (t) => {
  const { d, model, server, agent } = await setUp(t);
  await runPrompt(agent, 'Please charge the customer.');
  await runPrompt(agent, 'Please charge the customer again.');
  await server.close();
  assert.equal(executions(d.ledger), 1, 'the second run’s charge was answered from the first');
  const attempts = await readAudit(d.store, { tool: 'charge' });
  assert.deepEqual(outcomes(attempts), { claimed: 1, executed: 1, replayed: 3 }, JSON.stringify(attempts));
  assert.deepEqual(replays(model), [false, true, true, true], JSON.stringify(model.toolResults));
  t.diagnostic(`detail: ${[...new Set(attempts.map((a) => a.detail))].join(' | ')}`);
});

test('Agents SDK with a turn id per run (toolMetaResolver → dev.idemgate/turnId): 2 runs, a retry in each: 2 executions, 2 replayed', async (t) => {
  const { d, model, server, agent } = await setUp(t, {
    serverOpts: { toolMetaResolver: ({ runContext }) => ({ 'dev.idemgate/turnId': runContext.context.turnId }) },
  });
  await runPrompt(agent, 'Please charge the customer.', { context: { turnId: 'run-1' } });
  await runPrompt(agent, 'Please charge the customer again.', { context: { turnId: 'run-2' } });
  await server.close();
  assert.equal(executions(d.ledger), 2, 'the second run charged again; each retry did not');
  const attempts = await readAudit(d.store, { tool: 'charge' });
  assert.deepEqual(outcomes(attempts), { claimed: 2, executed: 2, replayed: 2 }, JSON.stringify(attempts));
  for (const a of attempts) assert.match(a.detail ?? '', /dev\.idemgate\/turnId/, JSON.stringify(a));
  assert.deepEqual(replays(model), [false, true, false, true], JSON.stringify(model.toolResults));
});

test('Agents SDK: two identical tool calls in one model message run once', async (t) => {
  const { d, model, server, agent } = await setUp(t);
  await runPrompt(agent, 'Please charge the customer twice at once.');
  await server.close();
  t.diagnostic(`outcomes: ${JSON.stringify(await assertTwinCallsRanOnce(d, model))}`);
});

test('Agents SDK: its stop (close(): stdin closed, SIGTERM after 2 s, SIGKILL after 2 s more) leaves no attempt unlogged', async (t) => {
  const { d, server, agent } = await setUp(t);
  await runPrompt(agent, 'Please charge the customer.');
  const began = Date.now();
  await server.close();
  const closeMs = Date.now() - began;
  const attempts = await readAudit(d.store, { tool: 'charge' });
  assert.deepEqual(outcomes(attempts), { claimed: 1, executed: 1, replayed: 1 }, 'every attempt is in the audit log');
  assert.ok(closeMs < 2000, `idemgate stopped on the end of its stdin, before the SDK's SIGTERM (${closeMs} ms)`);

  // The SDK's escalation, measured on a server that ignores signals and its stdin's end.
  const log = path.join(d.dir, 'signals.jsonl');
  const recorder = new MCPServerStdio({ name: 'recorder', command: process.execPath, args: [SIGNAL_SERVER], env: { ...d.env, SIGNAL_LOG: log } });
  await recorder.connect();
  const closing = Date.now();
  await recorder.close();
  const took = Date.now() - closing;
  const events = fs.readFileSync(log, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
  const start = events.filter((e) => e.event === 'start').at(-1);
  assert.deepEqual(events.filter((e) => e.event !== 'start').map((e) => e.event).slice(-2), ['stdin-end', 'SIGTERM'], JSON.stringify(events));
  // close() sends the SIGKILL and returns without waiting for the process to die: wait for it
  // (the recorder ignores its stdin's end and SIGTERM, so only the SIGKILL ends it).
  await pidGone(start.pid, 5000);
  assert.ok(took >= 3900 && took < 6000, `close() took ${took} ms`);
  t.diagnostic(`stop: stdin end, SIGTERM 2 s later, SIGKILL 2 s after that (close() took ${took} ms); idemgate stopped ${closeMs} ms after its stdin ended`);
});
