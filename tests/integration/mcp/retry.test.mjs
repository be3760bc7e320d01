// A retried call runs once (docs/DESIGN.md §3, §4, §6.1), over every combination of client side
// (stdio, Streamable HTTP via --listen) and upstream (child process, --upstream-url).
//
// The example server appends one ledger line per execution, with the arguments and _meta it
// received, so "ran once" is "one line", and "idemgate strips repeat_nonce" is visible there.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  LoggingMessageNotificationSchema,
  ProgressNotificationSchema,
} from '@modelcontextprotocol/sdk/types.js';
import {
  EXAMPLE_SERVER,
  IDEMGATE,
  META,
  TURN,
  assertReplayMarkers,
  condition,
  connectExample,
  connectHttp,
  connectStdio,
  exampleEnv,
  isReplay,
  killExampleServersAfter,
  mcpArgs,
  readLedger,
  requireIdemgate,
  startExampleHttp,
  startIdemgateListen,
  stripReplay,
  tempDir,
} from './helpers.mjs';

const ARGS = { customer: 'cus_42', amount_cents: 1250, currency: 'EUR' };
const REORDERED = { currency: 'EUR', amount_cents: 1250, customer: 'cus_42' };

function charge(client, turn, args = ARGS) {
  return client.callTool({ name: 'charge', arguments: args, _meta: { [TURN]: turn } });
}

function charges(ledger) {
  return readLedger(ledger).filter((e) => e.tool === 'charge');
}

/**
 * The retry scenario against a connected client whose example server writes `ledger`.
 * Every step names what it checks.
 */
async function retryScenario(client, ledger) {
  // The tool list tells the model it may retry, and offers the nonce.
  const { tools } = await client.listTools();
  const chargeTool = tools.find((t) => t.name === 'charge');
  assert.match(chargeTool.description, /\[idemgate\] Safe to retry/);
  assert.equal(chargeTool.annotations.idempotentHint, true);
  assert.equal(chargeTool.inputSchema.properties.repeat_nonce.type, 'string');
  const listTool = tools.find((t) => t.name === 'list_charges');
  assert.doesNotMatch(listTool.description, /\[idemgate\]/, 'read-only tools are not rewritten');

  // 1. The first call executes.
  const first = await charge(client, 'turn-1');
  assert.ok(!first.isError, JSON.stringify(first));
  assert.ok(!isReplay(first), 'the first call is not a replay');
  assert.equal(charges(ledger).length, 1);
  assert.equal(first.structuredContent.id, charges(ledger)[0].result.id);

  // 2. The retry in the same turn is answered from the store: the first answer, marked.
  const retry = await charge(client, 'turn-1');
  assertReplayMarkers(retry);
  assert.deepEqual(stripReplay(retry), first, 'the retry is the first answer plus the marker');
  assert.equal(charges(ledger).length, 1, 'the retry did not charge again');

  // The upstream got the key idemgate announces, in _meta (docs/DESIGN.md §6.1).
  const key = retry._meta[META + 'key'];
  assert.equal(charges(ledger)[0].meta?.[META + 'idempotencyKey'], key, 'key forwarded upstream');

  // 3. The same arguments in another order are the same call (canonical JSON, §3).
  const reordered = await charge(client, 'turn-1', REORDERED);
  assertReplayMarkers(reordered);
  assert.deepEqual(stripReplay(reordered), first);
  assert.equal(reordered._meta[META + 'key'], key);
  assert.equal(charges(ledger).length, 1, 'reordered keys did not charge again');

  // 4. A new turn is a new action.
  const nextTurn = await charge(client, 'turn-2');
  assert.ok(!isReplay(nextTurn));
  assert.notEqual(nextTurn.structuredContent.id, first.structuredContent.id);
  assert.equal(charges(ledger).length, 2, 'a new turn charges again');

  // 5. A new repeat_nonce is a deliberate repeat: it runs, and the upstream never sees it.
  const repeat = await charge(client, 'turn-1', { ...ARGS, repeat_nonce: 'again-1' });
  assert.ok(!isReplay(repeat), 'a new nonce executes');
  assert.equal(charges(ledger).length, 3);
  assert.deepEqual(charges(ledger)[2].args, ARGS, 'repeat_nonce is stripped before forwarding');
  for (const e of charges(ledger)) assert.ok(!('repeat_nonce' in e.args));

  // 6. … and retrying that same nonce replays it.
  const repeatRetry = await charge(client, 'turn-1', { ...ARGS, repeat_nonce: 'again-1' });
  assertReplayMarkers(repeatRetry);
  assert.deepEqual(stripReplay(repeatRetry), repeat);
  assert.equal(charges(ledger).length, 3);

  // 7. Read-only tools are not gated: no markers, fresh answers.
  const list = () =>
    client.callTool({ name: 'list_charges', arguments: {}, _meta: { [TURN]: 'turn-1' } });
  const list1 = await list();
  const list2 = await list();
  assert.ok(!isReplay(list1) && !isReplay(list2));
  assert.deepEqual(list2, list1);
  assert.equal(list1.content[0].text.split('\n').length, 3, 'three charges listed');
}

