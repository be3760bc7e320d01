#!/usr/bin/env node
// HTTP benchmark of `idemgate http` (issue 5): requests/s, p50/p99 latency (wrk --latency) and
// CPU time per request of every process in the path, for POST /v1/charges with fresh
// Idempotency-Keys and with replays, through idemgate and through the two Node idempotency
// middlewares people use today, against the example vendor called directly, all in one run on
// one Redis. Run it through bench/http/bench.sh, which installs the npm packages first.
//
//   node bench/http/bench.mjs [--seconds 10] [--rounds 3] [--threads 2] [--connections 32]
//                             [--keys 1000] [--warmup 2] [--idemgate PATH] [--only FRONT,FRONT]
//                             [--redis-fsync always|everysec] [--json FILE] [--baseline PATH]
//
// Fronts (each is the target of wrk; all but `vendor` forward to the same vendor process):
//   vendor            examples/http-vendor/server.mjs --no-fsync called directly: the baseline.
//                     It honours Idempotency-Key itself (an in-memory map), so its replays are
//                     answered without a side effect, as the fronts' are.
//   idemgate          idemgate http --listen 127.0.0.1:0 --upstream VENDOR --store REDIS/0
//                     --config (one [[route]] gating POST /v1/charges).
//   node-idempotency  peer_node_idempotency.mjs: @node-idempotency/core + storage-adapter-redis.
//   powertools        peer_powertools.mjs: @aws-lambda-powertools/idempotency, cache (Redis) layer.
//   idemgate-off      the same idemgate with the route's `mode = "off"`: every request relayed
//                     ungated, so that idemgate's CPU per request splits into the HTTP relay and
//                     the gating (keys, fingerprint, ledger, audit, the Redis round trips).
//   nginx             nginx (Debian's nginx-light) as a plain reverse proxy to the vendor, one
//                     process (`master_process off`), upstream keep-alive: a lean relay in C, a
//                     floor for any front's CPU per request. Skipped without nginx.
//   baseline          with --baseline PATH: an older idemgate binary, run as `idemgate` is (its own
//                     Redis database, /1), taking turns with it in every round, so that two builds
//                     compare by CPU per request within one run (this VM's figures move by ±20%
//                     from round to round). Prints idemgate / baseline for fresh and replay.
// Modes: fresh (fresh.lua: a new key per request) and replay (replay.lua: cycles through --keys
// keys that were executed once through that front before the first round).
//
// Every case is `wrk -t THREADS -c CONNECTIONS -d SECONDS --latency`. The cases take turns, round
// after round, in reverse order every other round, after one untimed warm-up run per case. The
// table shows medians over rounds; each ratio is taken within a round and the median of those is
// compared with the targets. CPU per request is utime+stime from /proc/PID/stat before and after
// the run, divided by the requests wrk completed, for the front, the vendor, Redis and wrk; for
// the front and Redis also utime alone, which leaves out what the kernel does for them (sockets,
// and Redis's AOF writes and fsyncs, which every front's writes cost alike).
// wrk, Redis, the vendor and the front all share the machine's cores.
import { spawn, execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, '../..');
const VENDOR = path.join(ROOT, 'examples/http-vendor/server.mjs');
const REDIS_SH = path.join(ROOT, 'tests/servers/redis.sh');
const CLK_TCK = Number(execFileSync('getconf', ['CLK_TCK']).toString().trim()) || 100;
const BODY = '{"amount":1999,"currency":"usd","customer":"cus_bench"}';

const FRONTS = ['vendor', 'idemgate', 'idemgate-off', 'nginx', 'baseline', 'node-idempotency', 'powertools'];
// The fronts that run --idemgate's binary.
const OURS = ['idemgate', 'idemgate-off'];
const PEERS = ['node-idempotency', 'powertools'];
const MODES = ['fresh', 'replay'];

// ---------------------------------------------------------------------------------------------
// Options.

function usage(msg) {
  if (msg) console.error(`bench/http: ${msg}`);
  console.error('usage: node bench/http/bench.mjs [--seconds 10] [--rounds 3] [--threads 2] ' +
    '[--connections 32] [--keys 1000] [--warmup 2] [--idemgate PATH] [--only FRONT,…] ' +
    '[--redis-fsync always|everysec] [--json FILE] [--baseline PATH]');
  process.exit(2);
}

