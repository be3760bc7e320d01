// The crash campaign's deterministic part (issue #6, docs/DESIGN.md §4): idemgate SIGKILLs itself at
// each fault point of a gated call (src/core/fault_point.h; the test build has them), for both
// client transports and each store (SQLite twice: alone, and with its writes sent to another
// process's shared writer); then a restarted idemgate is asked the same call again,
// until its answer settles. Checked from the example server's own side-effect log:
//   - at most one charge per call, whatever the point;
//   - every answer the client saw is the first outcome (a replay) or an explicit
//     in_progress / outcome_unknown condition — never a second success;
//   - an outcome persisted before the crash (after_persist, before_reply) is replayed: not lost.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import {
  alive,
  condition,
  connectHttp,
  connectStdio,
  EXAMPLE_SERVER,
  exampleEnv,
  IDEMGATE,
  isReplay,
  killExampleServersAfter,
  readLedger,
  requireIdemgate,
  servingPid,
  start,
  stripReplay,
  tempDir,
  TURN,
  until,
} from './helpers.mjs';
import { PostgresServer, RedisServer } from './servers.mjs';

const POINTS = ['after_claim', 'after_send', 'after_answer', 'after_persist', 'before_reply'];
// Points after which the outcome is durable: the retry must replay it.
const PERSISTED = new Set(['after_persist', 'before_reply']);
// Points before which nothing was sent upstream: no charge may exist.
const UNSENT = new Set(['after_claim']);

const ARGS = {
  customer: 'cus_fault',
  amount_cents: 1200,
  currency: 'EUR',
};
// A short lease so that a dead owner's record turns unknown within the test; fail on unknown.
const CONFIG = '[defaults]\nlease = "1s"\nwait = "200ms"\non_unknown = "fail"\n';

/** Starts `idemgate mcp` (stdio or --listen) in front of the example server; returns a client. */
async function connect(t, dir, transport, store, env) {
  const config = path.join(dir, 'idemgate.toml');
  fs.writeFileSync(config, CONFIG);
  const serverEnv = exampleEnv(dir, env);
  killExampleServersAfter(t, serverEnv.EXAMPLE_LEDGER);
  const base = ['mcp', '--store', store, '--config', config];
  if (transport === 'stdio') {
    const c = await connectStdio(t, {
      command: IDEMGATE,
      args: [...base, '--', 'node', EXAMPLE_SERVER],
      env: serverEnv,
    });
    return { client: c.client, pid: c.pid };
  }
  const proc = start(
    t,
    IDEMGATE,
    [...base, '--listen', '127.0.0.1:0', '--', 'node', EXAMPLE_SERVER],
    {
      env: serverEnv,
    },
  );
  const m = await proc.stderr.waitFor(/idemgate: listening on (http:\/\/127\.0\.0\.1:\d+\/mcp)/);
  const c = await connectHttp(t, m[1]);
  return { client: c.client, pid: proc.child.pid };
}

const charge = (client, turn, options) =>
  client.callTool({ name: 'charge', arguments: ARGS, _meta: { [TURN]: turn } }, undefined, options);

