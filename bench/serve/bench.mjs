#!/usr/bin/env node
// Benchmark of `idemgate serve` (the ledger API, docs/DESIGN.md §6.3) on Redis: CPU per call of
// the front and of Redis, calls/s and p99, for two builds taking turns in every round, so that a
// change compares by ratios within one run (this VM's absolute figures move by ±20% from round
// to round).
//
//   node bench/serve/bench.mjs --idemgate NEW --baseline OLD [--seconds 5] [--rounds 5]
//                              [--clients 32] [--keys 1000]
//
// Modes, each driven by --clients keep-alive HTTP clients in this process, one call in flight each:
//   fresh   POST /v1/calls/begin with a new key (decision "execute"), then POST /v1/calls/complete
//           with its fence: one call is the two requests.
//   replay  POST /v1/calls/begin of one of --keys keys completed before the first round (decision
//           "replay"): one call is that request.
// Every answer is checked; anything else makes the bench exit 1. CPU per call is utime+stime
// from /proc/PID/stat before and after the run, divided by the calls. Redis is one server of
// tests/servers/redis.sh (appendonly, appendfsync always); NEW uses database 0, OLD database 1
// (an audit chain each). The load generator shares the machine's CPUs with both.
import { spawn, execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const REDIS_SH = path.resolve(HERE, '../../tests/servers/redis.sh');
const CLK_TCK = Number(execFileSync('getconf', ['CLK_TCK']).toString().trim()) || 100;

function usage(msg) {
  if (msg) console.error(`bench/serve: ${msg}`);
  console.error('usage: node bench/serve/bench.mjs --idemgate NEW --baseline OLD [--seconds 5] ' +
    '[--rounds 5] [--clients 32] [--keys 1000]');
  process.exit(2);
}

const opts = { idemgate: '', baseline: '', seconds: 5, rounds: 5, clients: 32, keys: 1000 };
for (let i = 2; i < process.argv.length; i++) {
  const a = process.argv[i];
  const v = () => (i + 1 < process.argv.length ? process.argv[++i] : usage(`${a} needs a value`));
  if (a === '--idemgate') opts.idemgate = v();
  else if (a === '--baseline') opts.baseline = v();
  else if (['--seconds', '--rounds', '--clients', '--keys'].includes(a)) opts[a.slice(2)] = Number(v());
  else usage(`unknown argument ${a}`);
}
for (const b of [opts.idemgate, opts.baseline]) {
  if (!b || !fs.existsSync(b)) usage(`no such binary: ${b || '(give --idemgate and --baseline)'}`);
}

// ── Processes, stopped by their pids ──────────────────────────────────────────────────────────

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'serve-bench-'));
const redisDir = path.join(tmp, 'redis');
const children = [];
function cleanup() {
  for (const c of children) if (c.exitCode === null) c.kill('SIGTERM');
  try { execFileSync('bash', [REDIS_SH, 'stop', redisDir], { stdio: 'ignore' }); } catch { /* */ }
}
process.on('exit', cleanup);
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(130));

/** Starts `idemgate serve` and resolves with its pid and URL once it says where it listens. */
function serve(bin, store) {
  const child = spawn(bin, ['serve', '--listen', '127.0.0.1:0', '--store', store],
    { stdio: ['ignore', 'ignore', 'pipe'] });
  children.push(child);
  return new Promise((resolve, reject) => {
    let seen = '';
    child.stderr.on('data', (c) => {
      seen += c;
      const m = seen.match(/listening on (http:\/\/[\d.:]+)/);
      if (m) resolve({ pid: child.pid, url: m[1] });
    });
    child.on('exit', (code) => reject(new Error(`${bin} serve exited (${code}):\n${seen}`)));
  });
}

/** utime+stime of all of a process's threads, µs. */
function cpu(pid) {
  const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return ((Number(f[11]) + Number(f[12])) * 1e6) / CLK_TCK;
}

// ── Load ──────────────────────────────────────────────────────────────────────────────────────

function post(agent, url, route, body) {
  const data = JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = http.request(`${url}/v1/calls/${route}`, {
      agent, method: 'POST',
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) },
    }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c) => (text += c));
      res.on('end', () => (res.statusCode === 200 ? resolve(JSON.parse(text))
        : reject(new Error(`${route}: HTTP ${res.statusCode} ${text}`))));
    });
    req.on('error', reject);
    req.end(data);
  });
}

const OUTCOME = { status: 'success', result: { id: 'ch_bench', amount: 1999, currency: 'usd' } };

