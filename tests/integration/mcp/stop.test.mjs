// A clean stop of `idemgate mcp` (docs/DESIGN.md §6.1): hosts stop their MCP servers with a
// signal (Claude Code SIGINT; Codex, Gemini CLI and the MCP SDKs SIGTERM; a closed terminal
// SIGHUP) or by closing stdin. The proxy then takes no new calls, gives the calls in flight
// [mcp] stop_grace, stops the server, writes the audit log and exits 0: a replay answered just
// before the signal is in the audit log, a call that settles within the grace is stored, and one
// that outlasts it is marked outcome unknown (said on stderr).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { promisify } from 'node:util';
import {
  EXAMPLE_SERVER,
  IDEMGATE,
  TURN,
  RawPeer,
  alive,
  condition,
  connectHttp,
  exampleEnv,
  isReplay,
  killExampleServersAfter,
  mcpArgs,
  readLedger,
  requireIdemgate,
  startIdemgateListen,
  tempDir,
  until,
} from './helpers.mjs';

const run = promisify(execFile);
const ARGS = { customer: 'cus_stop', amount_cents: 700, currency: 'EUR' };
const CHARGE = { name: 'charge', arguments: ARGS, _meta: { [TURN]: 'turn-stop' } };

/** `idemgate mcp` in front of the example server, spoken to in raw JSON-RPC over its stdio. */
async function proxy(t, dir, { env = {}, config = '' } = {}) {
  requireIdemgate();
  const serverEnv = exampleEnv(dir, env);
  killExampleServersAfter(t, serverEnv.EXAMPLE_LEDGER);
  const configFile = path.join(dir, 'idemgate.toml');
  fs.writeFileSync(configFile, config);
  const p = new RawPeer(
    t,
    IDEMGATE,
    [...mcpArgs(dir, ['--config', configFile]), '--', 'node', EXAMPLE_SERVER],
    serverEnv,
  );
  await p.request(0, 'initialize', {
    protocolVersion: '2025-06-18',
    capabilities: {},
    clientInfo: { name: 'stop-test', version: '1.0.0' },
  });
  p.notify('notifications/initialized');
  await p.request('list', 'tools/list');
  return p;
}

const storeOf = (dir) => `sqlite:${path.join(dir, 'idem.db')}`;

/** The outcomes of the attempts in the audit log, sorted; not the claims (written with the record). */
async function auditOutcomes(dir) {
  const { stdout } = await run(IDEMGATE, ['audit', '--json', '--store', storeOf(dir)]);
  return stdout
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l).outcome)
    .filter((o) => o !== 'claimed')
    .sort();
}

/**
 * A proxy whose charge answers `delayMs` after its side effect, with `[mcp] stop_grace`, and a
 * charge sent through it that has done its side effect (it is in the server's ledger) and not
 * answered yet: the call in flight at the signal. Returns { p, pending, ledger, serverPid }.
 */
async function chargeInFlight(t, dir, { delayMs, grace }) {
  const ledger = exampleEnv(dir).EXAMPLE_LEDGER;
  const p = await proxy(t, dir, {
    env: { EXAMPLE_SLOW_TOOL: 'charge', EXAMPLE_DELAY_MS: String(delayMs) },
    config: `[mcp]\nstop_grace = "${grace}"\n`,
  });
  const pending = p.request(1, 'tools/call', CHARGE);
  await until(() => readLedger(ledger).length === 1, { what: 'the charge in the ledger' });
  return { p, pending, ledger, serverPid: readLedger(ledger)[0].pid };
}

/** Waits for the proxy to exit and asserts a clean stop: status 0, not killed by a signal. */
async function assertCleanExit(p) {
  const { code, signal } = await p.exited;
  assert.equal(signal, null, `killed by ${signal}; stderr:\n${p.stderr.text}`);
  assert.equal(code, 0, `exit status; stderr:\n${p.stderr.text}`);
}

for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  test(`${signal} right after a replay: exit 0, and the replay is in the audit log`, async (t) => {
    const dir = tempDir(t);
    const p = await proxy(t, dir);
    const first = await p.request(1, 'tools/call', CHARGE);
    assert.ok(!first.result.isError && !isReplay(first.result), JSON.stringify(first));
    const retry = await p.request(2, 'tools/call', CHARGE);
    assert.ok(isReplay(retry.result), JSON.stringify(retry));
    // At once: the replay's attempt is still in the audit batch (written every ~200 ms).
    p.child.kill(signal);
    await assertCleanExit(p);
    assert.match(p.stderr.text, new RegExp(`stopping on ${signal}`));
    assert.deepEqual(await auditOutcomes(dir), ['executed', 'replayed']);
    assert.equal(readLedger(exampleEnv(dir).EXAMPLE_LEDGER).length, 1, 'one charge');
  });
}