function parseArgs(argv) {
  const o = {
    seconds: 10, rounds: 3, threads: 2, connections: 32, keys: 1000, warmup: 2,
    idemgate: process.env.IDEMGATE || '', only: null, json: '', redisFsync: 'always', baseline: '',
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const v = () => (i + 1 < argv.length ? argv[++i] : usage(`${a} needs a value`));
    if (a === '--seconds') o.seconds = Number(v());
    else if (a === '--rounds') o.rounds = Number(v());
    else if (a === '--threads') o.threads = Number(v());
    else if (a === '--connections') o.connections = Number(v());
    else if (a === '--keys') o.keys = Number(v());
    else if (a === '--warmup') o.warmup = Number(v());
    else if (a === '--idemgate') o.idemgate = v();
    else if (a === '--only') o.only = v().split(',');
    else if (a === '--json') o.json = v();
    else if (a === '--redis-fsync') o.redisFsync = v();
    else if (a === '--baseline') o.baseline = v();
    else if (a === '-h' || a === '--help') usage();
    else usage(`unknown argument ${a}`);
  }
  for (const f of o.only ?? []) if (!FRONTS.includes(f)) usage(`unknown front ${f}`);
  if (!['always', 'everysec'].includes(o.redisFsync)) usage('--redis-fsync is always or everysec');
  if (o.baseline && !fs.existsSync(o.baseline)) usage(`--baseline ${o.baseline}: no such file`);
  return o;
}

const opts = parseArgs(process.argv.slice(2));

// ---------------------------------------------------------------------------------------------
// Processes: everything this bench starts is stopped again by its pid.

const started = new Map(); // pid → {child, what}
let tmp = '';
let redisDir = '';

function stopAll() {
  for (const [pid] of started) {
    try { process.kill(pid, 'SIGTERM'); } catch { /* already gone */ }
  }
  if (redisDir) {
    try { execFileSync('bash', [REDIS_SH, 'stop', redisDir], { stdio: 'ignore' }); } catch { /* */ }
    redisDir = '';
  }
}

async function stopAllAndWait() {
  const exits = [...started.values()].map(({ child }) =>
    child.exitCode !== null || child.signalCode !== null ? null : new Promise((r) => child.once('exit', r)));
  stopAll();
  await Promise.race([Promise.all(exits), new Promise((r) => setTimeout(r, 5000))]);
  for (const [pid, { child }] of started) {
    if (child.exitCode === null && child.signalCode === null) {
      try { process.kill(pid, 'SIGKILL'); } catch { /* */ }
    }
  }
  started.clear();
}

process.on('exit', stopAll);
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => { stopAll(); process.exit(130); });

/** Spawns a server and waits for "listening on URL" on its stdout or stderr. */
function spawnListening(what, command, args) {
  const log = fs.openSync(path.join(tmp, `${what}.log`), 'a');
  const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  started.set(child.pid, { child, what });
  let text = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what}: no "listening on" after 20 s:\n${text}`)), 20000);
    let found = false;
    const onData = (c) => {
      fs.writeSync(log, c);
      if (found) return;
      text = (text + c).slice(-8000);
      const m = text.match(/listening on (https?:\/\/[^\s/]+)/);
      if (m) {
        found = true;
        clearTimeout(timer);
        resolve({ what, pid: child.pid, url: m[1], child });
      }
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      started.delete(child.pid);
      if (!found) reject(new Error(`${what} exited (${signal ?? code}):\n${text}`));
    });
  });
}

function onPath(command) {
  try {
    execFileSync('sh', ['-c', `command -v ${command}`], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

/** A port free at this moment on 127.0.0.1 (nginx cannot listen on port 0 and say which it got). */
async function freePort() {
  const srv = net.createServer();
  await new Promise((resolve, reject) => srv.once('error', reject).listen(0, '127.0.0.1', resolve));
  const { port } = srv.address();
  await new Promise((resolve) => srv.close(resolve));
  return port;
}

/** True once something accepts connections on 127.0.0.1:port. */
function accepts(port) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    sock.once('connect', () => { sock.destroy(); resolve(true); });
    sock.once('error', () => resolve(false));
  });
}

/**
 * nginx as a plain reverse proxy to `upstream`, in one process (no master, one worker), with
 * keep-alive connections to the vendor: what relaying alone costs. Its files stay under tmp.
 */
async function spawnNginx(upstream) {
  const dir = path.join(tmp, 'nginx');
  fs.mkdirSync(dir);
  const port = await freePort();
  const conf = path.join(dir, 'nginx.conf');
  const temp = (name) => `${name}_temp_path ${path.join(dir, name)};`;
  fs.writeFileSync(conf, `daemon off;
