// The prompt hook (docs/hosts.md, "Prompt hook"): this test process plays the agent host. Like
// Claude Code and Gemini CLI it starts `idemgate mcp -- node server.js` as its child, and before
// each user prompt runs `sh -c "idemgate hook"` with the host's JSON on stdin; the proxy scopes
// gated calls by the turn the hook recorded for its host (this process), so a retry within a
// prompt replays and the same call in the next prompt runs again.
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
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

/** A config file in `dir` naming the hook directory (and `more` lines of [mcp]). */
function configIn(dir, more = '') {
  const file = path.join(dir, 'idemgate.toml');
  fs.writeFileSync(file, `[mcp]\nhook_dir = ${JSON.stringify(path.join(dir, 'hooks'))}\n${more}`);
  return file;
}

/**
 * Runs `sh -c "idemgate hook …"` as the hosts do, with `input` on stdin. Resolves with its exit
 * code, stdout and stderr.
 */
function runHook(args, input, env = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn('sh', ['-c', '"$0" hook "$@"', IDEMGATE, ...args], {
      env: { ...process.env, ...env },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c) => (stdout += c));
    child.stderr.on('data', (c) => (stderr += c));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
    child.stdin.on('error', () => {}); // a hook that stopped reading must not fail the test
    child.stdin.end(input);
  });
}

/** What Claude Code sends on UserPromptSubmit (issue #35, measured with 2.1.328). */
function claudeInput(session, promptId, prompt = 'charge cus_7 9.90 EUR') {
  return JSON.stringify({
    session_id: session,
    transcript_path: `/home/u/.claude/projects/w/${session}.jsonl`,
    cwd: '/w',
    permission_mode: 'default',
    hook_event_name: 'UserPromptSubmit',
    prompt,
    prompt_id: promptId,
  });
}

/** What Gemini CLI sends on BeforeAgent (0.61.0): no prompt id. */
function geminiInput(session, prompt = 'charge cus_7 9.90 EUR') {
  return JSON.stringify({
    session_id: session,
    transcript_path: `/home/u/.gemini/tmp/${session}.json`,
    cwd: '/w',
    hook_event_name: 'BeforeAgent',
    timestamp: new Date().toISOString(),
    prompt,
  });
}

/** Asserts what a hook must always do: exit 0 and print nothing on stdout. */
function assertHarmless(r) {
  assert.equal(r.code, 0, `the hook exits 0: ${JSON.stringify(r)}`);
  assert.equal(r.stdout, '', 'the hook prints nothing on stdout (hosts put it into the context)');
}

/** One stderr line starting "idemgate hook: " and containing `what`. */
function assertOneLine(r, what) {
  const lines = r.stderr.split('\n').filter(Boolean);
  assert.equal(lines.length, 1, `one stderr line: ${r.stderr}`);
  assert.match(lines[0], /^idemgate hook: /);
  assert.ok(lines[0].includes(what), `"${what}" in: ${lines[0]}`);
}

/** This process's turn files in `hooks` (its identity is PID-STARTTIME). */
function ownTurnFiles(hooks) {
  return fs.readdirSync(hooks).filter((f) => f.startsWith(`turn-${process.pid}-`));
}

/** `idemgate mcp` with `args` in front of the example server, as a child of this process. */
async function proxy(t, dir, { args = [], env = {} } = {}) {
  requireIdemgate();
  const file = path.join(dir, 'ledger.jsonl');
  killExampleServersAfter(t, file);
  const store = `sqlite:${path.join(dir, 'idem.db')}`;
  const conn = await connectStdio(t, {
    command: IDEMGATE,
    args: ['mcp', '--store', store, ...args, '--', 'node', EXAMPLE_SERVER],
    env: { EXAMPLE_LEDGER: file, ...env },
  });
  const charge = (meta, a = ARGS) =>
    conn.client.callTool({ name: 'charge', arguments: a, ...(meta ? { _meta: meta } : {}) });
  const executions = () => readLedger(file).filter((e) => e.tool === 'charge').length;
  const attempts = async () => {
    const { stdout } = await run(IDEMGATE, ['audit', '--json', '--store', store, '--tool', 'charge']);
    return stdout.split('\n').filter(Boolean).map((l) => JSON.parse(l));
  };
  const details = async () => (await attempts()).map((a) => a.detail ?? '');
  // Waits until an attempt's detail has `text` (the audit log is written in batches).
  const hasDetail = (text) =>
    until(async () => (await details()).some((d) => d.includes(text)), {
      what: `an attempt whose detail has "${text}"`,
    });
  return { ...conn, charge, executions, attempts, details, hasDetail };
}