async function crashAndRetry(t, store, transport, point) {
  const dir = tempDir(t, 'idemgate-fault-');
  const ledger = exampleEnv(dir).EXAMPLE_LEDGER;
  const turn = `turn-${transport}-${point}`;

  // 1. The first attempt: idemgate dies at the point; the client gets no answer.
  const first = await connect(t, dir, transport, store, { IDEMGATE_FAULT_POINT: point });
  // Over HTTP the SDK would keep trying to resume the broken stream until its request timeout:
  // the call is abandoned as soon as idemgate is seen dead instead.
  const abandon = new AbortController();
  const pending = charge(first.client, turn, { signal: abandon.signal }).then(
    (result) => ({ result }),
    (error) => ({ error }),
  );
  await until(() => !alive(first.pid), { what: `idemgate to die at ${point}` });
  abandon.abort();
  const lost = await pending;
  assert.ok(lost.error, `idemgate died before answering, got ${JSON.stringify(lost.result)}`);
  const charges = readLedger(ledger).filter((e) => e.tool === 'charge');
  if (UNSENT.has(point)) assert.equal(charges.length, 0, `nothing was sent before ${point}`);
  else assert.ok(charges.length <= 1);

  // 2. A restarted idemgate, asked again until the answer settles (a replay, or outcome_unknown
  //    once the dead owner's lease ran out).
  const second = await connect(t, dir, transport, store, {});
  const answers = [];
  await until(
    async () => {
      const r = await charge(second.client, turn);
      answers.push(r);
      return isReplay(r) || condition(r) === 'outcome_unknown';
    },
    { ms: 20000, every: 100, what: `a settled answer after ${point}` },
  );

  // 3. The invariant.
  const after = readLedger(ledger).filter((e) => e.tool === 'charge');
  assert.ok(after.length <= 1, `at most one charge, got ${after.length}`);
  for (const r of answers) {
    if (isReplay(r)) {
      assert.equal(after.length, 1, 'a replay stands for a charge that happened');
      const text = stripReplay(r)
        .content.map((c) => c.text ?? '')
        .join('\n');
      assert.ok(text.includes(after[0].result.id), `the replay is the first outcome: ${text}`);
    } else {
      assert.equal(r.isError, true, `not a second success story: ${JSON.stringify(r)}`);
      assert.ok(['in_progress', 'outcome_unknown'].includes(condition(r)), JSON.stringify(r._meta));
    }
  }
  const last = answers[answers.length - 1];
  if (PERSISTED.has(point)) {
    assert.ok(isReplay(last), `the outcome persisted before ${point} is replayed, not lost`);
  }
  t.diagnostic(
    `${point}: ${after.length} charge(s); answers ${answers
      .map((r) => (isReplay(r) ? 'replayed' : condition(r)))
      .join(', ')}`,
  );
}

/**
 * An idle `idemgate mcp` on the SQLite store `url`, started before the test's own, so that it
 * serves the file's shared writer and the processes that crash and restart are its clients
 * (docs/DESIGN.md §5). Stopped with the test.
 */
async function companion(t, url) {
  const dir = tempDir(t);
  const serverEnv = exampleEnv(dir, {});
  killExampleServersAfter(t, serverEnv.EXAMPLE_LEDGER);
  const c = await connectStdio(t, {
    command: IDEMGATE,
    args: ['mcp', '--store', url, '--', 'node', EXAMPLE_SERVER],
    env: serverEnv,
  });
  assert.equal(servingPid(url), c.pid, 'the companion serves the shared writer');
}

const STORES = [
  {
    name: 'SQLite',
    start: async () => null,
    url: (_, dir, tag) => `sqlite:${path.join(dir, `${tag}.db`)}`,
  },
  {
    // The same, with every write of the crashing idemgate sent to another process's writer.
    name: 'SQLite, written by another process',
    start: async () => null,
    url: (_, dir, tag) => `sqlite:${path.join(dir, `${tag}.db`)}`,
    companion: true,
  },
  { name: 'Redis', start: () => RedisServer.start(), url: (s, _, tag) => s.url(`${tag}:`) },
  { name: 'PostgreSQL', start: () => PostgresServer.start(), url: (s, _, tag) => s.url(tag) },
];

for (const store of STORES) {
  describe(`fault points on ${store.name}`, { concurrency: 1 }, () => {
    let server = null;
    let shared = null;
    before(async () => {
      requireIdemgate();
      server = await store.start();
      shared = fs.mkdtempSync('/tmp/idemgate-faults-');
    });
    after(async () => {
      await server?.stop();
      if (shared) fs.rmSync(shared, { recursive: true, force: true });
    });
    for (const transport of ['stdio', 'http']) {
      for (const point of POINTS) {
        test(`${transport}: SIGKILL ${point}, restart, retry: at most one charge, no lost outcome`, async (t) => {
          const tag = `f_${transport}_${point}`;
          const url = store.url(server, shared, tag);
          if (store.companion) await companion(t, url);
          await crashAndRetry(t, url, transport, point);
        });
      }
    }
  });
}
