// Message shapes, written by hand as raw JSON-RPC lines (no SDK on the client side):
//
// - 2026-07-28 (stateless): `server/discover`, per-request `_meta`, `resultType`, and a Multi
//   Round-Trip Request whose `input_required` interim result idemgate must pass through
//   unchanged and must NOT store (docs/DESIGN.md §4 step 7): an identical second call reaches the
//   upstream again. The completed continuation is an outcome like any other and is replayed.
// - 2025-11-25 (`initialize` handshake) against an SDK server, including a 2026 client's
//   `server/discover` probe that a legacy server answers with "method not found".
//
// Each script runs directly against the server and through `idemgate mcp`; the answers must be
// the same, apart from idemgate's documented tools/list rewrites and replay markers.
import assert from 'node:assert/strict';
import path from 'node:path';
import { test } from 'node:test';
import {
  EXAMPLE_SERVER,
  IDEMGATE,
  META,
  RAW_SERVER_2026,
  RawPeer,
  TURN,
  assertReplayMarkers,
  assertToolsListTransparent,
  exampleEnv,
  isReplay,
  killExampleServersAfter,
  mcpArgs,
  readLedger,
  requireIdemgate,
  stripReplay,
  tempDir,
} from './helpers.mjs';

// --- 2026-07-28 ------------------------------------------------------------------------------

const V2026 = {
  'io.modelcontextprotocol/protocolVersion': '2026-07-28',
  'io.modelcontextprotocol/clientInfo': { name: 'raw-test-client', version: '1.0.0' },
  'io.modelcontextprotocol/clientCapabilities': { elicitation: { form: {} } },
};
const meta = (more = {}) => ({ _meta: { ...V2026, ...more } });
const REPO = { repo: 'acme/website' };
const CONFIRMED = { confirm: { action: 'accept', content: { confirm: true } } };

function peer2026(t, dir, proxied) {
  const env = { RAW_LEDGER: path.join(dir, 'raw-ledger.jsonl') };
  if (!proxied) return new RawPeer(t, 'node', [RAW_SERVER_2026], env);
  requireIdemgate();
  return new RawPeer(t, IDEMGATE, [...mcpArgs(dir), '--', 'node', RAW_SERVER_2026], env);
}

/** The first part of the 2026 script: discovery, listing, and the interim result twice. */
async function script2026(p) {
  const out = {};
  out.discover = await p.request('discover-1', 'server/discover', meta());
  out.ping = await p.request(2, 'ping', meta());
  out.list = await p.request('list', 'tools/list', meta());
  const call = { name: 'delete_repo', arguments: REPO, ...meta({ [TURN]: 'turn-mrtr' }) };
  out.interim1 = await p.request(10, 'tools/call', call);
  out.interim2 = await p.request(11, 'tools/call', call);
  out.unknownMethod = await p.request(12, 'resources/list', meta());
  return { out, call };
}

test('2026-07-28: discover, tools/list and input_required pass through, unstored', async (t) => {
  const directDir = tempDir(t);
  const proxiedDir = tempDir(t);
  const direct = await script2026(peer2026(t, directDir, false));
  const p = peer2026(t, proxiedDir, true);
  const proxied = await script2026(p);
  const ledger = path.join(proxiedDir, 'raw-ledger.jsonl');

  assert.deepEqual(proxied.out.discover, direct.out.discover, 'server/discover unchanged');
  assert.equal(proxied.out.discover.id, 'discover-1', 'string ids keep their type');
  assert.deepEqual(proxied.out.ping, direct.out.ping);
  assert.deepEqual(proxied.out.unknownMethod, direct.out.unknownMethod, 'errors unchanged');

  // tools/list: the documented rewrites on the gated tool only; resultType and cache hints kept.
  const { tools: pTools, ...pRest } = proxied.out.list.result;
  const { tools: dTools, ...dRest } = direct.out.list.result;
  assert.deepEqual(pRest, dRest);
  assertToolsListTransparent(pTools, dTools);

  // The interim result is passed through exactly, both times, and both reached the upstream.
  assert.equal(direct.out.interim1.result.resultType, 'input_required');
  assert.deepEqual(proxied.out.interim1, direct.out.interim1, 'input_required unchanged');
  assert.deepEqual(proxied.out.interim2, direct.out.interim2, 'second interim unchanged');
  assert.ok(!isReplay(proxied.out.interim2.result), 'an interim result is never replayed');
  const arrivals = readLedger(ledger);
  assert.equal(arrivals.length, 2, 'the identical second call reached the upstream again');
  assert.deepEqual(arrivals[0].params.arguments, REPO);
  for (const [k, v] of Object.entries(V2026)) {
    assert.deepEqual(arrivals[0].params._meta[k], v, `${k} forwarded`);
  }

  // The continuation carries the answer: it executes once, and its retry is a replay.
  const cont = {
    ...proxied.call,
    inputResponses: CONFIRMED,
    requestState: proxied.out.interim1.result.requestState,
  };
  const done = await p.request(20, 'tools/call', cont);
  assert.equal(done.result.resultType, 'complete', JSON.stringify(done));
  assert.ok(!isReplay(done.result));
  assert.equal(done.result.content[0].text, 'Deleted acme/website.');
  assert.equal(readLedger(ledger).length, 3);
  assert.deepEqual(readLedger(ledger)[2].params.inputResponses, CONFIRMED, 'answers forwarded');

  const again = await p.request(21, 'tools/call', cont);
  assertReplayMarkers(again.result);
  assert.deepEqual(stripReplay(again.result), done.result);
  assert.equal(readLedger(ledger).length, 3, 'the continuation ran once');
  assert.deepEqual(p.nonJson, [], 'stdout carries only JSON-RPC');
});

