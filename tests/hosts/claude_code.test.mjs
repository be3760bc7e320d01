// The real Claude Code (@anthropic-ai/claude-code, version pinned in package.json), driven by the
// scripted Anthropic Messages API (models/anthropic.mjs) on loopback, through the real idemgate
// binary in front of the example MCP server, set up by the real `idemgate install claude-code`
// (lib.mjs installHost: the server written into ~/.claude.json under a temp HOME as a user has
// it, then wrapped, and the UserPromptSubmit hook added to ~/.claude/settings.json, by the
// install command).
//
// Measured with 2.1.328 (this file's tests assert each; `tests/hosts/run.sh claude_code.test.mjs`):
// - `_meta` of tools/call: {"progressToken": N, "claudecode/toolUseId": "<the model's tool_use
//   id>"} — no turn, no session; the stdio server's environment has CLAUDE_CODE_SESSION_ID
//   (one per process). The same over Streamable HTTP ("type": "http").
// - Its stop (end of a -p run): SIGINT to each stdio MCP server; if it is still alive 100 ms
//   later SIGTERM (measured 95-106 ms); 400 ms after that SIGKILL (the process exited ~527-660
//   ms after its SIGINT, once the escalation was over). idemgate has 100 ms after SIGINT before
//   the escalation, and ~500 ms before SIGKILL.
// - A tool result with structuredContent reaches the model as JSON.stringify(structuredContent)
//   alone: the content blocks, idemgate's "[idemgate] …" replay sentence among them, are not
//   sent. For a tool without structuredContent the sentence reaches the model.
// - -p does not wait for HTTP MCP servers before its first model request unless
//   MCP_CONNECTION_NONBLOCKING=false.
// - Two prompts in one process: `-p --input-format stream-json --output-format stream-json
//   --verbose`, one user message written after the previous prompt's "result" line.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import {
  CLAUDE_BIN,
  HERE,
  HOST_TIMEOUT_MS,
  IDEMGATE,
  REPLAY_SENTENCE,
  assertInstalled,
  chargeScript,
  defer,
  executions,
  EXAMPLE_SERVER,
  exampleServer,
  hasCommand,
  hostMeta,
  installHost,
  labDirs,
  outcomes,
  readAudit,
  requireIdemgate,
  startHost,
} from './lib.mjs';
import { startModel } from './models/anthropic.mjs';

const SIGNAL_SERVER = path.join(HERE, 'signal_server.mjs');

/** Claude Code's environment for a lab dir and a scripted model: offline, MCP tools in view. */
function claudeEnv(d, model) {
  return {
    ...d.env,
    ANTHROPIC_BASE_URL: model.url,
    ANTHROPIC_API_KEY: 'lab-key',
    ENABLE_TOOL_SEARCH: 'false', // otherwise MCP tools hide behind its tool search
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
    DISABLE_AUTOUPDATER: '1',
    // -p sends the first model request without waiting for HTTP MCP servers to connect (their
    // tools are missing from it); this makes it wait, as it does for stdio servers.
    MCP_CONNECTION_NONBLOCKING: 'false',
  };
}

/** One stream-json user message. */
const userLine = (text) =>
  JSON.stringify({ type: 'user', message: { role: 'user', content: [{ type: 'text', text }] } }) + '\n';

/** The stream-json "result" lines so far. */
const resultLines = (text) =>
  text
    .split('\n')
    .filter((l) => l.startsWith('{') && l.includes('"type":"result"'))
    .map((l) => JSON.parse(l));

/**
 * Claude Code's own log of each MCP server (under XDG_CACHE_HOME: connection, calls, the
 * server's stderr, why it failed), for a failing test's message.
 */