test('Claude Code with the hook: a retry in a prompt replays, the next prompt charges again', async (t) => {
  const dir = tempDir(t);
  const config = configIn(dir);
  // Claude Code gives its servers CLAUDE_CODE_SESSION_ID: the old fallback, which the hook's
  // turn comes before.
  const p = await proxy(t, dir, {
    args: ['--config', config],
    env: { CLAUDE_CODE_SESSION_ID: 'proc-1', CLAUDECODE: '1' },
  });
  const session = randomUUID();

  const hook1 = await runHook(['--config', config], claudeInput(session, 'prompt-1'));
  assertHarmless(hook1);
  assert.equal(hook1.stderr, '', 'a good input gives no stderr either');
  assert.equal(ownTurnFiles(path.join(dir, 'hooks')).length, 1);
  const first = await p.charge({ 'claudecode/toolUseId': 'toolu_01', progressToken: 1 });
  assert.ok(!first.isError && !isReplay(first), JSON.stringify(first));
  // The model retries: a new tool-use id, the same arguments, the same prompt.
  const retry = await p.charge({ 'claudecode/toolUseId': 'toolu_02', progressToken: 2 });
  assert.ok(isReplay(retry), `the retry in the prompt replays: ${JSON.stringify(retry)}`);
  assert.equal(p.executions(), 1);

  // The user asks again on purpose: the next prompt.
  assertHarmless(await runHook(['--config', config], claudeInput(session, 'prompt-2')));
  const second = await p.charge({ 'claudecode/toolUseId': 'toolu_03', progressToken: 3 });
  assert.ok(!second.isError && !isReplay(second), `the next prompt charges: ${JSON.stringify(second)}`);
  const retry2 = await p.charge({ 'claudecode/toolUseId': 'toolu_04', progressToken: 4 });
  assert.ok(isReplay(retry2), JSON.stringify(retry2));
  assert.equal(p.executions(), 2, 'two prompts, two charges');
  // Once the log has both executions and both replays, every attempt names the hook's turn.
  const logged = await until(
    async () => {
      const all = await p.attempts();
      const count = (o) => all.filter((a) => a.outcome === o).length;
      return count('executed') === 2 && count('replayed') === 2 && all;
    },
    { what: 'two executions and two replays in the audit log' },
  );
  for (const a of logged) {
    assert.equal(a.detail, 'turn: hook:turn (claude-code prompt hook); call id: meta:claudecode/toolUseId');
  }
});

test('Gemini CLI with the hook (default directory): each prompt is a turn of its own', async (t) => {
  const dir = tempDir(t);
  // No config: the default directory, $XDG_RUNTIME_DIR/idemgate.
  const runtime = path.join(dir, 'run');
  fs.mkdirSync(runtime, { mode: 0o700 });
  const env = { XDG_RUNTIME_DIR: runtime };
  const p = await proxy(t, dir, { env });
  const session = randomUUID();
  for (const prompt of [1, 2]) {
    const hook = await runHook([], geminiInput(session), env);
    assertHarmless(hook);
    assert.equal(hook.stderr, '');
    // Gemini CLI sends a random progressToken only.
    const call = await p.charge({ progressToken: randomUUID() });
    assert.ok(!call.isError && !isReplay(call), `prompt ${prompt} charges: ${JSON.stringify(call)}`);
    const retry = await p.charge({ progressToken: randomUUID() });
    assert.ok(isReplay(retry), `the retry in prompt ${prompt} replays: ${JSON.stringify(retry)}`);
  }
  assert.equal(p.executions(), 2);
  await p.hasDetail('turn: hook:turn (gemini-cli prompt hook)');
  const hooks = path.join(runtime, 'idemgate');
  assert.equal(fs.statSync(hooks).mode & 0o777, 0o700);
  const [file] = ownTurnFiles(hooks);
  assert.equal(fs.statSync(path.join(hooks, file)).mode & 0o777, 0o600);
  const turn = JSON.parse(fs.readFileSync(path.join(hooks, file), 'utf8'));
  assert.equal(turn.host, 'gemini-cli');
  assert.equal(turn.session_id, session);
  assert.match(turn.turn_id, new RegExp(`^${session}/[0-9a-f]{32}$`));
});

test('without the hook the old fallback still scopes: the session, one charge', async (t) => {
  const dir = tempDir(t);
  const p = await proxy(t, dir, {
    args: ['--config', configIn(dir)],
    env: { CLAUDE_CODE_SESSION_ID: 'proc-2' },
  });
  await p.charge({ 'claudecode/toolUseId': 'toolu_11' });
  const again = await p.charge({ 'claudecode/toolUseId': 'toolu_12' });
  assert.ok(isReplay(again), JSON.stringify(again));
  assert.equal(p.executions(), 1);
  await p.hasDetail('session: env:CLAUDE_CODE_SESSION_ID (no turn id)');
  // The proxy made the directory (mode 0700) so that nobody else can take its name first.
  assert.equal(fs.statSync(path.join(dir, 'hooks')).mode & 0o777, 0o700);
});

