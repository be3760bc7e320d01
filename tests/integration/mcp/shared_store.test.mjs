// Several `idemgate mcp` instances on one shared store behave as one (docs/DESIGN.md §4, §5): for
// each of Redis, Redis Cluster and PostgreSQL (real servers, started here in temp dirs through
// tests/servers/*.sh and stopped in `after` hooks), and one SQLite file (tests 1, 2 and 5):
//
//   1. a storm of 150 duplicate charges spread over three instances executes once, every
//      waiter is woken by the completion (not by its 20 s wait), and the completed record is
//      replayed by every instance;
//   2. the owner instance is SIGKILLed mid-call: the others answer "outcome unknown"
//      (on_unknown = "fail") and never execute again; with on_unknown = "retry" one takes over
//      and executes again, which is what "retry" means;
//   3. the store is killed under load: calls fail closed with a retryable "store unavailable"
//      JSON-RPC error and nothing executes without a claim; once the store is back, calls work
//      again and every outcome completed before the crash still replays;
//   4. (Redis, PostgreSQL) a claim's reply is lost for real: a TCP proxy lets the claim reach
//      the server and be applied, then cuts the connection instead of passing the reply on.
//      The call is refused as "not executed", and its retry — on the same instance or on
//      another — executes, instead of answering outcome_unknown once the orphaned claim's lease
//      runs out (issue 4).
//   5. (SQLite) the instance that serves the file's shared writer, whose commits the others
//      share, is SIGKILLed while they make calls: every call is answered and executed once
//      (a call whose reply died with the server is settled from the file), another instance
//      serves, and every call replays.
//   6. an operator's `idemgate evict`, a process of its own, reaches the replay cache of every
//      instance (Redis pub/sub, PostgreSQL NOTIFY, SQLite's eviction bell): a retry that was
//      answered from an instance's memory executes again there, once.
//
// Each instance has its own example server child; all the children append to ONE ledger file,
// so "how many times did it run?" is a line count across all instances.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { performance } from 'node:perf_hooks';
import { after, before, describe, it } from 'node:test';
import {
  EXAMPLE_SERVER,
  IDEMGATE,
  META,
  TURN,
  alive,
  assertReplayMarkers,
  condition,
  connectStdio,
  exampleEnv,
  isReplay,
  killExampleServersAfter,
  killPid,
  readLedger,
  readPids,
  requireIdemgate,
  servingPid,
  stripReplay,
  tempDir,
  until,
} from './helpers.mjs';
import { PostgresServer, RedisServer } from './servers.mjs';

// When the server's answer to a trapped request is complete, so the request was applied
// (see LossyProxy): 'cut' the connection; 'forward' an answer that is not the trapped
// request's (Redis's NOSCRIPT, after which the client sends EVAL); 'more' to wait for bytes.
const redisReply = (buf) => {
  if (!'-NOSCRIPT'.startsWith(buf.subarray(0, 9).toString())) return 'cut'; // the script ran
  return buf.length >= 9 && buf.includes('\r\n') ? 'forward' : 'more';
};
// ReadyForQuery ('Z', length 5, status idle): the statement's transaction has committed.
const READY_FOR_QUERY = Buffer.from([0x5a, 0, 0, 0, 5, 0x49]);
// ReadyForQuery inside a transaction (status 'T'): a batch's first pipeline, answered; its
// COMMIT follows.
const READY_IN_TRANSACTION = Buffer.from([0x5a, 0, 0, 0, 5, 0x54]);
const postgresReply = (buf) =>
  buf.includes(READY_FOR_QUERY) ? 'cut' : buf.includes(READY_IN_TRANSACTION) ? 'forward' : 'more';

const STORES = [
  {
    name: 'Redis',
    start: () => RedisServer.start(),
    url: (s, tag) => s.url(`${tag}:`),
    reply: redisReply,
  },
  {
    name: 'Redis Cluster',
    start: () => RedisServer.start({ cluster: true }),
    url: (s, tag) => s.url(`${tag}:`),
    // No lost-reply test: cluster clients follow CLUSTER SLOTS to the nodes themselves, past
    // any proxy. The Lua claim and abandon scripts are the same as on one server.
  },
  {
    name: 'PostgreSQL',
    start: () => PostgresServer.start(),
    url: (s, tag) => s.url(tag),
    reply: postgresReply,
    // The claim is written by the store's batch writer, in a transaction it opens with its
    // prepared BEGIN (idem_batch_begin); the claim first reads the key on another connection,
    // whose reply is not the one to lose. The cut is at the first ReadyForQuery that is idle:
    // the reply to the batch's COMMIT.
    writeMarker: 'idem_batch_begin',
  },
  {
    // One file, no server: the instances share their commits through the shared writer, which
    // the first of them to open the file serves (SERVER_KILLED kills it).
    name: 'SQLite',
    start: async () => {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idemgate-shared-sqlite-'));
      return { dir, stop: async () => fs.rmSync(dir, { recursive: true, force: true }) };
    },
    url: (s, tag) => `sqlite:${path.join(s.dir, `${tag}.db`)}`,
    serverless: true,
  },
];