function mcpLogs(d) {
  const root = path.join(d.env.XDG_CACHE_HOME, 'claude-cli-nodejs');
  const lines = [];
  for (const project of fs.existsSync(root) ? fs.readdirSync(root) : []) {
    for (const dir of fs.readdirSync(path.join(root, project)).filter((n) => n.startsWith('mcp-logs-'))) {
      for (const file of fs.readdirSync(path.join(root, project, dir))) {
        for (const line of fs.readFileSync(path.join(root, project, dir, file), 'utf8').split('\n').filter(Boolean)) {
          const e = JSON.parse(line);
          lines.push(`${e.timestamp} ${dir.slice('mcp-logs-'.length)}: ${e.debug ?? e.error ?? line}`);
        }
      }
    }
  }
  return `--- Claude Code's MCP server logs:\n${lines.sort().join('\n')}`;
}

/**
 * Runs one Claude Code process over `prompts`: each written once the previous one's result line
 * came, then stdin closed, which ends the run. Resolves once Claude Code and every MCP server it
 * started are gone: { run, results } (run: lib.mjs startHost().done()).
 */
async function session(t, d, model, prompts) {
  const host = startHost(
    t,
    CLAUDE_BIN,
    ['-p', '--input-format', 'stream-json', '--output-format', 'stream-json', '--verbose',
      '--allowedTools', 'mcp__idem__charge,mcp__idem__create_ticket'],
    { env: claudeEnv(d, model), cwd: d.project },
  );
  for (let i = 0; i < prompts.length; i++) {
    host.write(userLine(prompts[i]));
    try {
      await host.stdout.waitFor((s) => resultLines(s).length > i, HOST_TIMEOUT_MS);
    } catch (e) {
      e.message += `\n${host.output()}\n${mcpLogs(d)}`;
      throw e;
    }
    // A prompt hook that fails blocks the prompt: Claude Code answers without asking the model.
    assert.ok(model.decisions.some((x) => x.prompt === prompts[i]),
      `prompt ${i + 1} never reached the model (blocked by a hook?)\n${host.output()}`);
  }
  host.end();
  const run = await host.done();
  const results = resultLines(run.stdout);
  assert.equal(results.length, prompts.length, `one result per prompt\n${host.output()}`);
  for (const r of results) assert.equal(r.is_error, false, `a prompt failed: ${JSON.stringify(r)}`);
  assert.equal(run.code, 0, `claude exited ${run.code ?? run.signal}\n${host.output()}`);
  return { run, results };
}

/** A lab dir with the example server installed behind idemgate, and a scripted model. */
async function setUp(t, decide = chargeScript()) {
  requireIdemgate();
  const d = labDirs(t, 'idemgate-claude-');
  await installHost('claude-code', d, { idem: exampleServer(d) });
  const model = await startModel(decide);
  defer(t, () => model.close());
  return { d, model };
}

/** Claude Code's _meta, as the example server received it: its keys only (values vary). */
function assertMetaShape(d) {
  const metas = hostMeta(d.ledger);
  assert.ok(metas.length > 0, 'at least one execution');
  for (const m of metas) {
    assert.deepEqual(Object.keys(m).sort(), ['claudecode/toolUseId', 'progressToken'], JSON.stringify(m));
    assert.match(m['claudecode/toolUseId'], /^toolu_lab_/, 'the model’s tool_use id is passed on');
  }
  return metas;
}

/** The charge ids the model saw, one per tool result (Claude Code hands it structuredContent). */
const chargeIds = (model) => model.toolResults.map((r) => JSON.parse(r.text).id);

