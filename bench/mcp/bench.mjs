#!/usr/bin/env node
// MCP benchmark of `idemgate mcp` (issue 3): tools/call round trips per second and p50/p99
// latency with N concurrent clients (default 8), through idemgate and directly to the upstream,
// over stdio and over Streamable HTTP, in one run.
//
//   node bench/mcp/bench.mjs [--seconds 3] [--rounds 3] [--clients 8] [--dir /tmp]
//                            [--idemgate PATH] [--baseline PATH] [--baseline-query Q]
//                            [--store URL] [--baseline-store URL]
//                            [--only CASE,CASE] [--json FILE]
//
// Every client is its own SDK Client with its own connection, and keeps exactly one tools/call
// in flight (a closed loop: it sends the next call when the previous answer arrives). All the
// clients run in this one Node process.
//
// Cases (the upstream is bench/mcp/echo_server.mjs, whose tools answer at once without I/O):
//   direct       no idemgate. stdio: each client spawns its own upstream. HTTP: one upstream
//                --http 0, one session per client. Two cases per transport: `charge` (with the
//                turn id in _meta, as through idemgate), the baseline of fresh and replay, and
//                `list_charges`, the baseline of pass.
//   pass         through idemgate, read-only tool `list_charges` (passed through, no store).
//   fresh        through idemgate, gated `charge` with a new turn id on every call: claim,
//                execute, complete, in SQLite (synchronous=FULL) in --dir.
//   replay       through idemgate, gated `charge` with the same turn and arguments as a call
//                made once before the run: answered from the store, the upstream never sees it.
// stdio through idemgate: each client spawns its own `idemgate mcp --store sqlite:DIR/stdio.db
// -- node echo_server.mjs` (N proxies on one SQLite file, as N agent hosts would run them).
// HTTP through idemgate: one `idemgate mcp --listen 127.0.0.1:0 --upstream-url URL` with its own
// SQLite file, in front of the same upstream as direct HTTP; one client session each.
//
// --store URL, --baseline-store URL: the store of the idemgate under test (stdio and HTTP) and
// of the baseline, instead of their SQLite files (Redis or PostgreSQL, where the replay cache
// is on). Give the two stores apart (another Redis prefix or database, another PostgreSQL
// schema): the cases' turn ids repeat from one binary to the other.
// --baseline-query Q: appended to the baseline's store URL (`?shared_writer=off` compares the
// shared writer with each proxy committing alone, with --baseline the same binary).
// --baseline PATH (issue #18 target 4): an older idemgate binary, run over stdio beside the one
// under test in the same rounds (cases "baseline pass-through stdio" and "baseline gated replay
// stdio", its own SQLite file). The bench then prints idemgate's own CPU per call, pass-through
// and replay, against the baseline's, both from /proc in the same run, with the target ≤ 0.5×.
// Without it those lines show the figure alone.
//
// The cases take turns, round after round, in reverse order every other round, after one
// untimed warm-up round (--warmup seconds per case). Tables show the median over rounds; each
// ratio is taken within a round against its direct case (same transport, same tool), and the
// median of those ratios is compared with the targets (pass ≥ 0.90, replay ≥ 0.80,
// fresh ≥ 0.50). Latency is per call, from send to answer, over all clients' calls of a round.
//
// Besides calls/s and latency the bench reads, per case, from /proc: the CPU time and context
// switches of this process (the clients), of the upstream processes and of the idemgate
// processes, the bytes idemgate wrote to disk, and how busy the whole machine was. "CPU ratio"
// is direct's CPU per call over the case's: the calls/s ratio the case would get if both were
// limited by the same CPUs. On a machine shared with other work, calls/s depends on the share
// of the CPUs the scheduler gives the bench's processes, which changes with how many of them
// are runnable; CPU per call much less (though a Node process that handles calls at a lower
// rate spends somewhat more per call).
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ROOT, SDK_VERSION, sdk } from './sdk.mjs';

const { Client } = await sdk('client/index.js');
const { StdioClientTransport } = await sdk('client/stdio.js');
const { StreamableHTTPClientTransport } = await sdk('client/streamableHttp.js');