const STORM =
  '150 duplicates over three instances: one execution, 150 identical answers, woken by the ' +
  'completion; every instance replays it';
const OWNER_DIED =
  'the owner instance SIGKILLed mid-call: the others answer outcome_unknown and never ' +
  'execute; on_unknown = "retry" takes over';
const STORE_DOWN =
  'the store killed under load: calls fail closed (retryable store error, no execution); ' +
  'after a restart calls work and completed outcomes still replay';

const SERVER_KILLED =
  'the instance serving the file\'s writes SIGKILLed under load: every call of the others is ' +
  'answered and executed once, one of them serves, and every call replays';

const EVICTED =
  'an operator evicts a completed call with `idemgate evict`: the instance that replayed it ' +
  'from its replay cache executes the next retry, once, and every instance replays that';

const LOST_REPLY =
  'a claim applied by the store whose reply is lost: the call is refused as not executed, ' +
  'and its retry executes (same instance or another), never outcome_unknown';

const TEST_TIMEOUT = 90000; // per test; each normally takes a few seconds
const CALL_TIMEOUT = 30000; // per tools/call, longer than any wait configured below

// Every instance fronts the same example server, so they share one scope;
// [mcp] scope names it for `idemgate key --scope`.
const SCOPE = 'shared-store-test';

/** Writes an idemgate config file into `dir`, its records in the scope SCOPE. */
function writeConfig(dir, name, text) {
  const file = path.join(dir, name);
  fs.writeFileSync(file, `${text}\n[mcp]\nscope = "${SCOPE}"\n`);
  return file;
}

/**
 * One `idemgate mcp --store URL --config FILE -- node server.js` with an SDK client over stdio.
 * Its example server appends to the ledger of `dir`, shared by every instance of the test.
 */
async function instance(t, dir, storeUrl, { config, env = {}, name }) {
  requireIdemgate();
  const serverEnv = exampleEnv(dir, env);
  killExampleServersAfter(t, serverEnv.EXAMPLE_LEDGER);
  const args = ['mcp', '--store', storeUrl, '--config', config, '--', 'node', EXAMPLE_SERVER];
  const conn = await connectStdio(t, { command: IDEMGATE, args, env: serverEnv, name });
  return { name, ...conn };
}

function charge(inst, turn, args) {
  return inst.client.callTool(
    { name: 'charge', arguments: args, _meta: { [TURN]: turn } },
    undefined,
    { timeout: CALL_TIMEOUT },
  );
}

function charges(ledger) {
  return readLedger(ledger).filter((e) => e.tool === 'charge');
}

/**
 * A TCP proxy in front of a store server that loses one reply for real. arm(marker, reply)
 * traps the first request that contains `marker`: it is passed to the server, which applies
 * it; the server's answer is withheld and, once `reply` says it is complete, the connection is
 * cut instead of answering. From then on the proxy is down (every connection is cut at once)
 * until heal(): the store died after applying the request, before its reply was sent.
 */
class LossyProxy {
  constructor(target) {
    this.target = target;
    this.sockets = new Set();
    this.down = false;
    this.trap = null;
    this.tripped = 0; // replies lost so far
    this.server = net.createServer((client) => this.#accept(client));
  }

  static async start(target) {
    const proxy = new LossyProxy(target);
    await new Promise((resolve) => proxy.server.listen(0, '127.0.0.1', resolve));
    return proxy;
  }

  get port() {
    return this.server.address().port;
  }

  // Loses the reply to the first request that carries `marker` on a connection that has
  // carried `writeMarker`, when given (a write rather than a read of the same key).
  arm(marker, reply, writeMarker) {
    this.trap = { marker: Buffer.from(marker), reply, write: writeMarker && Buffer.from(writeMarker) };
  }

  heal() {
    this.down = false;
  }

  async close() {
    this.#goDown();
    await new Promise((resolve) => this.server.close(resolve));
  }

  #goDown() {
    this.down = true;
    for (const s of this.sockets) s.destroy();
    this.sockets.clear();
  }

