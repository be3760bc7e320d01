// Records are scoped by the upstream they ran on (docs/DESIGN.md §3). Found with the README's host
// config: a host ran `idemgate mcp -- jira-server` and `idemgate mcp -- github-server` on the
// default store; the same call on the second server was answered from the first server's
// record, marked replayed, and the second server never acted: a lost action.
//
// Here the two servers are two instances of the example server with their own ledgers (two
// databases, two accounts), behind two `idemgate mcp` on one SQLite file.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { test } from 'node:test';
import {
  EXAMPLE_SERVER,
  IDEMGATE,
  META,
  TURN,
  connectStdio,
  isReplay,
  killExampleServersAfter,
  readLedger,
  requireIdemgate,
  tempDir,
} from './helpers.mjs';

const ARGS = { customer: 'cus_1', amount_cents: 500, currency: 'EUR' };

/** `idemgate mcp` on `store` in front of the example server writing to `ledger`. */
function proxy(t, store, ledger, { serverArgs = [], idemArgs = [] } = {}) {
  requireIdemgate();
  killExampleServersAfter(t, ledger);
  return connectStdio(t, {
    command: IDEMGATE,
    args: ['mcp', '--store', store, ...idemArgs, '--', 'node', EXAMPLE_SERVER, ...serverArgs],
    env: { EXAMPLE_LEDGER: ledger },
  });
}

const charge = (client) =>
  client.callTool({ name: 'charge', arguments: ARGS, _meta: { [TURN]: 't-x' } });

test('two servers behind one host, on one store, each run the call; retries replay per server', async (t) => {
  const dir = tempDir(t);
  const store = `sqlite:${path.join(dir, 'idem.db')}`;
  const jira = path.join(dir, 'jira.jsonl');
  const github = path.join(dir, 'github.jsonl');
  const a = await proxy(t, store, jira, { serverArgs: ['--as', 'jira'] });
  const b = await proxy(t, store, github, { serverArgs: ['--as', 'github'] });

  const first = await charge(a.client);
  assert.ok(!first.isError && !isReplay(first), JSON.stringify(first));
  const second = await charge(b.client);
  assert.ok(!second.isError && !isReplay(second), `the second server acted: ${JSON.stringify(second)}`);
  assert.equal(readLedger(jira).length, 1);
  assert.equal(readLedger(github).length, 1);

  // A retry on each server replays that server's own outcome.
  for (const [conn, ledger] of [[a, jira], [b, github]]) {
    const retry = await charge(conn.client);
    assert.ok(isReplay(retry), JSON.stringify(retry));
    assert.equal(readLedger(ledger).length, 1);
  }
  const replays = await Promise.all([charge(a.client), charge(b.client)]);
  const scoped = replays.map((r) => r._meta[META + 'key']);
  assert.notEqual(scoped[0], scoped[1], 'two records, one per upstream');
  for (const k of scoped) assert.match(k, /^u[0-9a-f]{12}\/v1t\./);

  // `inspect` shows the record under its scoped key.
  const shown = await promisify(execFile)(IDEMGATE, ['--store', store, 'inspect', scoped[0], '--json']);
  assert.equal(JSON.parse(shown.stdout).key, scoped[0]);
});

test('[mcp] scope names the scope: two proxies that set the same one share records', async (t) => {
  const dir = tempDir(t);
  const store = `sqlite:${path.join(dir, 'idem.db')}`;
  const config = path.join(dir, 'idemgate.toml');
  fs.writeFileSync(config, '[mcp]\nscope = "billing"\n');
  const ledger = path.join(dir, 'ledger.jsonl');
  const a = await proxy(t, store, ledger, { serverArgs: ['--as', 'a'], idemArgs: ['--config', config] });
  const b = await proxy(t, store, ledger, { serverArgs: ['--as', 'b'], idemArgs: ['--config', config] });
  await charge(a.client);
  const retry = await charge(b.client);
  assert.ok(isReplay(retry), JSON.stringify(retry));
  assert.match(retry._meta[META + 'key'], /^billing\/v1t\./);
  assert.equal(readLedger(ledger).length, 1);
});