master_process off;
worker_processes 1;
pid ${path.join(dir, 'nginx.pid')};
error_log ${path.join(dir, 'error.log')} warn;
events { worker_connections 1024; }
http {
  access_log off;
  ${['client_body', 'proxy', 'fastcgi', 'uwsgi', 'scgi'].map(temp).join('\n  ')}
  upstream vendor { server ${new URL(upstream).host}; keepalive 64; }
  server {
    listen 127.0.0.1:${port};
    location / {
      proxy_pass http://vendor;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
`);
  const log = fs.openSync(path.join(tmp, 'nginx.log'), 'a');
  const child = spawn('nginx', ['-p', dir, '-c', conf, '-e', path.join(dir, 'error.log')], { stdio: ['ignore', log, log] });
  started.set(child.pid, { child, what: 'nginx' });
  for (let i = 0; i < 400; i++) {
    if (child.exitCode !== null || child.signalCode !== null) {
      throw new Error(`nginx exited (${child.signalCode ?? child.exitCode}):\n${fs.readFileSync(path.join(tmp, 'nginx.log'), 'utf8')}`);
    }
    if (await accepts(port)) return { what: 'nginx', pid: child.pid, url: `http://127.0.0.1:${port}`, child };
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error('nginx: not accepting connections after 20 s');
}

// ---------------------------------------------------------------------------------------------
// Measurements from /proc.

/** utime of a process (all its threads), and utime+stime, in µs. */
function cpuTimes(pid) {
  const s = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = s.slice(s.lastIndexOf(')') + 2).split(' '); // f[0] is field 3 (state)
  const user = (Number(f[11]) * 1e6) / CLK_TCK;
  return { user, total: user + (Number(f[12]) * 1e6) / CLK_TCK };
}

/** Busy and total jiffies of the whole machine. */
function machineTicks() {
  const f = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
  const total = f.reduce((a, b) => a + b, 0);
  return { busy: total - f[3] - f[4], total };
}

/** Counts the lines appended to a file since the last call. */
function lineCounter(file) {
  let offset = fs.existsSync(file) ? fs.statSync(file).size : 0;
  return () => {
    const size = fs.statSync(file).size;
    if (size <= offset) return 0;
    const fd = fs.openSync(file, 'r');
    const buf = Buffer.alloc(size - offset);
    fs.readSync(fd, buf, 0, buf.length, offset);
    fs.closeSync(fd);
    offset = size;
    let n = 0;
    for (let i = buf.indexOf(10); i !== -1; i = buf.indexOf(10, i + 1)) n++;
    return n;
  };
}

// ---------------------------------------------------------------------------------------------
// Load.

/** Executes `keys` keys once through `url` (16 at a time); every answer must be 201. */
async function prewarm(url, prefix, keys) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 16 });
  const u = new URL(url);
  const one = (key) => new Promise((resolve, reject) => {
    const req = http.request({
      agent, host: u.hostname, port: u.port, method: 'POST', path: '/v1/charges',
      headers: { 'content-type': 'application/json', 'idempotency-key': key, 'content-length': BODY.length },
    }, (res) => {
      res.resume();
      res.on('end', () => (res.statusCode === 201 ? resolve() : reject(new Error(`prewarm ${url} ${key}: HTTP ${res.statusCode}`))));
    });
    req.on('error', reject);
    req.end(BODY);
  });
  let next = 0;
  const worker = async () => {
    while (next < keys) await one(`${prefix}-${next++}`);
  };
  await Promise.all(Array.from({ length: 16 }, worker));
  agent.destroy();
}

/**
 * Runs wrk through `sh`, so that the shell's cutime/cstime (fields 16, 17 of its stat, read
 * after wrk was waited for) give wrk's own CPU time.
 */