/** One call: a fresh key begun and completed, or a completed key begun again. */
async function call(agent, url, mode, key) {
  const begun = await post(agent, url, 'begin', { key, tool: 'charge', args: { amount: 1999 } });
  if (mode === 'replay') {
    if (begun.decision !== 'replay') throw new Error(`replay of ${key}: ${JSON.stringify(begun)}`);
    return;
  }
  if (begun.decision !== 'execute') throw new Error(`begin ${key}: ${JSON.stringify(begun)}`);
  const done = await post(agent, url, 'complete', { key, fence: begun.fence, outcome: OUTCOME });
  if (done.state !== 'completed') throw new Error(`complete ${key}: ${JSON.stringify(done)}`);
}

/** --clients loops of calls for --seconds; calls, p99 latency and the CPU of front and Redis. */
async function run(front, redisPid, mode, prefix) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: opts.clients });
  const latencies = [];
  let n = 0;
  const end = Date.now() + opts.seconds * 1000;
  const cpu0 = [cpu(front.pid), cpu(redisPid)];
  const t0 = process.hrtime.bigint();
  await Promise.all(Array.from({ length: opts.clients }, async (_, c) => {
    for (let i = 0; Date.now() < end; i++) {
      const key = mode === 'fresh' ? `${prefix}-${c}-${i}` : `warm-${(c * 7919 + i) % opts.keys}`;
      const s = process.hrtime.bigint();
      await call(agent, front.url, mode, key);
      latencies.push(Number(process.hrtime.bigint() - s) / 1000);
      n++;
    }
  }));
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  agent.destroy();
  latencies.sort((a, b) => a - b);
  return {
    calls: n, rate: n / seconds, p99_ms: latencies[Math.floor(latencies.length * 0.99)] / 1000,
    front_us: (cpu(front.pid) - cpu0[0]) / n, redis_us: (cpu(redisPid) - cpu0[1]) / n,
  };
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const fmt = (x, d = 1) => x.toFixed(d);

async function main() {
  execFileSync('bash', [REDIS_SH, 'start', redisDir, 'auto'], { stdio: ['ignore', 'ignore', 'inherit'] });
  const redisUrl = fs.readFileSync(path.join(redisDir, 'url'), 'utf8').trim();
  const redisPid = Number(fs.readFileSync(path.join(redisDir, 'redis.pid'), 'utf8').trim());
  const fronts = {
    new: await serve(opts.idemgate, `${redisUrl}/0`),
    old: await serve(opts.baseline, `${redisUrl}/1`),
  };
  console.log(`serve bench: ${opts.clients} clients, ${opts.seconds} s, ${opts.rounds} rounds, ` +
    `${opts.keys} replay keys; ${new Date().toISOString()}; load average ${os.loadavg()[0].toFixed(2)}`);
  console.log(`new: ${opts.idemgate}\nold: ${opts.baseline}\nredis: ${redisUrl} (appendfsync always)`);
  for (const f of Object.values(fronts)) {  // the replay keys, and a warm-up of every path
    const agent = new http.Agent({ keepAlive: true, maxSockets: 16 });
    for (let k = 0; k < opts.keys; k += 16) {
      await Promise.all(Array.from({ length: Math.min(16, opts.keys - k) },
        (_, j) => call(agent, f.url, 'fresh', `warm-${k + j}`)));
    }
    agent.destroy();
  }
  const nonce = randomBytes(4).toString('hex');
  const ratios = { fresh: [], replay: [] };
  for (let r = 1; r <= opts.rounds; r++) {
    const order = r % 2 ? ['new', 'old'] : ['old', 'new'];
    for (const mode of ['fresh', 'replay']) {
      const got = {};
      for (const which of order) {
        got[which] = await run(fronts[which], redisPid, mode, `${nonce}-${r}-${which}`);
        const g = got[which];
        console.log(`round ${r}  ${which} ${mode.padEnd(6)}  ${fmt(g.rate, 0).padStart(6)} calls/s  ` +
          `p99 ${fmt(g.p99_ms, 2)} ms  CPU µs/call front ${fmt(g.front_us)} redis ${fmt(g.redis_us)}`);
      }
      ratios[mode].push({
        front: got.new.front_us / got.old.front_us, redis: got.new.redis_us / got.old.redis_us,
        rate: got.new.rate / got.old.rate, p99: got.new.p99_ms / got.old.p99_ms,
      });
    }
  }
  console.log('\nnew / old (medians of per-round ratios, with their range):');
  for (const mode of ['fresh', 'replay']) {
    const cols = ['front', 'redis', 'rate', 'p99'].map((k) => {
      const xs = ratios[mode].map((x) => x[k]);
      return `${k === 'rate' ? 'calls/s' : k === 'p99' ? 'p99' : `CPU ${k}`} ${fmt(median(xs), 2)} ` +
        `(${fmt(Math.min(...xs), 2)}–${fmt(Math.max(...xs), 2)})`;
    });
    console.log(`${mode.padEnd(6)}  ${cols.join('  ')}`);
  }
}

main().then(() => process.exit(0), (e) => {
  console.error(`bench/serve: ${e.stack ?? e}`);
  process.exit(1);
});