/** Without idemgate every call charges again: the problem idemgate solves. */
async function directScenario(client, ledger) {
  const a = await charge(client, 'turn-1');
  const b = await charge(client, 'turn-1');
  assert.notEqual(a.structuredContent.id, b.structuredContent.id);
  await charge(client, 'turn-1', { ...ARGS, repeat_nonce: 'x' });
  assert.equal(charges(ledger).length, 3);
  assert.equal(charges(ledger)[2].args.repeat_nonce, 'x', 'the server keeps unknown arguments');
}

test('direct over stdio, without idemgate: every call charges again', async (t) => {
  const dir = tempDir(t);
  const { client } = await connectExample(t, dir, { proxied: false });
  await directScenario(client, exampleEnv(dir).EXAMPLE_LEDGER);
});

test('direct over Streamable HTTP (server.js --http 0), without idemgate: same', async (t) => {
  const dir = tempDir(t);
  const upstream = await startExampleHttp(t, dir);
  const { client } = await connectHttp(t, upstream.url);
  await directScenario(client, exampleEnv(dir).EXAMPLE_LEDGER);
});

test('retry over stdio, upstream a child process', async (t) => {
  const dir = tempDir(t);
  const { client } = await connectExample(t, dir);
  await retryScenario(client, exampleEnv(dir).EXAMPLE_LEDGER);
});

test('retry over Streamable HTTP (--listen 127.0.0.1:0), upstream a child process', async (t) => {
  const dir = tempDir(t);
  const env = exampleEnv(dir);
  killExampleServersAfter(t, env.EXAMPLE_LEDGER);
  const { url } = await startIdemgateListen(t, dir, ['--', 'node', EXAMPLE_SERVER], env);
  const { client } = await connectHttp(t, url);
  await retryScenario(client, env.EXAMPLE_LEDGER);
});

test('retry over stdio, upstream over Streamable HTTP (--upstream-url)', async (t) => {
  requireIdemgate();
  const dir = tempDir(t);
  const env = exampleEnv(dir);
  const upstream = await startExampleHttp(t, dir);
  const { client } = await connectStdio(t, {
    command: IDEMGATE,
    args: [...mcpArgs(dir), '--upstream-url', upstream.url],
  });
  await retryScenario(client, env.EXAMPLE_LEDGER);
});

test('retry over Streamable HTTP on both sides (--listen and --upstream-url)', async (t) => {
  const dir = tempDir(t);
  const env = exampleEnv(dir);
  const upstream = await startExampleHttp(t, dir);
  const { url } = await startIdemgateListen(t, dir, ['--upstream-url', upstream.url]);
  const { client } = await connectHttp(t, url);
  await retryScenario(client, env.EXAMPLE_LEDGER);
});