const ECHO = path.join(path.dirname(fileURLToPath(import.meta.url)), 'echo_server.mjs');
const TURN = 'dev.idemgate/turnId';
const REPLAYED = 'dev.idemgate/replayed';

// ---------------------------------------------------------------------------------------------
// Options.

function parseArgs(argv) {
  const o = {
    seconds: 3,
    rounds: 3,
    clients: 8,
    warmup: 0.5,
    dir: process.env.BENCH_DIR || os.tmpdir(),
    idemgate: process.env.IDEMGATE || '',
    baseline: '',
    baselineQuery: '',
    store: '',
    baselineStore: '',
    only: null,
    json: '',
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const v = () => {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      return argv[++i];
    };
    if (a === '--seconds') o.seconds = Number(v());
    else if (a === '--rounds') o.rounds = Number(v());
    else if (a === '--clients') o.clients = Number(v());
    else if (a === '--warmup') o.warmup = Number(v());
    else if (a === '--dir') o.dir = v();
    else if (a === '--idemgate') o.idemgate = v();
    else if (a === '--baseline') o.baseline = v();
    else if (a === '--baseline-query') o.baselineQuery = v();
    else if (a === '--store') o.store = v();
    else if (a === '--baseline-store') o.baselineStore = v();
    else if (a === '--only') o.only = v().split(',');
    else if (a === '--json') o.json = v();
    else if (a === '-h' || a === '--help') usage();
    else usage(`unknown argument ${a}`);
  }
  if (!(o.seconds > 0) || !(o.rounds >= 1) || !(o.clients >= 1) || !(o.warmup >= 0)) usage();
  if (!o.idemgate) {
    o.idemgate = ['build-bench/idemgate', 'build/idemgate']
      .map((p) => path.join(ROOT, p))
      .find((p) => fs.existsSync(p));
  }
  if (!o.idemgate || !fs.existsSync(o.idemgate)) {
    usage('no idemgate binary: build one and give --idemgate PATH (or IDEMGATE=PATH)');
  }
  if (o.baseline && !fs.existsSync(o.baseline)) usage(`no baseline binary at ${o.baseline}`);
  return o;
}

function usage(msg) {
  if (msg) process.stderr.write(`mcp bench: ${msg}\n`);
  process.stderr.write(
    'usage: bench.mjs [--seconds S] [--rounds R] [--clients N] [--warmup S] [--dir DIR]\n' +
      '                 [--idemgate PATH] [--baseline PATH] [--baseline-query Q] [--only CASE,…]\n' +
      '                 [--store URL] [--baseline-store URL] [--json FILE]\n',
  );
  process.exit(2);
}

// ---------------------------------------------------------------------------------------------
// /proc: CPU time and disk writes of the processes behind a case.

/**
 * Time on a CPU and time runnable but waiting for one, in µs, summed over the threads of a
 * process (/proc/PID/task/TID/schedstat; threads that ended are not counted).
 */
function schedUs(pid) {
  let run = 0;
  let wait = 0;
  try {
    for (const tid of fs.readdirSync(`/proc/${pid}/task`)) {
      try {
        const [r, w] = fs.readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ');
        run += Number(r) / 1000;
        wait += Number(w) / 1000;
      } catch {
        /* the thread ended meanwhile */
      }
    }
  } catch {
    /* gone */
  }
  return { run, wait };
}