test('a hook directory others may write is refused by both sides, and calls fall back', async (t) => {
  const dir = tempDir(t);
  const hooks = path.join(dir, 'hooks');
  fs.mkdirSync(hooks);
  fs.chmodSync(hooks, 0o777);
  const config = configIn(dir);
  const p = await proxy(t, dir, { args: ['--config', config], env: { CLAUDE_CODE_SESSION_ID: 'proc-3' } });
  await p.stderr.waitFor(/idemgate mcp: hook:turn is off \(turns come from the other sources\): .*mode 0777/);
  const hook = await runHook(['--config', config], claudeInput('s', 'p'));
  assertHarmless(hook);
  assertOneLine(hook, 'no turn recorded: the hook directory');
  assert.ok(hook.stderr.includes('chmod 700'), hook.stderr);
  assert.deepEqual(fs.readdirSync(hooks), [], 'nothing written there');
  await p.charge(null);
  await p.hasDetail('session: env:CLAUDE_CODE_SESSION_ID (no turn id)');
});

test('the hook never hurts the prompt: bad JSON, a cut input, unknown flags', async (t) => {
  requireIdemgate();
  const dir = tempDir(t);
  const config = configIn(dir);
  const hooks = path.join(dir, 'hooks');

  const bad = await runHook(['--config', config], '{"session_id": "s", "prompt');
  assertHarmless(bad);
  assertOneLine(bad, 'stdin is not valid JSON');
  assert.ok(bad.stderr.includes('recorded a new turn without a session'), bad.stderr);
  const [file] = ownTurnFiles(hooks);
  const first = JSON.parse(fs.readFileSync(path.join(hooks, file), 'utf8'));
  assert.equal(first.host, 'unknown');
  assert.match(first.turn_id, /^\/[0-9a-f]{32}$/);

  // A prompt longer than hook_max_input_bytes (1 MiB): read to its end, then a new turn.
  const long = claudeInput('s', 'p-long', 'x'.repeat(3 << 20));
  const cut = await runHook(['--config', config], long);
  assertHarmless(cut);
  assertOneLine(cut, 'stdin is longer than 1048576 bytes ([mcp] hook_max_input_bytes)');
  const after = JSON.parse(fs.readFileSync(path.join(hooks, file), 'utf8'));
  assert.notEqual(after.turn_id, first.turn_id, 'a new turn all the same');
  // With the limit raised it fits.
  const roomy = configIn(dir, 'hook_max_input_bytes = "4MiB"\n');
  const fits = await runHook(['--config', roomy], long);
  assertHarmless(fits);
  assert.equal(fits.stderr, '');
  assert.equal(JSON.parse(fs.readFileSync(path.join(hooks, file), 'utf8')).turn_id, 's/p-long');

  const flags = await runHook(['--config', config, '--future-flag'], claudeInput('s', 'p9'));
  assertHarmless(flags);
  assertOneLine(flags, 'ignored arguments it does not know: --future-flag');

  // The defaults' directory then: $XDG_RUNTIME_DIR/idemgate, kept inside the test's dir.
  const runtime = path.join(dir, 'run');
  fs.mkdirSync(runtime, { mode: 0o700 });
  const missing = await runHook(['--config', path.join(dir, 'none.toml')], claudeInput('s', 'p10'), {
    XDG_RUNTIME_DIR: runtime,
  });
  assertHarmless(missing);
  assertOneLine(missing, '(using the defaults)');

  // --store is accepted like every command's, and not opened.
  const store = await runHook(['--store', 'redis://127.0.0.1:1', '--config', config], claudeInput('s', 'p11'));
  assertHarmless(store);
  assert.equal(store.stderr, '');
});

test('the hook removes the turn files of hosts that are gone', async (t) => {
  requireIdemgate();
  const dir = tempDir(t);
  const config = configIn(dir);
  const hooks = path.join(dir, 'hooks');
  fs.mkdirSync(hooks, { mode: 0o700 });
  // A host that has exited: its pid is free (or taken by another process, with another start).
  const { pid } = await new Promise((resolve) => {
    const c = spawn('true');
    c.on('exit', () => resolve(c));
  });
  const stale = path.join(hooks, `turn-${pid}-1.json`);
  fs.writeFileSync(stale, '{"host":"claude-code","session_id":"s","turn_id":"s/p","at_ms":1}');
  assertHarmless(await runHook(['--config', config], claudeInput('s', 'p')));
  assert.ok(!fs.existsSync(stale), 'the stale file is gone');
  assert.equal(ownTurnFiles(hooks).length, 1);
});