test('the client closes stdin right after a replay: exit 0, and the replay is in the audit log', async (t) => {
  const dir = tempDir(t);
  const p = await proxy(t, dir);
  await p.request(1, 'tools/call', CHARGE);
  assert.ok(isReplay((await p.request(2, 'tools/call', CHARGE)).result));
  p.child.stdin.end();
  await assertCleanExit(p);
  assert.deepEqual(await auditOutcomes(dir), ['executed', 'replayed']);
});

test('a call in flight at the signal that finishes within the grace is answered and stored', async (t) => {
  const dir = tempDir(t);
  // The tool answers 1 s after its side effect; the grace is far longer.
  const { p, pending, ledger } = await chargeInFlight(t, dir, { delayMs: 1000, grace: '30s' });
  p.child.kill('SIGTERM');
  await p.stderr.waitFor(/stopping on SIGTERM/);
  // A call that comes once the stop began is refused, retryably, and never runs.
  const late = await p.request(2, 'tools/call', {
    ...CHARGE,
    arguments: { ...ARGS, amount_cents: 701 },
  });
  assert.equal(late.error?.code, -32006, JSON.stringify(late));
  assert.equal(late.error.data.retryable, true);
  const answer = await pending;
  assert.ok(answer.result && !answer.result.isError && !isReplay(answer.result), JSON.stringify(answer));
  await assertCleanExit(p);
  assert.doesNotMatch(p.stderr.text, /still running after the stop grace/);
  assert.deepEqual(await auditOutcomes(dir), ['executed']);
  assert.equal(readLedger(ledger).length, 1, 'the refused call did not run');

  // Stored: a new proxy on the same store replays it.
  const again = await proxy(t, dir);
  assert.ok(isReplay((await again.request(1, 'tools/call', CHARGE)).result));
  assert.equal(readLedger(ledger).length, 1);
});

test('a call that outlasts a short grace is marked unknown, and the proxy still exits 0', async (t) => {
  const dir = tempDir(t);
  // The tool would answer after 60 s: far beyond the 100 ms grace.
  const { p, pending, ledger, serverPid } = await chargeInFlight(t, dir, {
    delayMs: 60000,
    grace: '100ms',
  });
  p.child.kill('SIGINT');
  const answer = await pending;
  assert.equal(condition(answer.result), 'outcome_unknown', JSON.stringify(answer));
  await assertCleanExit(p);
  assert.match(p.stderr.text, /1 tool call\(s\) still running after the stop grace of 100 ms/);
  assert.match(p.stderr.text, /lease runs out and a retry finds it unknown/);
  // The server was stopped with the proxy (SIGTERM), not left running its 60 s delay.
  assert.ok(!alive(serverPid), 'the upstream server is gone');
  assert.deepEqual(await auditOutcomes(dir), ['unknown']);

  // A retry is answered "outcome unknown", never run again.
  const again = await proxy(t, dir);
  const retry = await again.request(1, 'tools/call', CHARGE);
  assert.equal(condition(retry.result), 'outcome_unknown', JSON.stringify(retry));
  assert.equal(readLedger(ledger).length, 1, 'one charge');
});

test('--listen: SIGTERM right after a replay exits 0 with the replay in the audit log', async (t) => {
  const dir = tempDir(t);
  const serverEnv = exampleEnv(dir);
  killExampleServersAfter(t, serverEnv.EXAMPLE_LEDGER);
  const proc = await startIdemgateListen(t, dir, ['--', 'node', EXAMPLE_SERVER], serverEnv);
  const { client } = await connectHttp(t, proc.url);
  await client.callTool(CHARGE);
  assert.ok(isReplay(await client.callTool(CHARGE)));
  proc.child.kill('SIGTERM');
  const { code, signal } = await proc.exited;
  assert.equal(signal, null, proc.stderr.text);
  assert.equal(code, 0, proc.stderr.text);
  assert.deepEqual(await auditOutcomes(dir), ['executed', 'replayed']);
});