function runWrk(url, mode, args, seconds) {
  const script = path.join(HERE, `${mode}.lua`);
  const wrkArgs = ['-t', String(opts.threads), '-c', String(opts.connections), '-d', `${Math.max(1, Math.round(seconds))}s`,
    '--latency', '-s', script, url, '--', ...args];
  return new Promise((resolve, reject) => {
    const child = spawn('sh', ['-c', 'wrk "$@"; s=$?; cat /proc/$$/stat >&2; exit $s', 'sh', ...wrkArgs],
      { stdio: ['ignore', 'pipe', 'pipe'] });
    started.set(child.pid, { child, what: 'wrk' });
    let out = '';
    let err = '';
    child.stdout.on('data', (c) => (out += c));
    child.stderr.on('data', (c) => (err += c));
    child.on('exit', (code) => {
      started.delete(child.pid);
      const m = out.match(/^RESULT (.*)$/m);
      if (code !== 0 || !m) return reject(new Error(`wrk ${wrkArgs.join(' ')} failed (${code}):\n${out}\n${err}`));
      const r = Object.fromEntries(m[1].split(' ').map((kv) => kv.split('=')).map(([k, v]) => [k, Number(v)]));
      const st = err.trim().split('\n').pop();
      const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
      r.wrk_cpu_us = ((Number(f[13]) + Number(f[14])) * 1e6) / CLK_TCK;
      r.text = out;
      r.command = `wrk ${wrkArgs.map((a) => (a.includes(' ') ? `'${a}'` : a)).join(' ')}`;
      resolve(r);
    });
    child.on('error', reject);
  });
}

// ---------------------------------------------------------------------------------------------
// Set-up.

function findIdemgate(given = opts.idemgate) {
  const candidates = given ? [given]
    : ['build-bench/idemgate', 'build-h5/idemgate'].map((p) => path.join(ROOT, p));
  for (const bin of candidates) {
    if (!fs.existsSync(bin)) continue;
    let help = '';
    try {
      help = execFileSync(bin, ['http', '--help'], { stdio: ['ignore', 'pipe', 'pipe'], timeout: 10000 }).toString();
    } catch (e) {
      help = `${e.stdout ?? ''}${e.stderr ?? ''}`;
    }
    // A binary without the subcommand prints the top-level help (exit 0) or an error.
    if (/--upstream/.test(help)) return { bin, help };
    return { why: `${bin} has no \`idemgate http\` (\`http --help\` does not mention --upstream)` };
  }
  return { why: `no idemgate binary (looked for ${candidates.join(', ')}; set --idemgate or IDEMGATE)` };
}

function version(cmd, args, re) {
  try {
    const t = execFileSync(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] }).toString();
    return (t.match(re) ?? [])[1] ?? t.split('\n')[0];
  } catch (e) {
    return ((e.stdout?.toString() ?? '') + (e.stderr?.toString() ?? '')).match(re)?.[1] ?? '?';
  }
}

function pkgVersion(name) {
  try {
    return JSON.parse(fs.readFileSync(path.join(HERE, 'node_modules', name, 'package.json'), 'utf8')).version;
  } catch {
    return 'missing';
  }
}