  #accept(client) {
    if (this.down) return client.destroy();
    const upstream = net.connect(this.target.port, this.target.host);
    this.sockets.add(client);
    this.sockets.add(upstream);
    let trap = null; // this connection carries the trapped request
    let wrote = false; // this connection carried the trap's write marker
    let answer = Buffer.alloc(0);
    const drop = () => {
      client.destroy();
      upstream.destroy();
      this.sockets.delete(client);
      this.sockets.delete(upstream);
    };
    for (const s of [client, upstream]) {
      s.on('error', drop);
      s.on('close', drop);
    }
    client.on('data', (d) => {
      if (this.down) return drop();
      if (this.trap?.write && d.includes(this.trap.write)) wrote = true;
      if (this.trap && !trap && d.includes(this.trap.marker) && (!this.trap.write || wrote)) {
        trap = this.trap;
        this.trap = null;
      }
      upstream.write(d);
    });
    upstream.on('data', (d) => {
      if (this.down) return drop();
      if (!trap) return client.write(d);
      answer = Buffer.concat([answer, d]);
      const verdict = trap.reply(answer);
      if (verdict === 'forward') {
        client.write(answer);
        answer = Buffer.alloc(0);
      } else if (verdict === 'cut') {
        this.tripped++;
        this.#goDown();
      }
    });
  }
}

const run = promisify(execFile);

/** The record of a charge as `idemgate inspect --json` shows it, or null if there is none. */
async function inspectCharge(storeUrl, turn, args) {
  const key = (
    await run(IDEMGATE, [
      'key', '--turn', turn, '--tool', 'charge', '--args', JSON.stringify(args), '--scope', SCOPE,
    ])
  ).stdout.trim();
  const shown = await run(IDEMGATE, ['--store', storeUrl, 'inspect', key, '--json']).catch((e) => e);
  return shown.code === 1 ? null : JSON.parse(shown.stdout);
}

/** The stderr of every instance, for failure messages. */
function stderrOf(insts) {
  return insts.map((i) => `--- ${i.name} stderr:\n${i.stderr.text}`).join('\n');
}

