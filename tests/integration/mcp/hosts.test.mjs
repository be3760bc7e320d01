// Real MCP hosts out of the box (docs/hosts.md): for each host, an SDK client builds tools/call
// the way that host's source does (docs/hosts-evidence.md quotes it), through `idemgate mcp` in
// front of the example server, whose ledger counts real executions.
//
// For each: a retry in one turn runs once; the same call in the next turn runs again; and the
// attempt log names the source that scoped the key.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { test } from 'node:test';
import {
  EXAMPLE_SERVER,
  IDEMGATE,
  connectStdio,
  isReplay,
  killExampleServersAfter,
  readLedger,
  requireIdemgate,
  tempDir,
  until,
} from './helpers.mjs';

const run = promisify(execFile);
const ARGS = { customer: 'cus_7', amount_cents: 990, currency: 'EUR' };

/** `idemgate mcp` on a store of `dir` in front of the example server; `env` for both. */
async function host(t, dir, { env = {}, ledger = 'ledger.jsonl' } = {}) {
  requireIdemgate();
  const file = path.join(dir, ledger);
  killExampleServersAfter(t, file);
  const store = `sqlite:${path.join(dir, 'idem.db')}`;
  const conn = await connectStdio(t, {
    command: IDEMGATE,
    args: ['mcp', '--store', store, '--', 'node', EXAMPLE_SERVER],
    env: { EXAMPLE_LEDGER: file, ...env },
  });
  const charge = (meta, args = ARGS) =>
    conn.client.callTool({ name: 'charge', arguments: args, ...(meta ? { _meta: meta } : {}) });
  const executions = () => readLedger(file).filter((e) => e.tool === 'charge').length;
  // Waits until an attempt of the audit log has a detail with `prefix` in it (the log is
  // written in batches, every 200 ms), and returns every detail.
  const hasDetail = (prefix) =>
    until(
      async () => {
        const { stdout } = await run(IDEMGATE, ['audit', '--json', '--store', store, '--tool', 'charge']);
        const details = stdout.split('\n').filter(Boolean).map((l) => JSON.parse(l).detail ?? '');
        return details.some((d) => d.includes(prefix)) && details;
      },
      { what: `an attempt whose detail has "${prefix}"` },
    );
  return { ...conn, charge, executions, hasDetail };
}

/** The scenario every turn-scoped host gets: retry once, next turn again. */
async function turnScenario(h, metaOf) {
  const first = await h.charge(metaOf('turn-1'));
  assert.ok(!first.isError && !isReplay(first), JSON.stringify(first));
  const retry = await h.charge(metaOf('turn-1'));
  assert.ok(isReplay(retry), `the retry in the same turn replays: ${JSON.stringify(retry)}`);
  assert.equal(h.executions(), 1, 'the retry did not charge again');
  const next = await h.charge(metaOf('turn-2'));
  assert.ok(!next.isError && !isReplay(next), `the next turn charges: ${JSON.stringify(next)}`);
  assert.equal(h.executions(), 2);
}

test('VS Code / Copilot chat: vscode.requestId is the turn', async (t) => {
  const h = await host(t, tempDir(t));
  const conversation = randomUUID();
  // McpTool._callWithProgress: a fresh progressToken per attempt, the chat session and request.
  await turnScenario(h, (turn) => ({
    progressToken: randomUUID(),
    'vscode.conversationId': conversation,
    'vscode.requestId': turn,
    traceparent: `00-${randomUUID().replace(/-/g, '')}-${randomUUID().slice(0, 16).replace(/-/g, '0')}-01`,
  }));
  // The regressed build sent no conversationId: the request id alone still scopes.
  const alone = await h.charge({ progressToken: randomUUID(), 'vscode.requestId': 'turn-2' });
  assert.ok(isReplay(alone), JSON.stringify(alone));
  await h.hasDetail('turn: meta:vscode.requestId');
});

test('Codex: x-codex-turn-metadata.turn_id is the turn, whatever else the object carries', async (t) => {
  const h = await host(t, tempDir(t));
  const thread = randomUUID();
  let asked = false;
  await turnScenario(h, (turn) => {
    // build_mcp_tool_call_request_meta: the turn metadata as an object, and threadId. Within a
    // turn the object changes (git enrichment fills workspaces in; a question to the user
    // adds user_input_requested_during_turn): only turn_id scopes.
    const meta = {
      'x-codex-turn-metadata': {
        session_id: thread,
        thread_id: thread,
        turn_id: turn,
        sandbox: 'seccomp',
        turn_started_at_unix_ms: 1781120000000,
        ...(asked ? { workspaces: { '/repo': { has_changes: true } }, user_input_requested_during_turn: true } : {}),
      },
      threadId: thread,
    };
    asked = !asked;
    return meta;
  });
  await h.hasDetail('turn: meta:x-codex-turn-metadata#/turn_id');
});

test('Codex: a repeated callId joins two requests; new call ids never split a turn', async (t) => {
  const h = await host(t, tempDir(t));
  const meta = (callId) => ({
    'x-codex-turn-metadata': { thread_id: 'th-1', turn_id: 'turn-c', turn_started_at_unix_ms: 1 },
    threadId: 'th-1',
    callId,
  });
  const first = await h.charge(meta('call_1'));
  assert.ok(!first.isError && !isReplay(first), JSON.stringify(first));
  // The same call id with other arguments: the same call (a re-send), the first one's answer.
  const resent = await h.charge(meta('call_1'), { ...ARGS, amount_cents: 991 });
  assert.ok(isReplay(resent), `a repeated callId replays: ${JSON.stringify(resent)}`);
  assert.deepEqual(resent.structuredContent, first.structuredContent, 'the first call\'s answer');
  // Another call id with the same turn and arguments: still the turn's retry, never a new call.
  const retried = await h.charge(meta('call_2'));
  assert.ok(isReplay(retried), `a new callId does not split the turn's retry: ${JSON.stringify(retried)}`);
  assert.equal(h.executions(), 1);
  await h.hasDetail('call id seen: meta:callId');
  await h.hasDetail('turn: meta:x-codex-turn-metadata#/turn_id; call id: meta:callId');
});