async function main() {
  const t0 = Date.now();
  let fronts = (opts.only ?? FRONTS).filter((f) => f !== 'baseline' || opts.baseline);
  if (opts.baseline && !fronts.includes('baseline')) fronts.splice(fronts.indexOf('idemgate') + 1, 0, 'baseline');
  const base = opts.baseline ? findIdemgate(opts.baseline) : {};
  if (opts.baseline && !base.bin) usage(base.why);
  const runsOurs = fronts.some((f) => OURS.includes(f));
  const ig = runsOurs ? findIdemgate() : {};
  if (runsOurs && !ig.bin) {
    console.log(`idemgate skipped: ${ig.why}`);
    fronts = fronts.filter((f) => !OURS.includes(f));
  }
  if (fronts.includes('nginx') && !onPath('nginx')) {
    console.log('nginx skipped: not on PATH (apt-get install nginx-light)');
    fronts = fronts.filter((f) => f !== 'nginx');
  }
  if (!fronts.includes('vendor')) fronts = ['vendor', ...fronts]; // the baseline of every ratio

  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'http-bench-'));
  redisDir = path.join(tmp, 'redis');
  // tests/servers/redis.sh: appendonly yes, appendfsync always, unless --redis-fsync everysec.
  execFileSync('bash', [REDIS_SH, 'start', redisDir, 'auto', '--appendfsync', opts.redisFsync],
    { stdio: ['ignore', 'ignore', 'inherit'] });
  const redisUrl = fs.readFileSync(path.join(redisDir, 'url'), 'utf8').trim();
  const redisPid = Number(fs.readFileSync(path.join(redisDir, 'redis.pid'), 'utf8').trim());

  const ledger = path.join(tmp, 'vendor-ledger.jsonl');
  const vendor = await spawnListening('vendor', process.execPath, [VENDOR, '--no-fsync', '--ledger', ledger]);
  const targets = { vendor };
  for (const f of fronts) {
    if (f === 'vendor') continue;
    if (OURS.includes(f) || f === 'baseline') {
      const config = path.join(tmp, `${f}.toml`);
      fs.writeFileSync(config, '[[route]]\nmatch = "/v1/charges"\nmethods = ["POST"]\n' +
        (f === 'idemgate-off' ? 'mode = "off"\n' : ''));
      const db = f === 'baseline' ? 1 : 0; // one audit chain each
      targets[f] = await spawnListening(f, f === 'baseline' ? base.bin : ig.bin, ['http', '--listen', '127.0.0.1:0',
        '--upstream', vendor.url, '--store', `${redisUrl}/${db}${process.env.IDEM_STORE_QUERY ?? ''}`,
        '--config', config]);
    } else if (f === 'nginx') {
      targets[f] = await spawnNginx(vendor.url);
    } else {
      const script = path.join(HERE, `peer_${f.replace('-', '_')}.mjs`);
      targets[f] = await spawnListening(f, process.execPath, [script, '--upstream', vendor.url, '--redis', `${redisUrl}/0`]);
    }
  }

  const cpu = os.cpus();
  console.log(`http bench: wrk -t${opts.threads} -c${opts.connections} -d${opts.seconds}s --latency, ` +
    `${opts.rounds} rounds, ${opts.keys} replay keys; ${new Date().toISOString()}`);
  console.log(`machine: ${cpu.length} CPUs (${cpu[0]?.model}), load average ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}; ` +
    'wrk, Redis, the vendor and the front under test share these CPUs');
  console.log(`node ${process.version}, ${version('wrk', ['-v'], /(wrk \S+)/)}, redis-server ` +
    `${version('redis-server', ['--version'], /v=(\S+)/)} (appendonly, appendfsync ${opts.redisFsync}) at ${redisUrl}`);
  console.log(`@node-idempotency/core ${pkgVersion('@node-idempotency/core')}, ` +
    `@node-idempotency/storage-adapter-redis ${pkgVersion('@node-idempotency/storage-adapter-redis')}, ` +
    `@aws-lambda-powertools/idempotency ${pkgVersion('@aws-lambda-powertools/idempotency')}, ` +
    `@redis/client ${pkgVersion('@redis/client')}`);
  if (ig.bin) console.log(`idemgate: ${ig.bin}`);
  if (base.bin) console.log(`baseline: ${base.bin}`);
  console.log(`vendor ${vendor.url}; ${fronts.filter((f) => f !== 'vendor').map((f) => `${f} ${targets[f].url}`).join('; ')}`);

  const nonce = `${Date.now().toString(36)}${randomBytes(3).toString('hex')}`;
  for (const f of fronts) await prewarm(targets[f].url, `${nonce}-${f}-r`, opts.keys);

  const cases = [];
  for (const f of fronts) for (const m of MODES) cases.push({ front: f, mode: m, name: `${f} ${m}` });
  const effects = lineCounter(ledger);
  let runs = 0;

  async function runCase(c, seconds, round) {
    const t = targets[c.front];
    const args = c.mode === 'fresh'
      ? [`${nonce}-${c.front}-${round}-${runs++}`]
      : [`${nonce}-${c.front}-r`, String(opts.keys), String(opts.threads)];
    const pids = { front: c.front === 'vendor' ? null : t.pid, vendor: vendor.pid, redis: redisPid };
    const times = () => Object.fromEntries(Object.entries(pids).map(([k, p]) => [k, p ? cpuTimes(p) : null]));
    const before = times();
    const m0 = machineTicks();
    effects();
    const w0 = process.hrtime.bigint();
    const r = await runWrk(t.url, c.mode, args, seconds);
    const wall = Number(process.hrtime.bigint() - w0) / 1e9;
    const m1 = machineTicks();
    const after = times();
    const n = Math.max(r.requests, 1);
    const res = {
      case: c.name, front: c.front, mode: c.mode, round, command: r.command,
      requests: r.requests, perSec: r.requests / (r.duration_us / 1e6),
      p50: r.p50_us / 1000, p90: r.p90_us / 1000, p99: r.p99_us / 1000, max: r.max_us / 1000,
      errors: r.connect + r.read + r.write + r.status + r.timeout,
      errorKinds: Object.entries({ connect: r.connect, read: r.read, write: r.write, status: r.status, timeout: r.timeout })
        .filter(([, v]) => v).map(([k, v]) => `${k} ${v}`).join(', '),
      effectsPerReq: effects() / n,
      cpu: {}, machineCores: ((m1.busy - m0.busy) / (m1.total - m0.total)) * cpu.length,
    };
    for (const k of Object.keys(pids)) res.cpu[k] = after[k] ? (after[k].total - before[k].total) / n : null;
    res.cpu.frontUser = after.front ? (after.front.user - before.front.user) / n : null;
    res.cpu.redisUser = (after.redis.user - before.redis.user) / n;
    res.cpu.wrk = r.wrk_cpu_us / n;
    res.benchCores = ((res.cpu.front ?? 0) + res.cpu.vendor + res.cpu.redis + res.cpu.wrk) * r.requests / 1e6 / wall;
    return res;
  }

  if (opts.warmup > 0) {
    for (const c of cases) await runCase(c, opts.warmup, 'warmup');
  }
  const all = [];
  for (let round = 0; round < opts.rounds; round++) {
    const order = round % 2 ? [...cases].reverse() : cases;
    for (const c of order) {
      const res = await runCase(c, opts.seconds, round);
      all.push(res);
      console.log(`round ${round + 1}  ${c.name.padEnd(24)} ${fmtInt(res.perSec).padStart(7)} req/s  ` +
        `p50 ${res.p50.toFixed(2)} ms  p99 ${res.p99.toFixed(2)} ms  ` +
        `CPU µs/req front ${fmt1(res.cpu.front)} vendor ${fmt1(res.cpu.vendor)} redis ${fmt1(res.cpu.redis)} ` +
        `wrk ${fmt1(res.cpu.wrk)}  effects/req ${res.effectsPerReq.toFixed(2)}` +
        (res.errors ? `  ERRORS ${res.errors} (${res.errorKinds})` : ''));
    }
  }
  const elapsed = (Date.now() - t0) / 1000;
  await stopAllAndWait();
  report(all, fronts, elapsed);
  if (opts.json) fs.writeFileSync(opts.json, JSON.stringify({ opts, results: all }, null, 2));
  if (process.env.KEEP_TMP) console.log(`kept ${tmp}`);
  else fs.rmSync(tmp, { recursive: true, force: true });
}