test('no turn id: identical calls are keyed by their arguments (args mode, §3)', async (t) => {
  const dir = tempDir(t);
  const ledger = exampleEnv(dir).EXAMPLE_LEDGER;
  const { client } = await connectExample(t, dir);
  const first = await client.callTool({ name: 'charge', arguments: ARGS });
  const retry = await client.callTool({ name: 'charge', arguments: REORDERED });
  assertReplayMarkers(retry);
  assert.deepEqual(stripReplay(retry), first);
  assert.equal(charges(ledger).length, 1);
});

test('an explicit key wins over the turn; the same key with other arguments is drift', async (t) => {
  const dir = tempDir(t);
  const ledger = exampleEnv(dir).EXAMPLE_LEDGER;
  const { client } = await connectExample(t, dir);
  const KEY = 'order-7781-payment';
  const withKey = (turn, args) =>
    client.callTool({
      name: 'charge',
      arguments: args,
      _meta: { [TURN]: turn, [META + 'idempotencyKey']: KEY },
    });
  const first = await withKey('turn-1', ARGS);
  assert.equal(charges(ledger)[0].meta[META + 'idempotencyKey'], KEY, 'forwarded as sent');
  const otherTurn = await withKey('turn-2', ARGS);
  assertReplayMarkers(otherTurn);
  // The record's key: the caller's, within the scope of this upstream (§3).
  const recordKey = otherTurn._meta[META + 'key'];
  assert.match(recordKey, new RegExp(`^u[0-9a-f]{12}/${KEY}$`));
  assert.deepEqual(stripReplay(otherTurn), first);
  const drift = await withKey('turn-2', { ...ARGS, amount_cents: 99999 });
  assert.equal(drift.isError, true);
  assert.equal(condition(drift), 'drift', JSON.stringify(drift));
  assert.equal(drift._meta[META + 'key'], recordKey);
  assert.equal(charges(ledger).length, 1, 'neither the retry nor the drift charged');
});

test('a tool error is stored and replayed, not executed again (§4 step 7)', async (t) => {
  const dir = tempDir(t);
  const ledger = exampleEnv(dir).EXAMPLE_LEDGER;
  const { client } = await connectExample(t, dir);
  const call = () =>
    client.callTool({ name: 'fail_sometimes', arguments: { note: 'n' }, _meta: { [TURN]: 't1' } });
  const first = await call();
  assert.equal(first.isError, true, 'the first execution fails');
  const retry = await call();
  assertReplayMarkers(retry);
  assert.deepEqual(stripReplay(retry), first, 'the stored error is replayed');
  assert.equal(readLedger(ledger).length, 1, 'executed once (a second run would have succeeded)');
});

test('progress and logging of a gated tool pass through on its first execution', async (t) => {
  const dir = tempDir(t);
  const ledger = exampleEnv(dir).EXAMPLE_LEDGER;
  const progress = [];
  const logs = [];
  const { client } = await connectExample(t, dir, {
    setup: (c) => {
      c.setNotificationHandler(ProgressNotificationSchema, (n) => progress.push(n.params));
      c.setNotificationHandler(LoggingMessageNotificationSchema, (n) => logs.push(n.params));
    },
  });
  const call = () =>
    client.callTool({
      name: 'deploy',
      arguments: { service: 'api', version: '1.4.2' },
      _meta: { [TURN]: 'turn-1', progressToken: 'deploy-1' },
    });
  const first = await call();
  assert.ok(!isReplay(first));
  assert.deepEqual(
    progress.map((p) => [p.progressToken, p.progress, p.total, p.message]),
    [
      ['deploy-1', 1, 3, 'build'],
      ['deploy-1', 2, 3, 'push'],
      ['deploy-1', 3, 3, 'roll out'],
    ],
  );
  assert.deepEqual(
    logs.map((l) => l.data),
    ['api@1.4.2: build', 'api@1.4.2: push', 'api@1.4.2: roll out'],
  );
  const retry = await call();
  assertReplayMarkers(retry);
  assert.deepEqual(stripReplay(retry), first);
  assert.equal(readLedger(ledger).filter((e) => e.tool === 'deploy').length, 1);
});