test('Goose: a repeated agent-tool-call-request-id is the same call', async (t) => {
  const h = await host(t, tempDir(t));
  const id = 'agent-tool-call-request-id';
  const first = await h.charge({ [id]: 'req_1' });
  const resent = await h.charge({ [id]: 'req_1' }, { ...ARGS, currency: 'USD' });
  assert.ok(!isReplay(first) && isReplay(resent), JSON.stringify(resent));
  assert.deepEqual(resent.structuredContent, first.structuredContent);
  // Another request id, the same arguments: one call all the same (no turn: args mode).
  assert.ok(isReplay(await h.charge({ [id]: 'req_2' })));
  assert.equal(h.executions(), 1);
  await h.hasDetail('call id seen: meta:agent-tool-call-request-id');
});

test('Claude Code: a re-sent toolUseId is the same call; the session scopes model retries', async (t) => {
  const dir = tempDir(t);
  const h = await host(t, dir, { env: { CLAUDE_CODE_SESSION_ID: 'session-A', CLAUDECODE: '1' } });
  const first = await h.charge({ 'claudecode/toolUseId': 'toolu_01', progressToken: 2 });
  assert.ok(!first.isError && !isReplay(first), JSON.stringify(first));
  // A transport re-send keeps the tool-use id: the same call, even with other arguments.
  const resent = await h.charge({ 'claudecode/toolUseId': 'toolu_01', progressToken: 3 }, {
    ...ARGS,
    amount_cents: 991,
  });
  assert.ok(isReplay(resent), `a repeated call id replays: ${JSON.stringify(resent)}`);
  // The model's own retry gets a new tool-use id: keyed by its arguments within the session.
  const retried = await h.charge({ 'claudecode/toolUseId': 'toolu_02', progressToken: 4 });
  assert.ok(isReplay(retried), `the model's retry in the session replays: ${JSON.stringify(retried)}`);
  assert.equal(h.executions(), 1);
  await h.hasDetail('call id seen: meta:claudecode/toolUseId');
  await h.hasDetail('session: env:CLAUDE_CODE_SESSION_ID (no turn id); call id: meta:claudecode/toolUseId');

  // Another Claude Code session (another server process, another environment) charges.
  const other = await host(t, dir, { env: { CLAUDE_CODE_SESSION_ID: 'session-B' } });
  const again = await other.charge({ 'claudecode/toolUseId': 'toolu_03' });
  assert.ok(!again.isError && !isReplay(again), JSON.stringify(again));
  assert.equal(h.executions(), 2);
});

test('OpenCode 2.x: ai.opencode/sessionID scopes calls to the chat session', async (t) => {
  const h = await host(t, tempDir(t));
  const a = await h.charge({ 'ai.opencode/sessionID': 'ses_a' });
  const retry = await h.charge({ 'ai.opencode/sessionID': 'ses_a' });
  assert.ok(!isReplay(a) && isReplay(retry), JSON.stringify(retry));
  const b = await h.charge({ 'ai.opencode/sessionID': 'ses_b' });
  assert.ok(!b.isError && !isReplay(b), `another session charges: ${JSON.stringify(b)}`);
  assert.equal(h.executions(), 2);
});

test('Gemini CLI and Zed: no turn or session id, so identical calls are one call (args mode)', async (t) => {
  const h = await host(t, tempDir(t));
  await h.charge({ progressToken: randomUUID() }); // Gemini CLI: a random progressToken only
  const gemini = await h.charge({ progressToken: randomUUID() });
  const zed = await h.charge(null); // Zed: meta: None
  assert.ok(isReplay(gemini) && isReplay(zed));
  assert.equal(h.executions(), 1);
  await h.hasDetail('turn fallback: no turn id');
});

test('start-up: once the tools are listed, idemgate says what it gates and how', async (t) => {
  const h = await host(t, tempDir(t));
  await h.client.listTools();
  await h.stderr.waitFor(/idemgate mcp: ids: turn from meta:dev\.idemgate\/turnId/);
  await h.stderr.waitFor(/idemgate mcp: gates charge: mode turn, scoped by the turn id/);
});

test('a re-planned retry (other arguments, same turn) runs again and is counted', async (t) => {
  const dir = tempDir(t);
  const h = await host(t, dir);
  const meta = { 'vscode.requestId': 'turn-r' };
  await h.charge(meta);
  // crewAI#5802: the agent re-plans and the model rounds the amount: a new key, so it runs.
  const replanned = await h.charge(meta, { ...ARGS, amount_cents: 1000 });
  assert.ok(!replanned.isError && !isReplay(replanned), JSON.stringify(replanned));
  assert.equal(h.executions(), 2);
  await h.hasDetail('re-planned: earlier key ');
  const store = `sqlite:${path.join(dir, 'idem.db')}`;
  const { stdout } = await run(IDEMGATE, ['stats', '--json', '--store', store, '--tool', 'charge']);
  const stats = JSON.parse(stdout.trim().split('\n')[0]);
  assert.equal(stats.executed_again, 1, stdout);
  assert.equal(stats.executed, 1, stdout);
});