/** Bytes a process has caused to be written to disk (/proc/PID/io write_bytes). */
function writeBytes(pid) {
  try {
    const m = fs.readFileSync(`/proc/${pid}/io`, 'utf8').match(/^write_bytes: (\d+)/m);
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

/** Context switches (voluntary and not) of all the threads of a process. */
function ctxSwitches(pid) {
  let n = 0;
  try {
    for (const tid of fs.readdirSync(`/proc/${pid}/task`)) {
      const st = fs.readFileSync(`/proc/${pid}/task/${tid}/status`, 'utf8');
      for (const m of st.matchAll(/^(?:non)?voluntary_ctxt_switches:\s+(\d+)/gm)) n += Number(m[1]);
    }
  } catch {
    /* gone, or a thread ended meanwhile */
  }
  return n;
}

/** The children of a process, from every thread's children list. */
function childrenOf(pid) {
  const out = new Set();
  try {
    for (const tid of fs.readdirSync(`/proc/${pid}/task`)) {
      const c = fs.readFileSync(`/proc/${pid}/task/${tid}/children`, 'utf8').trim();
      for (const p of c.split(/\s+/).filter(Boolean)) out.add(Number(p));
    }
  } catch {
    /* gone */
  }
  return [...out];
}

/** Busy and total jiffies of the whole machine (all CPUs), from /proc/stat. */
function machineJiffies() {
  const f = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0].split(/\s+/).slice(1).map(Number);
  const idle = f[3] + f[4];
  const total = f.slice(0, 8).reduce((a, b) => a + b, 0);
  return { busy: total - idle, total };
}

function snapshot(group) {
  const cpu = {};
  const wait = {};
  const ctx = {};
  const pids = { clients: [process.pid], ...group.pids() };
  for (const [k, ps] of Object.entries(pids)) {
    const st = ps.map(schedUs);
    cpu[k] = st.reduce((a, x) => a + x.run, 0);
    wait[k] = st.reduce((a, x) => a + x.wait, 0);
    ctx[k] = ps.reduce((a, p) => a + ctxSwitches(p), 0);
  }
  const disk = pids.idemgate?.reduce((a, p) => a + writeBytes(p), 0) ?? 0;
  return { cpu, wait, ctx, disk, machine: machineJiffies(), t: process.hrtime.bigint() };
}

// ---------------------------------------------------------------------------------------------
// Processes and connections. Everything started here is stopped by its pid at the end.

const started = new Set();
let workDir = ''; // the run's temp dir with the SQLite files, removed at exit unless KEEP_TMP

function stopAll() {
  for (const pid of started) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      /* gone */
    }
  }
  started.clear();
  if (workDir && !process.env.KEEP_TMP) fs.rmSync(workDir, { recursive: true, force: true });
}
process.on('exit', stopAll);
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(130));

/** Keeps the last `max` characters of a stream, so a failure can show what was said. */
function tail(stream, max = 4000) {
  const t = { text: '' };
  stream?.setEncoding('utf8');
  stream?.on('data', (c) => {
    t.text = (t.text + c).slice(-max);
  });
  return t;
}