test('Claude Code: set up by idemgate install, a model retry within a prompt runs once, and the retry is logged as replayed', async (t) => {
  const { d, model } = await setUp(t);
  // The settings Claude Code ran with are the install command's work: the server wrapped, the hook.
  assertInstalled('claude-code', d, 'idem', exampleServer(d));
  await session(t, d, model, ['Please charge the customer.']);
  assert.equal(executions(d.ledger), 1, 'the retry did not charge again');
  // Read right after Claude Code stopped idemgate: nothing may be missing.
  const attempts = await readAudit(d.store, { tool: 'charge' });
  assert.deepEqual(outcomes(attempts), { claimed: 1, executed: 1, replayed: 1 }, JSON.stringify(attempts));
  // The model got the first charge back for its retry. charge has an outputSchema: Claude Code
  // hands the model JSON.stringify(structuredContent) alone, so idemgate's replay sentence (a
  // content block) does not reach it; the next test shows it does for a tool without one.
  assert.equal(model.toolResults.length, 2);
  const [first, retry] = chargeIds(model);
  assert.equal(retry, first, JSON.stringify(model.toolResults));
  assert.ok(!model.toolResults[1].isError);
  t.diagnostic(`replay sentence in the retry's result: ${model.toolResults[1].text.includes(REPLAY_SENTENCE)}`);
  t.diagnostic(`_meta: ${JSON.stringify(assertMetaShape(d)[0])}`);
});

test('Claude Code: the replay sentence reaches the model (a tool without structuredContent)', async (t) => {
  const { d, model } = await setUp(t, chargeScript({ tool: 'create_ticket', args: { title: 'lab' }, ask: /ticket/i }));
  await session(t, d, model, ['Please open a ticket.']);
  assert.equal(executions(d.ledger, 'create_ticket'), 1, 'the retry did not open a second ticket');
  const [first, retry] = model.toolResults;
  assert.ok(!first.text.includes(REPLAY_SENTENCE), first.text);
  assert.ok(retry.text.includes(REPLAY_SENTENCE), retry.text);
  assert.ok(retry.text.startsWith(first.text), 'the stored result, then the sentence');
  const attempts = await readAudit(d.store, { tool: 'create_ticket' });
  assert.deepEqual(outcomes(attempts), { claimed: 1, executed: 1, replayed: 1 }, JSON.stringify(attempts));
});

test('Claude Code: two prompts in one process, a retry in each: 2 executions, 2 replayed', async (t) => {
  assert.ok(hasCommand('hook'), `${IDEMGATE} has no \`idemgate hook\` (issue 35 item 2): Claude Code sends no turn id, so without the prompt hook the second prompt's charge is replayed from the first`);
  const { d, model } = await setUp(t);
  await session(t, d, model, ['Please charge the customer.', 'Please charge the customer again.']);
  assert.equal(executions(d.ledger), 2, 'the second prompt charged again; each retry did not');
  const attempts = await readAudit(d.store, { tool: 'charge' });
  assert.deepEqual(outcomes(attempts), { claimed: 2, executed: 2, replayed: 2 }, JSON.stringify(attempts));
  for (const a of attempts) assert.match(a.detail ?? '', /hook:turn/, `scoped by the prompt hook: ${JSON.stringify(a)}`);
  // Each retry got its own prompt's charge back.
  const [a, aRetry, b, bRetry] = chargeIds(model);
  assert.ok(a === aRetry && b === bRetry && a !== b, JSON.stringify(model.toolResults));
  assertMetaShape(d);
});

test('Claude Code: two identical tool calls in one model message run once', async (t) => {
  const { d, model } = await setUp(t);
  await session(t, d, model, ['Please charge the customer twice at once.']);
  assert.equal(executions(d.ledger), 1, 'one charge for two identical calls');
  const attempts = await readAudit(d.store, { tool: 'charge' });
  // The second call is answered from the first: replayed, or attached if it came while the
  // first still ran.
  const n = outcomes(attempts);
  assert.equal(n.executed, 1, JSON.stringify(attempts));
  assert.equal((n.replayed ?? 0) + (n.attached ?? 0), 1, JSON.stringify(attempts));
  assert.equal(model.toolResults.length, 2);
  for (const r of model.toolResults) assert.ok(!r.isError, r.text);
  t.diagnostic(`outcomes: ${JSON.stringify(n)}`);
});