// ---------------------------------------------------------------------------------------------
// Report.

const median = (xs) => {
  const s = xs.filter((x) => x !== null && Number.isFinite(x)).sort((a, b) => a - b);
  if (!s.length) return NaN;
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const fmtInt = (x) => (Number.isFinite(x) ? Math.round(x).toLocaleString('en-US').replace(/,/g, ' ') : '–');
const fmt1 = (x) => (x === null || !Number.isFinite(x) ? '–' : x.toFixed(1));
const fmt2 = (x) => (Number.isFinite(x) ? x.toFixed(2) : '–');

function report(all, fronts, elapsed) {
  const rounds = [...new Set(all.map((r) => r.round))];
  const get = (front, mode, round) => all.find((r) => r.front === front && r.mode === mode && r.round === round);
  const med = (front, mode, fn) => median(all.filter((r) => r.front === front && r.mode === mode).map(fn));

  console.log(`\nMedians over ${rounds.length} rounds (${elapsed.toFixed(0)} s in all). CPU is µs per ` +
    'request (utime+stime; "front user" and "redis user" are utime alone: the process\'s own ' +
    'code, and Redis\'s Lua, without the kernel\'s network, AOF writes and fsyncs); "cores" is ' +
    'what the bench\'s processes used and what the machine used (others included), out of ' +
    os.cpus().length + '.');
  const head = ['case', 'req/s', 'p50 ms', 'p99 ms', 'CPU front', 'front user', 'CPU vendor',
    'CPU redis', 'redis user', 'CPU wrk', 'vs vendor', 'effects/req', 'cores bench/machine', 'errors'];
  const lines = [];
  for (const f of fronts) {
    for (const m of MODES) {
      const rs = all.filter((r) => r.front === f && r.mode === m);
      if (!rs.length) continue;
      const vs = median(rounds.map((rd) => get(f, m, rd)?.perSec / get('vendor', m, rd)?.perSec));
      lines.push([`${f} ${m}`, fmtInt(median(rs.map((r) => r.perSec))), fmt2(median(rs.map((r) => r.p50))),
        fmt2(median(rs.map((r) => r.p99))), fmt1(median(rs.map((r) => r.cpu.front))),
        fmt1(median(rs.map((r) => r.cpu.frontUser))),
        fmt1(median(rs.map((r) => r.cpu.vendor))), fmt1(median(rs.map((r) => r.cpu.redis))),
        fmt1(median(rs.map((r) => r.cpu.redisUser))),
        fmt1(median(rs.map((r) => r.cpu.wrk))), f === 'vendor' ? '' : fmt2(vs),
        fmt2(median(rs.map((r) => r.effectsPerReq))),
        `${fmt2(median(rs.map((r) => r.benchCores)))} / ${fmt2(median(rs.map((r) => r.machineCores)))}`,
        String(rs.reduce((a, r) => a + r.errors, 0))]);
    }
  }
  printTable(head, lines);

  // Targets: idemgate against the best Node peer of the same round and mode, and against the
  // vendor called directly.
  const peers = PEERS.filter((p) => fronts.includes(p));
  const targets = [];
  const ratio = (name, fn, target, better) => {
    const xs = rounds.map(fn).filter(Number.isFinite);
    if (!xs.length) return;
    const v = median(xs);
    targets.push({ name, v, lo: Math.min(...xs), hi: Math.max(...xs), target, better, met: better === '>=' ? v >= target : v <= target });
  };
  const best = (mode, round, key, pick) => {
    const xs = peers.map((p) => get(p, mode, round)).filter(Boolean).map(key);
    return xs.length ? pick(...xs) : NaN;
  };
  if (fronts.includes('idemgate')) {
    if (peers.length) {
      ratio('replay req/s / best Node peer', (rd) => get('idemgate', 'replay', rd)?.perSec / best('replay', rd, (r) => r.perSec, Math.max), 2.5, '>=');
      ratio('fresh req/s / best Node peer', (rd) => get('idemgate', 'fresh', rd)?.perSec / best('fresh', rd, (r) => r.perSec, Math.max), 1.5, '>=');
      for (const m of MODES) {
        ratio(`${m} p99 / best Node peer p99`, (rd) => get('idemgate', m, rd)?.p99 / best(m, rd, (r) => r.p99, Math.min), 1 / 3, '<=');
        ratio(`${m} CPU/req / best Node peer CPU/req (front process)`, (rd) => get('idemgate', m, rd)?.cpu.front / best(m, rd, (r) => r.cpu.front, Math.min), 1 / 3, '<=');
      }
    }
    // Issue 18, target 1: against @node-idempotency in front of the same vendor, CPU per request
    // of idemgate itself and of the Redis it drives, and the fresh p99.
    if (fronts.includes('node-idempotency')) {
      const vsPeer = (m, key) => (rd) => key(get('idemgate', m, rd)) / key(get('node-idempotency', m, rd));
      ratio('fresh CPU/req / node-idempotency (front process, #18)', vsPeer('fresh', (r) => r?.cpu.front), 0.5, '<=');
      ratio('replay CPU/req / node-idempotency (front process, #18)', vsPeer('replay', (r) => r?.cpu.front), 0.33, '<=');
      ratio('fresh Redis CPU/req / node-idempotency (#18)', vsPeer('fresh', (r) => r?.cpu.redis), 1.0, '<=');
      ratio('fresh p99 / node-idempotency p99 (#18)', vsPeer('fresh', (r) => r?.p99), 1.0, '<=');
    }
    ratio('replay req/s / vendor-direct', (rd) => get('idemgate', 'replay', rd)?.perSec / get('vendor', 'replay', rd)?.perSec, 0.8, '>=');
    ratio('fresh req/s / vendor-direct', (rd) => get('idemgate', 'fresh', rd)?.perSec / get('vendor', 'fresh', rd)?.perSec, 0.4, '>=');
  }
  // Where idemgate's CPU per request goes, from fronts that run a part of its work in the same
  // rounds: relaying alone (idemgate-off) and the gating on top of it (idemgate minus that: keys,
  // fingerprint, ledger, audit, the Redis round trips), each over the peer's CPU per request,
  // beside nginx's relay, the floor of any front. #18's fresh target leaves idemgate 0.5 of the
  // peer. A replay relays nothing (idemgate-off's "replay" is one more relayed call), so a
  // replay's gating is all of idemgate's.
  if (fronts.includes('idemgate') && fronts.includes('idemgate-off') && fronts.includes('node-idempotency')) {
    const part = (m, fn) => median(rounds.map((rd) => {
      const [full, off, nginx, peer] = ['idemgate', 'idemgate-off', 'nginx', 'node-idempotency']
        .map((f) => get(f, m, rd)?.cpu.front);
      return fn(full, off, nginx) / peer;
    }));
    console.log('\nidemgate\'s CPU per request in parts, / node-idempotency\'s CPU per request (medians of ' +
      'per-round ratios):');
    printTable(['case', 'nginx relay', 'idemgate relay (off)', 'gating (idemgate − off)', 'idemgate'], [
      ['fresh', fmt2(part('fresh', (a, off, nginx) => nginx)), fmt2(part('fresh', (a, off) => off)),
        fmt2(part('fresh', (a, off) => a - off)), fmt2(part('fresh', (a) => a))],
      ['replay', '—', '—', fmt2(part('replay', (a) => a)), fmt2(part('replay', (a) => a))],
    ]);
  }
  // An older build against this one, in the same rounds (--baseline; no target).
  if (fronts.includes('idemgate') && fronts.includes('baseline')) {
    const vsBase = (m, key) => median(rounds.map((rd) => key(get('idemgate', m, rd)) / key(get('baseline', m, rd))));
    console.log('\nidemgate / baseline (medians of per-round ratios):');
    printTable(['case', 'CPU front', 'CPU redis', 'req/s', 'p99'], MODES.map((m) => [m,
      fmt2(vsBase(m, (r) => r?.cpu.front)), fmt2(vsBase(m, (r) => r?.cpu.redis)),
      fmt2(vsBase(m, (r) => r?.perSec)), fmt2(vsBase(m, (r) => r?.p99))]));
  }
  // The same ratios for each peer, for reference (no targets).
  const info = [];
  for (const p of peers) {
    for (const m of MODES) {
      info.push([`${p} ${m}`, fmt2(median(rounds.map((rd) => get(p, m, rd)?.perSec / get('vendor', m, rd)?.perSec)))]);
    }
  }
  if (info.length) {
    console.log('\nNode peers / vendor-direct, req/s (medians of per-round ratios):');
    printTable(['case', 'vs vendor'], info);
  }
  if (targets.length) {
    console.log('\nTargets (medians of per-round ratios; "best Node peer" is the better of the two in that round):');
    for (const t of targets) {
      const tv = t.target === 1 / 3 ? '1/3' : String(t.target);
      console.log(`target idemgate ${t.name}: ${fmt2(t.v)} (range ${fmt2(t.lo)}–${fmt2(t.hi)}; target ` +
        `${t.better} ${tv}) ${t.met ? 'met' : 'NOT met'}`);
    }
  } else if (!fronts.includes('idemgate')) {
    console.log('\nNo idemgate in this run: no targets to report.');
  }
  const errors = all.reduce((a, r) => a + r.errors, 0);
  if (errors) console.log(`ERRORS: ${errors} requests failed or got a status >= 400 (wrk's count)`);
}

function printTable(head, lines) {
  const w = head.map((h, i) => Math.max(h.length, ...lines.map((l) => String(l[i]).length)));
  const row = (l) => l.map((x, i) => (i === 0 ? String(x).padEnd(w[i]) : String(x).padStart(w[i]))).join('  ');
  console.log(row(head));
  console.log(w.map((x) => '-'.repeat(x)).join('  '));
  for (const l of lines) console.log(row(l));
}

main().catch(async (e) => {
  console.error(`bench/http: ${e.stack || e}`);
  await stopAllAndWait();
  if (tmp) console.error(`bench/http: the servers' logs are kept in ${tmp}`);
  process.exitCode = 1;
});