/** Spawns a long-lived helper and waits for the URL it prints on stderr. */
function spawnListening(command, args, re, what) {
  const child = spawn(command, args, { stdio: ['pipe', 'ignore', 'pipe'] });
  started.add(child.pid);
  let text = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what}: no URL after 15 s:\n${text}`)), 15000);
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (c) => {
      text = (text + c).slice(-8000);
      const m = text.match(re);
      if (m) {
        clearTimeout(timer);
        resolve({ pid: child.pid, url: m[1] });
      }
    });
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`${what} exited (${signal ?? code}):\n${text}`));
    });
  });
}

async function connect(transport, what, stderrTail) {
  const client = new Client({ name: 'idemgate-mcp-bench', version: '1.0.0' }, { capabilities: {} });
  try {
    await client.connect(transport);
    // A host lists the tools before calling them; idemgate learns which ones are read-only here.
    await client.listTools();
  } catch (e) {
    e.message += `\n${what}${stderrTail ? `\nstderr:\n${stderrTail.text}` : ''}`;
    throw e;
  }
  return client;
}

async function stdioClients(n, command, args) {
  return Promise.all(
    Array.from({ length: n }, async () => {
      const transport = new StdioClientTransport({ command, args, stderr: 'pipe' });
      const err = tail(transport.stderr);
      try {
        const client = await connect(transport, `${command} ${args.join(' ')}`, err);
        return { client, pid: transport.pid };
      } finally {
        if (transport.pid) started.add(transport.pid); // stopped at exit if still there
      }
    }),
  );
}

async function httpClients(n, url) {
  return Promise.all(
    Array.from({ length: n }, async () => ({
      client: await connect(new StreamableHTTPClientTransport(new URL(url)), url),
    })),
  );
}

// ---------------------------------------------------------------------------------------------
// One case: N clients in a closed loop for a given time.

function percentile(sorted, q) {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

function median(xs) {
  const s = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

/**
 * Runs `c` for `seconds`: every client calls `c.call(client, i, seq)` back to back; `c.check`
 * says whether an answer is the one expected (a wrong one counts as an error).
 */
async function runCase(c, seconds) {
  const before = snapshot(c.group);
  const deadline = Number(before.t) / 1e6 + seconds * 1000;
  const lat = [];
  let errors = 0;
  let firstError = '';
  await Promise.all(
    c.group.clients.map(async ({ client }, i) => {
      for (let seq = 0; ; seq++) {
        const t0 = process.hrtime.bigint();
        if (Number(t0) / 1e6 >= deadline) break;
        try {
          const r = await c.call(client, i, seq);
          const t1 = process.hrtime.bigint();
          const bad = c.check(r);
          if (bad) {
            errors++;
            firstError ||= bad;
          } else {
            lat.push(Number(t1 - t0) / 1000);
          }
        } catch (e) {
          errors++;
          firstError ||= String(e.message || e);
        }
      }
    }),
  );
  const after = snapshot(c.group);
  const wallUs = Number(after.t - before.t) / 1000;
  lat.sort((a, b) => a - b);
  const calls = lat.length;
  const cpu = {};
  const wait = {};
  const ctx = {};
  for (const k of Object.keys(after.cpu)) cpu[k] = (after.cpu[k] - before.cpu[k]) / calls;
  for (const k of Object.keys(after.wait)) wait[k] = (after.wait[k] - before.wait[k]) / calls;
  for (const k of Object.keys(after.ctx)) ctx[k] = (after.ctx[k] - before.ctx[k]) / calls;
  const ourCpu = Object.keys(after.cpu).reduce((a, k) => a + after.cpu[k] - before.cpu[k], 0);
  const mj = {
    busy: after.machine.busy - before.machine.busy,
    total: after.machine.total - before.machine.total,
  };
  const ncpu = os.cpus().length;
  return {
    calls,
    errors,
    firstError,
    perSec: calls / (wallUs / 1e6),
    p50: percentile(lat, 0.5),
    p99: percentile(lat, 0.99),
    cpuPerCall: cpu, // µs per call by process group
    cpuTotal: Object.values(cpu).reduce((a, b) => a + b, 0),
    // µs per call that the case's threads were runnable but waited for a CPU, summed over them
    waitTotal: Object.values(wait).reduce((a, b) => a + b, 0),
    ctxPerCall: ctx, // context switches per call by process group
    oursCores: ourCpu / wallUs,
    // Everything busy on the machine, in cores, and what of it was not ours (other work).
    machineCores: (mj.busy / mj.total) * ncpu,
    otherCores: Math.max(0, (mj.busy / mj.total) * ncpu - ourCpu / wallUs),
    diskKBPerCall: (after.disk - before.disk) / 1024 / calls,
  };
}

// ---------------------------------------------------------------------------------------------
// Main.

const opts = parseArgs(process.argv.slice(2));
const runId = `${process.pid}-${Date.now().toString(36)}`;

function chargeArgs(i) {
  return { customer: `cus_${i}`, amount_cents: 1250 + i, currency: 'EUR' };
}
const callCharge = (turn) => (client, i, seq) =>
  client.callTool({ name: 'charge', arguments: chargeArgs(i), _meta: { [TURN]: turn(i, seq) } });
const callList = (client, i) =>
  client.callTool({ name: 'list_charges', arguments: { customer: `cus_${i}` } });

const plain = (r) => (r.isError ? `isError: ${JSON.stringify(r.content)}` : '');
const notReplayed = (r) =>
  plain(r) || (r._meta?.[REPLAYED] ? 'a fresh call was answered as a replay' : '');
const replayed = (r) =>
  plain(r) || (r._meta?.[REPLAYED] === true ? '' : `not replayed: ${JSON.stringify(r)}`);

async function main() {
  const dir = fs.mkdtempSync(path.join(opts.dir, 'idemgate-mcp-bench-'));
  workDir = dir;
  const node = process.execPath;
  const df = await new Promise((resolve) => {
    const p = spawn('df', ['--output=source,fstype', dir], { stdio: ['ignore', 'pipe', 'ignore'] });
    let out = '';
    p.stdout.on('data', (c) => (out += c));
    p.on('exit', () => resolve(out.trim().split('\n').pop()));
  });
  console.log(`mcp bench: ${opts.clients} clients (one SDK Client and connection each, one call ` +
    `in flight each), ${opts.seconds} s per case, ${opts.rounds} rounds`);
  console.log(`idemgate: ${opts.idemgate}`);
  if (opts.baseline) console.log(`baseline idemgate: ${opts.baseline}`);
  console.log(`node ${process.version}, @modelcontextprotocol/sdk ${SDK_VERSION}`);
  console.log(`SQLite files in ${dir} (${df})`);
  if (/tmpfs/.test(df)) console.log('WARNING: tmpfs: fsync costs nothing there');

  const n = opts.clients;
  const echoHttp = await spawnListening(node, [ECHO, '--http', '0'],
    /listening on (http:\/\/127\.0\.0\.1:\d+\/mcp)/, 'echo server');
  const gateHttp = await spawnListening(opts.idemgate,
    ['mcp', '--store', opts.store || `sqlite:${path.join(dir, 'http.db')}`, '--listen', '127.0.0.1:0',
      '--upstream-url', echoHttp.url],
    /idemgate: listening on (http:\/\/127\.0\.0\.1:\d+\/mcp)/, 'idemgate --listen');

  const directStdio = await stdioClients(n, node, [ECHO]);
  const gateStdio = await stdioClients(n, opts.idemgate,
    ['mcp', '--store', opts.store || `sqlite:${path.join(dir, 'stdio.db')}`, '--', node, ECHO]);
  const baseStdio = opts.baseline
    ? await stdioClients(n, opts.baseline,
      ['mcp', '--store',
        (opts.baselineStore || `sqlite:${path.join(dir, 'stdio-baseline.db')}`) + opts.baselineQuery, '--',
        node, ECHO])
    : [];
  const directHttp = await httpClients(n, echoHttp.url);
  const gateHttpClients = await httpClients(n, gateHttp.url);

  const groups = {
    directStdio: { clients: directStdio, pids: () => ({ upstream: directStdio.map((c) => c.pid) }) },
    gateStdio: {
      clients: gateStdio,
      pids: () => ({
        upstream: gateStdio.flatMap((c) => childrenOf(c.pid)),
        idemgate: gateStdio.map((c) => c.pid),
      }),
    },
    baseStdio: {
      clients: baseStdio,
      pids: () => ({
        upstream: baseStdio.flatMap((c) => childrenOf(c.pid)),
        idemgate: baseStdio.map((c) => c.pid),
      }),
    },
    directHttp: { clients: directHttp, pids: () => ({ upstream: [echoHttp.pid] }) },
    gateHttp: {
      clients: gateHttpClients,
      pids: () => ({ upstream: [echoHttp.pid], idemgate: [gateHttp.pid] }),
    },
  };

  // Replays answer the same turn and arguments as a call made once, here, before the run.
  const replayTurn = (tr) => (i) => `bench-${runId}-${tr}-replay-${i}`;
  for (const [tr, g] of [['stdio', groups.gateStdio], ['http', groups.gateHttp],
    ['stdio-baseline', groups.baseStdio]]) {
    await Promise.all(g.clients.map(async ({ client }, i) => {
      const r = await callCharge(replayTurn(tr))(client, i, 0);
      const bad = notReplayed(r);
      if (bad) throw new Error(`first call of the replay turn (${tr}): ${bad}`);
    }));
  }

  let freshSeq = 0;
  const cases = [
    { name: 'direct stdio charge', tr: 'stdio', kind: 'direct', group: groups.directStdio,
      call: callCharge((i, s) => `bench-${runId}-direct-${i}-${s}`), check: notReplayed },
    { name: 'direct stdio list', tr: 'stdio', kind: 'direct', group: groups.directStdio,
      call: callList, check: plain },
    { name: 'direct http charge', tr: 'http', kind: 'direct', group: groups.directHttp,
      call: callCharge((i, s) => `bench-${runId}-direct-${i}-${s}`), check: notReplayed },
    { name: 'direct http list', tr: 'http', kind: 'direct', group: groups.directHttp,
      call: callList, check: plain },
    { name: 'pass-through stdio', tr: 'stdio', kind: 'pass', group: groups.gateStdio,
      base: 'direct stdio list', call: callList, check: plain },
    { name: 'pass-through http', tr: 'http', kind: 'pass', group: groups.gateHttp,
      base: 'direct http list', call: callList, check: plain },
    { name: 'gated fresh stdio', tr: 'stdio', kind: 'fresh', group: groups.gateStdio,
      base: 'direct stdio charge',
      call: callCharge((i) => `bench-${runId}-fresh-${i}-${freshSeq++}`), check: notReplayed },
    { name: 'gated fresh http', tr: 'http', kind: 'fresh', group: groups.gateHttp,
      base: 'direct http charge',
      call: callCharge((i) => `bench-${runId}-fresh-${i}-${freshSeq++}`), check: notReplayed },
    { name: 'gated replay stdio', tr: 'stdio', kind: 'replay', group: groups.gateStdio,
      base: 'direct stdio charge', call: callCharge(replayTurn('stdio')), check: replayed },
    { name: 'gated replay http', tr: 'http', kind: 'replay', group: groups.gateHttp,
      base: 'direct http charge', call: callCharge(replayTurn('http')), check: replayed },
    ...(opts.baseline ? [
      { name: 'baseline pass-through stdio', tr: 'stdio', kind: 'pass', group: groups.baseStdio,
        base: 'direct stdio list', call: callList, check: plain },
      { name: 'baseline gated replay stdio', tr: 'stdio', kind: 'replay', group: groups.baseStdio,
        base: 'direct stdio charge', call: callCharge(replayTurn('stdio-baseline')),
        check: replayed },
      { name: 'baseline gated fresh stdio', tr: 'stdio', kind: 'fresh', group: groups.baseStdio,
        base: 'direct stdio charge',
        call: callCharge((i) => `bench-${runId}-base-fresh-${i}-${freshSeq++}`), check: notReplayed },
    ] : []),
  ].filter((c) => !opts.only || opts.only.some((o) => c.name.includes(o)));

  const t0 = Date.now();
  if (opts.warmup > 0) {
    process.stdout.write(`warm-up round, ${opts.warmup} s per case…\n`);
    for (const c of cases) await runCase(c, opts.warmup);
  }
  const results = Object.fromEntries(cases.map((c) => [c.name, []]));
  for (let r = 0; r < opts.rounds; r++) {
    const order = r % 2 ? [...cases].reverse() : cases;
    for (const c of order) {
      const res = await runCase(c, opts.seconds);
      results[c.name][r] = res;
      console.log(`round ${r + 1}  ${c.name.padEnd(20)} ${fmtInt(res.perSec).padStart(7)} calls/s` +
        `  p50 ${fmtMs(res.p50)}  p99 ${fmtMs(res.p99)} ms` +
        `  others busy ${res.otherCores.toFixed(2)} cores` +
        (res.errors ? `  ${res.errors} ERRORS: ${res.firstError.slice(0, 300)}` : ''));
    }
  }
  const elapsed = (Date.now() - t0) / 1000;

  // Summary: medians over rounds; ratios within a round against direct on the same transport.
  const TARGET = { pass: 0.9, replay: 0.8, fresh: 0.5 };
  const rows = cases.map((c) => {
    const rs = results[c.name];
    const med = (f) => median(rs.map(f));
    const ratios = c.base && results[c.base]
      ? rs.map((x, r) => x.perSec / results[c.base][r].perSec)
      : [];
    // The same ratio from CPU time per call: what calls/s would be if both cases were limited by
    // the same CPUs (whatever share of them the other work on the machine leaves us).
    const cpuRatios = c.base && results[c.base]
      ? rs.map((x, r) => results[c.base][r].cpuTotal / x.cpuTotal)
      : [];
    return {
      name: c.name,
      kind: c.kind,
      base: c.base ?? '',
      perSec: med((x) => x.perSec),
      p50: med((x) => x.p50),
      p99: med((x) => x.p99),
      errors: rs.reduce((a, x) => a + x.errors, 0),
      ratio: median(ratios),
      ratioMin: Math.min(...ratios),
      ratioMax: Math.max(...ratios),
      target: TARGET[c.kind],
      cpuRatio: median(cpuRatios),
      cpuRatioMin: Math.min(...cpuRatios),
      cpuRatioMax: Math.max(...cpuRatios),
      cpu: Object.fromEntries(Object.keys(rs[0].cpuPerCall).map((k) => [k, med((x) => x.cpuPerCall[k])])),
      cpuTotal: med((x) => x.cpuTotal),
      waitTotal: med((x) => x.waitTotal),
      ctx: Object.fromEntries(Object.keys(rs[0].ctxPerCall).map((k) => [k, med((x) => x.ctxPerCall[k])])),
      oursCores: med((x) => x.oursCores),
      otherCores: med((x) => x.otherCores),
      disk: med((x) => x.diskKBPerCall),
    };
  });

  console.log(`\nMedians over ${opts.rounds} rounds (${elapsed.toFixed(0)} s). ` +
    `Ratio: calls/s / the direct case on the same transport and tool, within each round; median [range].`);
  const head = ['case', 'calls/s', 'p50 ms', 'p99 ms', 'vs direct', 'direct case', 'target', 'met?', 'errors'];
  const lines = rows.map((r) => [
    r.name,
    fmtInt(r.perSec),
    fmtMs(r.p50),
    fmtMs(r.p99),
    Number.isFinite(r.ratio)
      ? `${r.ratio.toFixed(2)} [${r.ratioMin.toFixed(2)}–${r.ratioMax.toFixed(2)}]`
      : '',
    r.base,
    r.target ? `≥ ${r.target.toFixed(2)}` : '',
    r.target && Number.isFinite(r.ratio) ? (r.ratio >= r.target ? 'yes' : 'NO') : '',
    String(r.errors),
  ]);
  printTable(head, lines);

  console.log('\nWhere the time goes (medians, per call): CPU µs by process group; CPU ratio, ' +
    'direct / case; runq: µs our threads were runnable but waited for a CPU; cs: context ' +
    'switches; cores busy, ours and the rest of the machine\'s; KB idemgate wrote to disk.');
  printTable(
    ['case', 'clients µs', 'upstream µs', 'idemgate µs', 'total µs', 'CPU ratio', 'runq µs',
      'cs clients', 'cs upstream', 'cs idemgate', 'our cores', 'other cores', 'KB disk'],
    rows.map((r) => [
      r.name,
      r.cpu.clients.toFixed(0),
      r.cpu.upstream.toFixed(0),
      r.cpu.idemgate === undefined ? '' : r.cpu.idemgate.toFixed(0),
      r.cpuTotal.toFixed(0),
      Number.isFinite(r.cpuRatio)
        ? `${r.cpuRatio.toFixed(2)} [${r.cpuRatioMin.toFixed(2)}–${r.cpuRatioMax.toFixed(2)}]`
        : '',
      r.waitTotal.toFixed(0),
      r.ctx.clients.toFixed(1),
      r.ctx.upstream.toFixed(1),
      r.ctx.idemgate === undefined ? '' : r.ctx.idemgate.toFixed(1),
      r.oursCores.toFixed(2),
      r.otherCores.toFixed(2),
      r.cpu.idemgate === undefined ? '' : r.disk.toFixed(1),
    ]),
  );

  for (const r of rows.filter((x) => x.target && Number.isFinite(x.ratio))) {
    console.log(`target ${r.name}: ${r.ratio.toFixed(2)} of ${r.base} ` +
      `(range ${r.ratioMin.toFixed(2)}–${r.ratioMax.toFixed(2)}; target >= ${r.target.toFixed(2)}) ` +
      (r.ratio >= r.target ? 'met' : 'NOT met') +
      `; by CPU per call ${r.cpuRatio.toFixed(2)}`);
  }
  // Issue #18 target 5: N stdio proxies on one SQLite file.
  const freshStdio = rows.find((r) => r.name === 'gated fresh stdio');
  if (freshStdio && Number.isFinite(freshStdio.ratio)) {
    console.log(`gated fresh stdio / direct: ${freshStdio.ratio.toFixed(2)} (target ≥ 0.5)`);
  }
  if (freshStdio && freshStdio.cpu.idemgate !== undefined) {
    console.log(`idemgate CPU per gated fresh call, stdio: ${freshStdio.cpu.idemgate.toFixed(0)} µs ` +
      '(target ≤ 100)');
  }
  const baseFresh = rows.find((r) => r.name === 'baseline gated fresh stdio');
  if (freshStdio && baseFresh && Number.isFinite(freshStdio.ratio) && Number.isFinite(baseFresh.ratio)) {
    console.log(`gated fresh stdio, this build / baseline: calls/s ${(freshStdio.ratio / baseFresh.ratio).toFixed(2)}, ` +
      `idemgate CPU per call ${(freshStdio.cpu.idemgate / baseFresh.cpu.idemgate).toFixed(2)} ` +
      `(${freshStdio.cpu.idemgate.toFixed(0)} against ${baseFresh.cpu.idemgate.toFixed(0)} µs)`);
  }
  printOwnCpuTargets(results);
  const errors = rows.reduce((a, r) => a + r.errors, 0);
  if (errors) console.log(`ERRORS: ${errors} calls did not get the expected answer`);
  if (opts.json) fs.writeFileSync(opts.json, JSON.stringify({ opts, rows, results }, null, 2));

  for (const g of Object.values(groups)) await Promise.all(g.clients.map(({ client }) => client.close().catch(() => {})));
  if (process.env.KEEP_TMP) console.log(`kept ${dir}`);
  process.exit(errors ? 1 : 0); // the exit handler stops the processes and removes the dir
}

/**
 * Issue #18 target 4: idemgate's own CPU per call over stdio (pass-through and gated replay)
 * ≤ 0.5× the baseline binary's, both measured from /proc in the same rounds; the ratio is
 * taken within each round, and its median is compared with the target.
 */
function printOwnCpuTargets(results) {
  const own = (r) => r.cpuPerCall.idemgate;
  for (const [what, name] of [['pass-through', 'pass-through stdio'], ['gated replay', 'gated replay stdio']]) {
    const rs = results[name];
    if (!rs) continue;
    const x = median(rs.map(own));
    const bs = results[`baseline ${name}`];
    if (!bs) {
      console.log(`idemgate CPU per ${what} call, stdio: ${x.toFixed(1)} µs ` +
        '(target ≤ 0.5× of a baseline: give --baseline PATH to measure one in the same run)');
      continue;
    }
    const y = median(bs.map(own));
    const ratios = rs.map((r, i) => own(r) / own(bs[i]));
    const ratio = median(ratios);
    console.log(`idemgate CPU per ${what} call, stdio: ${x.toFixed(1)} µs (target ≤ 0.5× of ` +
      `baseline ${y.toFixed(1)} µs): ${ratio.toFixed(2)}× ` +
      `[${Math.min(...ratios).toFixed(2)}–${Math.max(...ratios).toFixed(2)}], ` +
      (ratio <= 0.5 ? 'met' : 'NOT met'));
  }
}

function fmtInt(x) {
  return Number.isFinite(x) ? Math.round(x).toLocaleString('en-US').replace(/,/g, ' ') : '-';
}
function fmtMs(us) {
  return Number.isFinite(us) ? (us / 1000).toFixed(2) : '-';
}
function printTable(head, lines) {
  const w = head.map((h, i) => Math.max(h.length, ...lines.map((l) => l[i].length)));
  const row = (l) => l.map((x, i) => (i === 0 ? x.padEnd(w[i]) : x.padStart(w[i]))).join('  ');
  console.log(row(head));
  console.log(w.map((x) => '-'.repeat(x)).join('  '));
  for (const l of lines) console.log(row(l));
}

main().catch((e) => {
  process.stderr.write(`mcp bench: ${e.stack || e}\n`);
  stopAll();
  process.exit(1);
});