// --- 2025-11-25 ------------------------------------------------------------------------------

const INIT = {
  protocolVersion: '2025-11-25',
  capabilities: {},
  clientInfo: { name: 'raw-test-client', version: '1.0.0' },
};
const CHARGE = { customer: 'cus_raw', amount_cents: 700, currency: 'GBP' };

/** A 2026 client's stdio probe, its fallback to initialize, and a charge, twice. */
async function script2025(p) {
  const out = {};
  out.probe = await p.request('probe', 'server/discover', meta());
  out.init = await p.request(0, 'initialize', INIT);
  p.notify('notifications/initialized');
  out.ping = await p.request(1, 'ping');
  const call = { name: 'charge', arguments: CHARGE, _meta: { [TURN]: 'turn-raw' } };
  out.first = await p.request(2, 'tools/call', call);
  out.second = await p.request(3, 'tools/call', call);
  out.bad = await p.request(4, 'tools/call', { name: 'no_such_tool', arguments: {} });
  return out;
}

test('2025-11-25 by hand: the discover probe, initialize and a retried charge', async (t) => {
  const directDir = tempDir(t);
  const proxiedDir = tempDir(t);
  for (const d of [directDir, proxiedDir]) killExampleServersAfter(t, exampleEnv(d).EXAMPLE_LEDGER);
  const direct = await script2025(new RawPeer(t, 'node', [EXAMPLE_SERVER], exampleEnv(directDir)));
  requireIdemgate();
  const p = new RawPeer(
    t,
    IDEMGATE,
    [...mcpArgs(proxiedDir), '--', 'node', EXAMPLE_SERVER],
    exampleEnv(proxiedDir),
  );
  const proxied = await script2025(p);

  assert.ok(direct.probe.error, 'the SDK server does not know server/discover');
  assert.deepEqual(proxied.probe, direct.probe, 'the probe error passes through unchanged');
  assert.deepEqual(proxied.init, direct.init, 'initialize result unchanged');
  assert.deepEqual(proxied.ping, direct.ping);
  assert.deepEqual(proxied.bad, direct.bad, 'unknown tool answered as the upstream does');

  // The first charge is the upstream's answer (the charge id and time differ between runs).
  const strip = (r) => {
    const { id: _i, created_at: _c, ...rest } = r.result.structuredContent;
    return rest;
  };
  assert.deepEqual(strip(proxied.first), strip(direct.first));
  assert.ok(!isReplay(proxied.first.result));
  assert.ok(!isReplay(direct.second.result) && direct.second.result._meta === undefined);
  assertReplayMarkers(proxied.second.result);
  assert.deepEqual(stripReplay(proxied.second.result), proxied.first.result);
  assert.equal(readLedger(exampleEnv(proxiedDir).EXAMPLE_LEDGER).length, 1);
  assert.equal(readLedger(exampleEnv(directDir).EXAMPLE_LEDGER).length, 2);
  assert.equal(typeof proxied.second.result._meta[META + 'key'], 'string');
  assert.deepEqual(p.nonJson, [], 'stdout carries only JSON-RPC');
});