test('Claude Code: its own stop (SIGINT, then SIGTERM, then SIGKILL) leaves no attempt unlogged', async (t) => {
  const { d, model } = await setUp(t);
  // Beside idemgate, a server that records the signals Claude Code sends and ignores them.
  const log = path.join(d.dir, 'signals.jsonl');
  const file = path.join(d.home, '.claude.json');
  const settings = JSON.parse(fs.readFileSync(file, 'utf8'));
  settings.mcpServers.recorder = { command: 'node', args: [SIGNAL_SERVER], env: { SIGNAL_LOG: log } };
  fs.writeFileSync(file, JSON.stringify(settings, null, 2));

  const { run } = await session(t, d, model, ['Please charge the customer.']);
  // The audit log as it is the moment Claude Code and its servers are gone.
  const attempts = await readAudit(d.store, { tool: 'charge' });
  assert.deepEqual(outcomes(attempts), { claimed: 1, executed: 1, replayed: 1 }, 'every attempt is in the audit log');

  const events = fs.readFileSync(log, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
  const signals = events.filter((e) => e.event.startsWith('SIG'));
  assert.deepEqual(signals.map((e) => e.event), ['SIGINT', 'SIGTERM'], JSON.stringify(events));
  const pid = events[0].pid;
  assert.ok(!fs.existsSync(`/proc/${pid}`) || fs.readFileSync(`/proc/${pid}/stat`, 'utf8').includes(') Z'),
    'the recorder, which ignores SIGINT and SIGTERM, was SIGKILLed');
  // Measured, not assumed: the escalation's delays (the source says 100 ms and 400 ms).
  const sigterm = signals[1].ms;
  assert.ok(sigterm >= 50 && sigterm < 1000, `SIGTERM ${sigterm} ms after SIGINT`);
  // Claude Code exits once its cleanup is over: after the SIGKILL.
  const exitAfter = run.exitedAt - signals[0].at;
  assert.ok(exitAfter >= sigterm, `claude exited ${exitAfter} ms after its SIGINT`);
  t.diagnostic(`stop: SIGINT, SIGTERM after ${sigterm} ms, SIGKILL; claude exited ${exitAfter} ms after the SIGINT`);
});

test('Claude Code over Streamable HTTP ("type": "http") to idemgate mcp --listen: a retry replays', async (t) => {
  requireIdemgate();
  const d = labDirs(t, 'idemgate-claude-http-');
  const proxy = startHost(t, IDEMGATE, ['mcp', '--store', d.store, '--listen', '127.0.0.1:0', '--', 'node', EXAMPLE_SERVER], {
    env: { ...d.env, EXAMPLE_LEDGER: d.ledger },
    cwd: d.project,
  });
  const [, url] = await proxy.stderr.waitFor(/idemgate: listening on (http:\/\/127\.0\.0\.1:\d+\/mcp)/, 15000);
  await installHost('claude-code', d, { idem: { type: 'http', url } });
  const model = await startModel(chargeScript());
  defer(t, () => model.close());

  await session(t, d, model, ['Please charge the customer.']);
  assert.equal(executions(d.ledger), 1, 'the retry did not charge again');
  const [first, retry] = chargeIds(model);
  assert.equal(retry, first, JSON.stringify(model.toolResults));
  // The proxy outlives the host: stop it the way an operator does, then read its audit log.
  process.kill(proxy.pid, 'SIGTERM');
  const stopped = await proxy.done();
  assert.equal(stopped.code, 0, `idemgate mcp --listen exited ${stopped.code ?? stopped.signal}\n${proxy.output()}`);
  const attempts = await readAudit(d.store, { tool: 'charge' });
  assert.deepEqual(outcomes(attempts), { claimed: 1, executed: 1, replayed: 1 }, JSON.stringify(attempts));
  t.diagnostic(`_meta over HTTP: ${JSON.stringify(assertMetaShape(d)[0])}`);
});
