// Keys from headers (MCP 2026-07-28, SEP-2243) on the Streamable HTTP front: a tool marks its
// `turn` argument x-mcp-header "TurnId", a client mirrors it into Mcp-Param-TurnId, and with
// [mcp] turn_id = ["header:Mcp-Param-TurnId"] idemgate scopes the call by it. A header that
// disagrees with the body is refused with 400 and -32020 before anything runs.
//
// Raw HTTP requests (fetch) in the stateless dialect against `idemgate mcp --listen` in front
// of the hand-written 2026 server, whose ledger counts what reached it.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { test } from 'node:test';
import {
  IDEMGATE,
  RAW_SERVER_2026,
  isReplay,
  readLedger,
  startIdemgateListen,
  tempDir,
  until,
} from './helpers.mjs';

const run = promisify(execFile);
const META = {
  'io.modelcontextprotocol/protocolVersion': '2026-07-28',
  'io.modelcontextprotocol/clientInfo': { name: 'headers-test', version: '1.0.0' },
  'io.modelcontextprotocol/clientCapabilities': {},
};

test('Mcp-Param-TurnId scopes the key; a header that disagrees with the body is a 400', async (t) => {
  const dir = tempDir(t);
  const config = path.join(dir, 'idemgate.toml');
  fs.writeFileSync(config, '[mcp]\nturn_id = ["header:Mcp-Param-TurnId"]\n');
  const ledger = path.join(dir, 'raw-ledger.jsonl');
  const gate = await startIdemgateListen(t, dir, ['--config', config, '--', 'node', RAW_SERVER_2026], {
    RAW_LEDGER: ledger,
  });
  let id = 0;
  const post = async (method, params, headers = {}) => {
    const res = await fetch(gate.url, {
      method: 'POST',
      headers: {
        'Content-Type': 'application/json',
        Accept: 'application/json, text/event-stream',
        'MCP-Protocol-Version': '2026-07-28',
        'Mcp-Method': method,
        ...(params.name ? { 'Mcp-Name': params.name } : {}),
        ...headers,
      },
      body: JSON.stringify({ jsonrpc: '2.0', id: ++id, method, params: { ...params, _meta: META } }),
    });
    return { status: res.status, body: await res.json() };
  };
  const transfers = () => readLedger(ledger).filter((e) => e.params.name === 'transfer').length;

  const list = await post('tools/list', {});
  assert.equal(list.status, 200, JSON.stringify(list.body));
  const call = { name: 'transfer', arguments: { turn: 'turn-7', amount: 5 } };
  const first = await post('tools/call', call, { 'Mcp-Param-TurnId': 'turn-7' });
  assert.equal(first.status, 200, JSON.stringify(first.body));
  assert.ok(!isReplay(first.body.result), JSON.stringify(first.body));
  const retry = await post('tools/call', call, { 'mcp-param-turnid': 'turn-7' });
  assert.ok(isReplay(retry.body.result), `the retry replays: ${JSON.stringify(retry.body)}`);
  assert.equal(transfers(), 1);

  const mismatch = await post('tools/call', call, { 'Mcp-Param-TurnId': 'turn-8' });
  assert.equal(mismatch.status, 400, JSON.stringify(mismatch.body));
  assert.equal(mismatch.body.error.code, -32020);
  assert.match(mismatch.body.error.message, /Mcp-Param-TurnId header value "turn-8" does not match/);
  const missing = await post('tools/call', call);
  assert.equal(missing.status, 400, 'a client must mirror the argument it sends');
  assert.equal(transfers(), 1, 'nothing refused reached the server');

  // The attempt log names the header as the source of the turn.
  await until(
    async () => {
      const { stdout } = await run(IDEMGATE, [
        'audit', '--json', '--store', `sqlite:${path.join(dir, 'idem.db')}`, '--tool', 'transfer',
      ]);
      return stdout.includes('turn: header:Mcp-Param-TurnId');
    },
    { what: 'an attempt scoped by header:Mcp-Param-TurnId' },
  );
});