for (const store of STORES) {
  describe(`shared store: ${store.name}`, () => {
    let server;
    before(async () => {
      server = await store.start();
    });
    after(async () => {
      await server?.stop();
    });

    // ------------------------------------------------------------------------------------------
    it(STORM, { timeout: TEST_TIMEOUT }, async (t) => {
      const dir = tempDir(t);
      const ledger = exampleEnv(dir).EXAMPLE_LEDGER;
      const url = store.url(server, 'storm');
      // wait = 20 s: a waiter that was not woken by the completion would sit here for 20 s.
      const config = writeConfig(dir, 'idemgate.toml', '[defaults]\nwait = "20s"\n');
      const insts = await Promise.all(
        [0, 1, 2].map((i) =>
          instance(t, dir, url, { config, env: { EXAMPLE_DELAY_MS: '500' }, name: `storm-${i}` }),
        ),
      );
      const ARGS = { customer: 'cus_storm', amount_cents: 4200, currency: 'EUR' };
      const TURN_ID = 'turn-storm';

      const t0 = performance.now();
      const calls = [];
      for (const [i, inst] of insts.entries()) {
        for (let j = 0; j < 50; j++) {
          calls.push(
            charge(inst, TURN_ID, ARGS).then((result) => ({
              result,
              inst: i,
              at: performance.now() - t0,
            })),
          );
        }
      }
      const answers = await Promise.all(calls);
      const total = performance.now() - t0;

      const lines = charges(ledger);
      assert.equal(lines.length, 1, `exactly one charge in the ledger:\n${stderrOf(insts)}`);
      for (const a of answers) {
        assert.ok(!a.result.isError, `no condition, no error: ${JSON.stringify(a.result)}`);
      }
      const executed = answers.filter((a) => !isReplay(a.result));
      assert.equal(executed.length, 1, 'one answer is the execution, 149 are replays');
      const outcomes = answers.map((a) => stripReplay(a.result));
      for (const o of outcomes) assert.deepEqual(o, outcomes[0], 'identical outcomes');
      assert.equal(outcomes[0].structuredContent.id, lines[0].result.id);
      for (const a of answers) if (isReplay(a.result)) assertReplayMarkers(a.result);

      // Woken by the completion (pub/sub, LISTEN/NOTIFY, in-process), not by the 20 s wait.
      const exec = executed[0];
      const lastDup = Math.max(...answers.filter((a) => a !== exec).map((a) => a.at));
      const wake = lastDup - exec.at;
      const perInstance = [0, 1, 2].map((i) => {
        const mine = answers.filter((a) => a.inst === i && a !== exec);
        return Math.max(...mine.map((a) => a.at)) - exec.at;
      });
      // The duplicates on the two other instances were woken across processes.
      const across = answers
        .filter((a) => a.inst !== exec.inst)
        .map((a) => a.at - exec.at)
        .sort((x, y) => x - y);
      t.diagnostic(
        `${store.name}: 150 calls in ${total.toFixed(0)} ms; the execution (instance ` +
          `${exec.inst}) answered at ${exec.at.toFixed(0)} ms; the last duplicate ` +
          `${wake.toFixed(1)} ms later (last per instance: ` +
          `${perInstance.map((w) => w.toFixed(1)).join(' / ')} ms; on the other instances ` +
          `first ${across[0].toFixed(1)}, median ${across[across.length >> 1].toFixed(1)} ms)`,
      );
      assert.ok(total < 10000, `all 150 answered in ${total.toFixed(0)} ms, far below wait = 20 s`);
      assert.ok(wake < 5000, `the duplicates were woken within ${wake.toFixed(0)} ms`);

      // The completed record is replayed by every instance.
      for (const inst of insts) {
        const r = await charge(inst, TURN_ID, ARGS);
        assertReplayMarkers(r);
        assert.deepEqual(stripReplay(r), outcomes[0], `${inst.name} replays the outcome`);
      }
      assert.equal(charges(ledger).length, 1, 'still one charge');
    });

    // ------------------------------------------------------------------------------------------
    it(OWNER_DIED, { timeout: TEST_TIMEOUT }, async (t) => {
      const dir = tempDir(t);
      const ledger = exampleEnv(dir).EXAMPLE_LEDGER;
      const url = store.url(server, 'ownerdied');
      // wait (5 s) outlasts the lease (1 s): a duplicate waits for the dead owner's lease to
      // run out and then answers, instead of "in progress, retry later".
      const failConfig = writeConfig(
        dir,
        'fail.toml',
        '[defaults]\nlease = "1s"\nwait = "5s"\non_unknown = "fail"\n',
      );
      const retryConfig = writeConfig(
        dir,
        'retry.toml',
        '[defaults]\nlease = "1s"\nwait = "5s"\non_unknown = "retry"\n',
      );
      const slow = { EXAMPLE_SLOW_TOOL: 'charge', EXAMPLE_DELAY_MS: '3000' };
      const ARGS = { customer: 'cus_owner', amount_cents: 5000, currency: 'EUR' };

      // The owner A is killed after the charge is in the ledger, before it answers (the
      // example server sits in its 3 s delay); its example server is killed with it.
      const killOwnerMidCall = async (owner, turn, linesBefore) => {
        const pending = charge(owner, turn, ARGS).then(
          (result) => ({ result }),
          (error) => ({ error }),
        );
        await until(() => charges(ledger).length === linesBefore + 1, {
          what: `${owner.name}'s charge in the ledger`,
        });
        const child = charges(ledger)[linesBefore].pid;
        assert.ok(readPids(ledger).includes(child), 'the executing server is in LEDGER.pids');
        process.kill(owner.pid, 'SIGKILL');
        killPid(child);
        const lost = await pending;
        assert.ok(lost.error, `${owner.name}'s client lost its answer: ${JSON.stringify(lost)}`);
        await until(() => !alive(owner.pid) && !alive(child), {
          what: `${owner.name} and its server to exit`,
        });
      };

      const [a, b, c] = await Promise.all(
        ['A', 'B', 'C'].map((name) =>
          instance(t, dir, url, { config: failConfig, env: slow, name }),
        ),
      );
      await killOwnerMidCall(a, 'turn-owner-1', 0);

      // B and C, at once: each answers outcome_unknown, neither executes.
      const both = await Promise.all([b, c].map((i) => charge(i, 'turn-owner-1', ARGS)));
      for (const [k, r] of both.entries()) {
        const who = k === 0 ? 'B' : 'C';
        assert.equal(r.isError, true, `${who}: a condition: ${JSON.stringify(r)}`);
        assert.equal(condition(r), 'outcome_unknown', `${who}: ${JSON.stringify(r)}`);
        assert.match(r.content.map((x) => x.text ?? '').join('\n'), /unknown/i);
      }
      assert.equal(both[0]._meta[META + 'key'], both[1]._meta[META + 'key'], 'one key');
      // And again, once the record is marked unknown: still no execution.
      for (const i of [b, c]) {
        const r = await charge(i, 'turn-owner-1', ARGS);
        assert.equal(condition(r), 'outcome_unknown', `${i.name} again: ${JSON.stringify(r)}`);
      }
      assert.equal(charges(ledger).length, 1, `no second charge:\n${stderrOf([b, c])}`);

      // A second key (another turn): its owner A2 dies the same way; B, restarted with
      // on_unknown = "retry", takes over and executes again. The ledger grows by one: expected
      // for "retry", which is safe only when the upstream deduplicates on the key idemgate
      // forwards, the same for both executions.
      const a2 = await instance(t, dir, url, { config: failConfig, env: slow, name: 'A2' });
      await killOwnerMidCall(a2, 'turn-owner-2', 1);
      await b.client.close();
      const bRetry = await instance(t, dir, url, { config: retryConfig, name: 'B (retry)' });
      const took = await charge(bRetry, 'turn-owner-2', ARGS);
      assert.ok(!took.isError && !isReplay(took), `B executed: ${JSON.stringify(took)}`);
      const lines = charges(ledger);
      assert.equal(lines.length, 3, 'one more charge: the take-over executed (on_unknown = retry)');
      assert.equal(took.structuredContent.id, lines[2].result.id);
      const forwarded = (e) => e.meta?.[META + 'idempotencyKey'];
      assert.ok(forwarded(lines[1]), 'the key was forwarded upstream');
      assert.equal(forwarded(lines[2]), forwarded(lines[1]), 'the same key both times');
      assert.notEqual(forwarded(lines[0]), forwarded(lines[1]), 'two keys');
      // The take-over's outcome is now what every instance replays.
      const replay = await charge(c, 'turn-owner-2', ARGS);
      assertReplayMarkers(replay);
      assert.deepEqual(stripReplay(replay), stripReplay(took));
      assert.equal(charges(ledger).length, 3);
    });

    // ------------------------------------------------------------------------------------------
    it(EVICTED, { timeout: TEST_TIMEOUT }, async (t) => {
      const dir = tempDir(t);
      const ledger = exampleEnv(dir).EXAMPLE_LEDGER;
      const url = store.url(server, 'evict');
      const config = writeConfig(dir, 'idemgate.toml', '');
      const [a, b] = await Promise.all(
        ['evict-a', 'evict-b'].map((name) => instance(t, dir, url, { config, name })),
      );
      const ARGS = { customer: 'cus_evict', amount_cents: 700, currency: 'EUR' };
      const first = await charge(a, 'turn-evict', ARGS);
      assert.ok(!isReplay(first), `A executes: ${JSON.stringify(first)}`);
      // B reads the record from the store and keeps it; its second answer is from memory.
      let replay;
      for (let i = 0; i < 2; i++) {
        replay = await charge(b, 'turn-evict', ARGS);
        assertReplayMarkers(replay);
        assert.deepEqual(stripReplay(replay), stripReplay(first));
      }
      const key = replay._meta[META + 'key'];
      const evicted = await run(IDEMGATE, ['evict', key, '--store', url]);
      assert.match(evicted.stdout, /evicted/);

      // The announcement reaches B a moment after the evict returns (the window README's "The
      // replay cache" documents): B's retry executes once it has heard.
      const again = await until(
        async () => {
          const r = await charge(b, 'turn-evict', ARGS);
          return isReplay(r) ? null : r;
        },
        { what: `B to execute the evicted call again:\n${stderrOf([a, b])}` },
      );
      assert.notEqual(again.structuredContent.id, first.structuredContent.id);
      assert.equal(charges(ledger).length, 2, 'executed once more, not twice');
      // A, which executed the first call and kept it, hears of the eviction as B did.
      for (const inst of [a, b]) {
        await until(
          async () => {
            const r = await charge(inst, 'turn-evict', ARGS);
            assertReplayMarkers(r);
            return r.structuredContent.id === again.structuredContent.id;
          },
          { what: `${inst.name} to replay the new outcome` },
        );
      }
      assert.equal(charges(ledger).length, 2);
    });

    // ------------------------------------------------------------------------------------------
    it(SERVER_KILLED, { timeout: TEST_TIMEOUT, skip: !store.serverless && 'a store server' }, async (t) => {
      const dir = tempDir(t);
      const ledger = exampleEnv(dir).EXAMPLE_LEDGER;
      const url = store.url(server, 'serverkilled');
      const config = writeConfig(dir, 'idemgate.toml', '[defaults]\nwait = "10s"\n');
      // S opens the file first, so it serves; B and C then hand it their writes.
      const s = await instance(t, dir, url, { config, name: 'S' });
      const [b, c] = await Promise.all(
        ['B', 'C'].map((name) =>
          instance(t, dir, url, { config, env: { EXAMPLE_DELAY_MS: '20' }, name }),
        ),
      );
      assert.equal(servingPid(url), s.pid, 'S holds the shared writer\'s lock');

      const PER = 40;
      const args = (who, n) => ({ customer: `cus_${who}_${n}`, amount_cents: 100 + n, currency: 'EUR' });
      const turn = (who, n) => `turn-${who}-${n}`;
      let done = 0;
      const killed = (async () => {
        await until(() => done >= PER / 2, { what: 'half of the calls' });
        process.kill(s.pid, 'SIGKILL');
        await until(() => !alive(s.pid), { what: 'S to exit' });
      })();
      const results = await Promise.all(
        [
          ['b', b],
          ['c', c],
        ].map(async ([who, inst]) => {
          const out = [];
          for (let n = 0; n < PER; n++) {
            out.push(await charge(inst, turn(who, n), args(who, n)));
            done++;
          }
          return out;
        }),
      );
      await killed;
      for (const r of results.flat()) {
        assert.ok(!r.isError && !isReplay(r), `executed: ${JSON.stringify(r)}\n${stderrOf([b, c])}`);
      }
      const lines = charges(ledger);
      assert.equal(lines.length, 2 * PER, `each call executed once:\n${stderrOf([b, c])}`);
      assert.ok([b.pid, c.pid].includes(servingPid(url)), 'B or C serves now');

      // Every call replays, each on the other instance, with its first answer.
      for (const [k, [who, inst]] of [
        ['b', c],
        ['c', b],
      ].entries()) {
        for (let n = 0; n < PER; n++) {
          const r = await charge(inst, turn(who, n), args(who, n));
          assertReplayMarkers(r);
          assert.deepEqual(stripReplay(r), stripReplay(results[k][n]));
        }
      }
      assert.equal(charges(ledger).length, 2 * PER, 'no call executed again');
    });

    // ------------------------------------------------------------------------------------------
    it(STORE_DOWN, { timeout: TEST_TIMEOUT, skip: store.serverless && 'no server' }, async (t) => {
      const dir = tempDir(t);
      const ledger = exampleEnv(dir).EXAMPLE_LEDGER;
      const url = store.url(server, 'storedown');
      // A short lease, so that a call whose outcome could not be stored is "unknown" soon
      // after the restart; wait outlasts it.
      const config = writeConfig(
        dir,
        'idemgate.toml',
        '[defaults]\nlease = "2s"\nwait = "3s"\n',
      );
      const insts = await Promise.all(
        [0, 1, 2].map((i) =>
          instance(t, dir, url, { config, env: { EXAMPLE_DELAY_MS: '100' }, name: `load-${i}` }),
        ),
      );

      // Every call has its own turn and its own customer, so a ledger line names its call.
      const calls = []; // { n, turn, args, inst, phase, kind, result?, error? }
      let next = 0;
      const newCall = (phase) => {
        const n = next++;
        return {
          n,
          phase,
          turn: `turn-load-${n}`,
          args: { customer: `cus_load_${n}`, amount_cents: 100 + n, currency: 'EUR' },
        };
      };
      const classify = (c) => {
        if (c.result) {
          if (isReplay(c.result)) return 'replayed';
          return c.result.isError ? `condition:${condition(c.result)}` : 'executed';
        }
        const cond = c.error.data?.[META + 'condition'];
        if (c.error.code === -32001) return 'store_unavailable';
        if (cond) return `error:${c.error.code}:${cond}`;
        return `error:${c.error.code ?? c.error.message}`;
      };
      const attempt = async (inst, c) => {
        c.inst = inst;
        try {
          c.result = await charge(inst, c.turn, c.args);
        } catch (e) {
          c.error = e;
        }
        c.kind = classify(c);
        return c;
      };
      const run = async (inst, phase) => {
        const c = newCall(phase);
        calls.push(c);
        return attempt(inst, c);
      };
      const customers = (lines) => new Set(lines.map((e) => e.args.customer));
      const kinds = (phase) => {
        const m = {};
        for (const c of calls.filter((x) => x.phase === phase)) m[c.kind] = (m[c.kind] ?? 0) + 1;
        return JSON.stringify(m);
      };

      // 1. Calls completed before the crash.
      for (let k = 0; k < 9; k++) {
        const c = await run(insts[k % 3], 'before');
        assert.equal(c.kind, 'executed', `${JSON.stringify(c.result ?? c.error)}`);
      }

      // 2. Load: three workers per instance, each sending calls one after another, until the
      //    store is down and it has got an answer other than an execution.
      let killed = false;
      let stopLoad = false;
      const worker = async (inst) => {
        while (!stopLoad) {
          const c = await run(inst, killed ? 'down' : 'load');
          if (killed && c.kind !== 'executed' && c.kind !== 'error:-32003:not_stored') return;
        }
      };
      const workers = insts.flatMap((inst) => [0, 1, 2].map(() => worker(inst)));
      const stopTimer = setTimeout(() => (stopLoad = true), 30000);
      try {
        await until(
          () => calls.filter((c) => c.phase === 'load' && c.kind === 'executed').length >= 9,
          { what: 'calls completing under load' },
        );
        killed = true;
        await server.kill();
        await Promise.all(workers);
      } finally {
        stopLoad = true;
        clearTimeout(stopTimer);
        await Promise.allSettled(workers);
      }
      t.diagnostic(`${store.name}: under load ${kinds('load')}; after the kill ${kinds('down')}`);

      // 3. Fail closed: a JSON-RPC error that says the store is unavailable and retryable.
      const refused = calls.filter((c) => c.kind === 'store_unavailable');
      assert.ok(refused.length > 0, `some calls were refused:\n${stderrOf(insts)}`);
      t.diagnostic(`${store.name}: store down → ${JSON.stringify({
        code: refused[0].error.code,
        message: refused[0].error.message,
        data: refused[0].error.data,
      })}`);
      for (const c of refused) {
        assert.equal(c.error.code, -32001);
        assert.match(c.error.message, /could not reach its store/);
        assert.match(c.error.message, /was not executed/);
        assert.match(c.error.message, /safe to retry/);
        assert.deepEqual(c.error.data, {
          [META + 'condition']: 'store_unavailable',
          retryable: true,
        });
      }
      const notStored = calls.filter((c) => c.kind === 'error:-32003:not_stored');
      if (notStored.length) {
        t.diagnostic(`${store.name}: in flight at the crash → ${notStored[0].error.message}`);
      }
      const allowed = new Set(['executed', 'store_unavailable', 'error:-32003:not_stored']);
      for (const c of calls) {
        const got = c.error?.message ?? JSON.stringify(c.result);
        assert.ok(allowed.has(c.kind), `call ${c.n} (${c.phase}): ${c.kind}: ${got}`);
      }
      // Nothing executes without a claim: the ledger holds exactly the calls that executed
      // (answered, or ran but their outcome could not be stored), and none that was refused.
      const ran = customers(charges(ledger));
      for (const c of refused) {
        assert.ok(!ran.has(c.args.customer), `refused call ${c.n} did not run`);
      }
      const expected = new Set(
        calls.filter((c) => c.kind !== 'store_unavailable').map((c) => c.args.customer),
      );
      assert.deepEqual([...ran].sort(), [...expected].sort(), 'ledger = executed calls');
      assert.equal(charges(ledger).length, ran.size, 'one line per executed call');

      // 4. The store comes back on the same port and data: calls work again on every instance.
      await server.restart();
      for (const inst of insts) {
        await until(async () => (await run(inst, 'recovery')).kind === 'executed', {
          ms: 30000,
          every: 200,
          what: `${inst.name} to execute a call again:\n${stderrOf(insts)}`,
        });
      }
      t.diagnostic(`${store.name}: after the restart ${kinds('recovery')}`);

      // 5. Every outcome completed before the crash replays, through another instance.
      const completed = calls.filter((c) => c.phase !== 'recovery' && c.kind === 'executed');
      const replays = await Promise.all(
        completed.map((c) => charge(insts[(insts.indexOf(c.inst) + 1) % 3], c.turn, c.args)),
      );
      for (const [k, r] of replays.entries()) {
        assert.ok(isReplay(r), `call ${completed[k].n} replays: ${JSON.stringify(r)}`);
        const n = completed[k].n;
        assert.deepEqual(stripReplay(r), stripReplay(completed[k].result), `call ${n}`);
      }
      // A call that ran but whose completion was not acknowledged is never re-run: it is
      // "outcome unknown", or a replay when the store had applied the completion before the
      // connection broke (its reply was lost, the outcome was not).
      for (const c of notStored) {
        const r = await charge(c.inst, c.turn, c.args);
        assert.ok(
          condition(r) === 'outcome_unknown' || isReplay(r),
          `call ${c.n}: ${JSON.stringify(r)}`,
        );
      }
      // A refused call was "not executed" and "safe to retry": retried now, it runs (once).
      // (A claim cut off mid-flight may have been applied by the store before it died; the
      // retry must still run it, not call it "outcome unknown": nothing was ever sent.)
      const retried = await Promise.all(
        refused.map((c) => attempt(c.inst, { ...c, result: undefined, error: undefined })),
      );
      const retriedKinds = {};
      for (const r of retried) retriedKinds[r.kind] = (retriedKinds[r.kind] ?? 0) + 1;
      t.diagnostic(
        `${store.name}: refused calls retried after the restart: ${JSON.stringify(retriedKinds)}`,
      );
      const ranNow = customers(charges(ledger));
      for (const r of retried) {
        if (r.kind !== 'executed') {
          assert.ok(!ranNow.has(r.args.customer), `refused call ${r.n} never ran`);
        }
      }
      // Regression (issue 4): when the store dies after applying a claim but before its
      // reply arrives, the call is refused as "not executed"; its claim carries the
      // attempt's owner token, and the instance abandons it (in the background once the
      // store is back, and before a retry of the same call claims), so the retry executes
      // instead of answering outcome_unknown once the orphaned claim's lease ran out.
      await t.test('every refused call runs when retried after the restart', () => {
        for (const [k, r] of retried.entries()) {
          assert.equal(
            r.kind,
            'executed',
            `refused call ${r.n} ("${refused[k].error.message}") retried after the restart: ` +
              `${JSON.stringify(r.result ?? r.error?.message)}`,
          );
        }
      });

      // Never twice: one ledger line per customer at most, over the whole test.
      const all = charges(ledger);
      assert.equal(all.length, customers(all).size, 'no call executed twice');
    });

    // ------------------------------------------------------------------------------------------
    it(LOST_REPLY, { timeout: TEST_TIMEOUT, skip: !store.reply && 'no proxy' }, async (t) => {
      const dir = tempDir(t);
      const ledger = exampleEnv(dir).EXAMPLE_LEDGER;
      const url = store.url(server, 'lostreply');
      const direct = new URL(url);
      const proxy = await LossyProxy.start({ host: direct.hostname, port: Number(direct.port) });
      t.after(() => proxy.close());
      const proxied = new URL(url);
      proxied.port = String(proxy.port);
      // The orphaned claim's lease (30 s) outlasts the whole test: without the fix, a retry
      // would wait on it for `wait` and answer "in progress", or later outcome_unknown.
      const config = writeConfig(dir, 'idemgate.toml', '[defaults]\nlease = "30s"\nwait = "20s"\n');
      const a = await instance(t, dir, proxied.toString(), { config, name: 'A (lossy link)' });
      const b = await instance(t, dir, url, { config, name: 'B' });
      const insts = [a, b];

      // Loses the claim's reply of `turn` on A; returns the refusal.
      const loseClaimReply = async (turn, args) => {
        const before = proxy.tripped;
        proxy.arm(turn, store.reply, store.writeMarker);
        const refused = await charge(a, turn, args).then(
          (result) => assert.fail(`A answered: ${JSON.stringify(result)}`),
          (error) => error,
        );
        assert.equal(proxy.tripped, before + 1, 'the claim reached the store, its reply was cut');
        assert.equal(refused.code, -32001, `${refused.message}\n${stderrOf(insts)}`);
        assert.match(refused.message, /was not executed/);
        assert.match(refused.message, /safe to retry/);
        // The claim was applied: the record is in progress, and nothing ran.
        const orphan = await inspectCharge(url, turn, args);
        assert.equal(orphan?.state, 'in_progress', `the orphaned claim: ${JSON.stringify(orphan)}`);
        return refused;
      };

      // A retry as a client does it: again while the answer is the retryable -32001 (right
      // after the heal, A's connection pool may still be in its reconnect backoff).
      const retry = async (inst, turn, args) => {
        for (let n = 0; ; n++) {
          try {
            return await charge(inst, turn, args);
          } catch (e) {
            if (e.code !== -32001 || n >= 50) throw e;
            await new Promise((resolve) => setTimeout(resolve, 100));
          }
        }
      };

      // 1. The retry lands on another instance: it waits on the orphaned claim until A, whose
      //    store is reachable again, takes the claim back; then it executes.
      const ARGS1 = { customer: 'cus_lost_1', amount_cents: 700, currency: 'EUR' };
      await loseClaimReply('turn-lost-1', ARGS1);
      assert.equal(charges(ledger).length, 0, 'nothing ran');
      const onB = charge(b, 'turn-lost-1', ARGS1);
      proxy.heal();
      const r1 = await onB;
      assert.ok(!r1.isError && !isReplay(r1), `B executed: ${JSON.stringify(r1)}`);
      const again1 = await retry(a, 'turn-lost-1', ARGS1);
      assert.ok(isReplay(again1), `A replays B's execution: ${JSON.stringify(again1)}`);

      // 2. The retry lands on the same instance: it takes its own orphaned claim back first.
      const ARGS2 = { customer: 'cus_lost_2', amount_cents: 800, currency: 'EUR' };
      await loseClaimReply('turn-lost-2', ARGS2);
      proxy.heal();
      const r2 = await retry(a, 'turn-lost-2', ARGS2);
      assert.ok(!r2.isError && !isReplay(r2), `A executed: ${JSON.stringify(r2)}`);

      const lines = charges(ledger);
      assert.deepEqual(
        lines.map((e) => e.args.customer).sort(),
        ['cus_lost_1', 'cus_lost_2'],
        `each refused call ran once, on its retry:\n${stderrOf(insts)}`,
      );
    });
  });
}
