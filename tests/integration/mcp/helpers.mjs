// Shared helpers for the `idemgate mcp` integration tests: temp dirs, processes started and
// stopped by pid, SDK clients over stdio and Streamable HTTP, the example server's ledger, and
// the normalisations that undo idemgate's documented rewrites (docs/DESIGN.md §6.1) so a proxied
// answer can be compared deeply with a direct one.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const here = path.dirname(fileURLToPath(import.meta.url));
export const ROOT = path.resolve(here, '../../..');
export const IDEMGATE = process.env.IDEMGATE || path.join(ROOT, 'build/idemgate');
export const EXAMPLE_SERVER = path.join(ROOT, 'examples/mcp-server/server.js');
export const EVERYTHING_SERVER = path.join(
  here,
  'node_modules/@modelcontextprotocol/server-everything/dist/index.js',
);
export const FILESYSTEM_SERVER = path.join(
  here,
  'node_modules/@modelcontextprotocol/server-filesystem/dist/index.js',
);
export const RAW_SERVER_2026 = path.join(here, 'raw_server_2026.mjs');

export const META = 'dev.idemgate/';
export const TURN = 'dev.idemgate/turnId';

/** Fails the test with a clear message when the binary under test is missing. */
export function requireIdemgate() {
  assert.ok(
    fs.existsSync(IDEMGATE),
    `idemgate binary not found at ${IDEMGATE}: build it or set IDEMGATE`,
  );
}

/** A fresh temp dir for one test, removed when the test ends (kept if KEEP_TMP is set). */
export function tempDir(t, prefix = 'idemgate-mcp-') {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  t.after(() => {
    if (!process.env.KEEP_TMP) fs.rmSync(dir, { recursive: true, force: true });
    else process.stderr.write(`kept ${dir}\n`);
  });
  return dir;
}

/** `idemgate mcp` arguments for a test dir: its own SQLite store, then `extra`, then `--`. */
export function mcpArgs(dir, extra = []) {
  return ['mcp', '--store', `sqlite:${path.join(dir, 'idem.db')}`, ...extra];
}

/** Environment for the example server (and the idemgate in front of it). */
export function exampleEnv(dir, more = {}) {
  return { EXAMPLE_LEDGER: path.join(dir, 'ledger.jsonl'), ...more };
}

// ---------------------------------------------------------------------------------------------
// Processes. Everything a test starts is stopped by its pid when the test ends.

/** Collects a stream's text and lets a test wait for a line matching a pattern. */
export class LineLog {
  constructor(stream) {
    this.text = '';
    this.waiters = [];
    stream?.setEncoding?.('utf8');
    stream?.on('data', (chunk) => {
      this.text += chunk;
      this.waiters = this.waiters.filter((w) => !w.check());
    });
  }

  /**
   * Resolves with the first match of `re` (a RegExp, or a predicate on the whole text) in the
   * text so far or later; rejects after `ms`.
   */
  waitFor(re, ms = 15000) {
    const test = typeof re === 'function' ? re : (s) => s.match(re);
    return new Promise((resolve, reject) => {
      const w = {
        check: () => {
          const m = test(this.text);
          if (!m) return false;
          clearTimeout(w.timer);
          resolve(m);
          return true;
        },
      };
      if (w.check()) return;
      w.timer = setTimeout(() => {
        this.waiters = this.waiters.filter((x) => x !== w);
        reject(new Error(`timed out after ${ms} ms waiting for ${re}; got:\n${this.text}`));
      }, ms);
      this.waiters.push(w);
    });
  }
}

/** True while a process with this pid exists. */
export function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/**
 * The pid of the process serving the shared writer of the SQLite store `url` ("sqlite:PATH"):
 * the holder of the flock on PATH-writer.lock (/proc/locks), or null.
 */
export function servingPid(url) {
  const inode = fs.statSync(`${url.slice('sqlite:'.length)}-writer.lock`).ino;
  for (const line of fs.readFileSync('/proc/locks', 'utf8').split('\n')) {
    const f = line.trim().split(/\s+/);
    // "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"
    if (f[1] === 'FLOCK' && f[3] === 'WRITE' && Number(f[5]?.split(':')[2]) === inode) {
      return Number(f[4]);
    }
  }
  return null;
}

/** SIGKILLs a pid if it is still there (never by name). */
export function killPid(pid) {
  if (pid && alive(pid)) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      /* gone meanwhile */
    }
  }
}

/** Kills, when the test ends, every example server that recorded its pid next to `ledger`. */
export function killExampleServersAfter(t, ledger) {
  t.after(() => {
    for (const pid of readPids(ledger)) killPid(pid);
  });
}

export function readPids(ledger) {
  try {
    return fs.readFileSync(ledger + '.pids', 'utf8').split('\n').filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/**
 * Starts a process with piped stdio; it is SIGKILLed (by pid) when the test ends if still up.
 * Returns { child, stderr: LineLog }.
 */
export function start(t, command, args, { env = {}, cwd } = {}) {
  const child = spawn(command, args, {
    cwd,
    env: { ...process.env, ...env },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  const stderr = new LineLog(child.stderr);
  // Settles when the process exits: a test waiting for a line races this, so a process that
  // dies at start fails the test at once, with its stderr.
  const exited = new Promise((resolve) =>
    child.on('exit', (code, signal) => resolve({ code, signal })),
  );
  t.after(() => {
    child.stdin.destroy();
    killPid(child.pid);
  });
  return { child, stderr, exited };
}

/** Waits for a line on a started process's stderr; fails at once if the process exits first. */
async function waitForLine({ stderr, exited }, re, what) {
  const died = exited.then(async ({ code, signal }) => {
    await new Promise((r) => setImmediate(r)); // let the last stderr chunk arrive
    throw new Error(`${what} exited (${signal ?? code}) before printing ${re}:\n${stderr.text}`);
  });
  return Promise.race([stderr.waitFor(re), died]);
}

/**
 * A loopback port that was free a moment ago, for servers that cannot bind port 0 and say which
 * port they got (server-everything's Streamable HTTP mode prints the port it was given).
 */
export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/** Starts server-everything over Streamable HTTP and returns its URL. */
export async function startEverythingHttp(t) {
  const port = await freePort();
  const proc = start(t, 'node', [EVERYTHING_SERVER, 'streamableHttp'], {
    env: { PORT: String(port) },
  });
  await waitForLine(proc, /listening on port \d+/, 'server-everything');
  return { url: `http://127.0.0.1:${port}/mcp`, ...proc };
}

/** Starts the example server with `--http 0` and returns its URL. */
export async function startExampleHttp(t, dir, env = {}) {
  const proc = start(t, 'node', [EXAMPLE_SERVER, '--http', '0'], { env: exampleEnv(dir, env) });
  const m = await waitForLine(proc, /listening on (http:\/\/127\.0\.0\.1:\d+\/mcp)/, 'server.js');
  return { url: m[1], ...proc };
}

/**
 * Starts `idemgate mcp --listen 127.0.0.1:0 ARGS…` and returns the URL it prints.
 * stdin stays open (a pipe) until the test ends.
 */
export async function startIdemgateListen(t, dir, args, env = {}) {
  requireIdemgate();
  const full = [...mcpArgs(dir), '--listen', '127.0.0.1:0', ...args];
  const proc = start(t, IDEMGATE, full, { env });
  const listening = /idemgate: listening on (http:\/\/127\.0\.0\.1:\d+\/mcp)/;
  const m = await waitForLine(proc, listening, 'idemgate');
  return { url: m[1], ...proc };
}

/** A raw JSON-RPC peer over a child's stdio: one JSON object per line, nothing else. */
export class RawPeer {
  constructor(t, command, args, env) {
    const { child, stderr, exited } = start(t, command, args, { env });
    this.child = child;
    this.stderr = stderr;
    this.exited = exited; // settles with { code, signal } when the process exits
    this.pending = new Map();
    this.notifications = [];
    this.nonJson = [];
    readline.createInterface({ input: child.stdout }).on('line', (line) => {
      let msg;
      try {
        msg = JSON.parse(line);
      } catch {
        this.nonJson.push(line); // stdout must carry only MCP messages (§6.1)
        return;
      }
      if (msg.id !== undefined && this.pending.has(msg.id) && !msg.method) {
        this.pending.get(msg.id)(msg);
        this.pending.delete(msg.id);
      } else {
        this.notifications.push(msg);
      }
    });
  }

  /** Sends a request and resolves with the whole response message. */
  request(id, method, params) {
    const msg = { jsonrpc: '2.0', id, method };
    if (params !== undefined) msg.params = params;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`no answer to ${method} (${id}); stderr:\n${this.stderr.text}`)),
        15000,
      );
      this.pending.set(id, (m) => {
        clearTimeout(timer);
        resolve(m);
      });
      this.child.stdin.write(JSON.stringify(msg) + '\n');
    });
  }

  notify(method, params) {
    const msg = { jsonrpc: '2.0', method };
    if (params !== undefined) msg.params = params;
    this.child.stdin.write(JSON.stringify(msg) + '\n');
  }
}

// ---------------------------------------------------------------------------------------------
// SDK clients.

/**
 * Records every JSON-RPC message in both directions, for deep comparisons of whole
 * conversations. Wraps any SDK client transport.
 */
export class TracingTransport {
  constructor(inner) {
    this.inner = inner;
    this.sent = [];
    this.received = [];
    inner.onmessage = (m, extra) => {
      this.received.push(structuredClone(m));
      this.onmessage?.(m, extra);
    };
    inner.onclose = () => this.onclose?.();
    inner.onerror = (e) => this.onerror?.(e);
  }
  start() {
    return this.inner.start();
  }
  send(m, opts) {
    this.sent.push(structuredClone(m));
    return this.inner.send(m, opts);
  }
  close() {
    return this.inner.close();
  }
  get sessionId() {
    return this.inner.sessionId;
  }
  setProtocolVersion(v) {
    this.inner.setProtocolVersion?.(v);
  }
  get pid() {
    return this.inner.pid;
  }
  get stderr() {
    return this.inner.stderr;
  }
}

/**
 * Connects an SDK Client over stdio to `command args`. Returns { client, transport, stderr }.
 * The client is closed when the test ends.
 */
export async function connectStdio(
  t,
  { command, args, env = {}, capabilities = {}, setup, trace = false, name = 'idemgate-tests' },
) {
  const inner = new StdioClientTransport({ command, args, env, stderr: 'pipe' });
  const stderr = new LineLog(inner.stderr);
  const transport = trace ? new TracingTransport(inner) : inner;
  const client = new Client({ name, version: '1.0.0' }, { capabilities });
  setup?.(client);
  t.after(async () => {
    const pid = inner.pid;
    await client.close().catch(() => {});
    killPid(pid);
  });
  try {
    await client.connect(transport);
  } catch (e) {
    await new Promise((r) => setImmediate(r));
    e.message += `\n${command} ${args.join(' ')}\nstderr:\n${stderr.text}`;
    throw e;
  }
  return { client, transport, stderr, pid: inner.pid };
}

/** Connects an SDK Client over Streamable HTTP. Returns { client, transport }. */
export async function connectHttp(
  t,
  url,
  { capabilities = {}, setup, trace = false, name = 'idemgate-tests' } = {},
) {
  const inner = new StreamableHTTPClientTransport(new URL(url));
  const transport = trace ? new TracingTransport(inner) : inner;
  const client = new Client({ name, version: '1.0.0' }, { capabilities });
  setup?.(client);
  t.after(() => client.close().catch(() => {}));
  await client.connect(transport);
  return { client, transport };
}

/** An SDK client to the example server: through `idemgate mcp` over stdio, or direct. */
export function connectExample(t, dir, { proxied = true, env = {}, idemArgs = [], ...opts } = {}) {
  const serverEnv = exampleEnv(dir, env);
  killExampleServersAfter(t, serverEnv.EXAMPLE_LEDGER);
  if (!proxied) {
    return connectStdio(t, { command: 'node', args: [EXAMPLE_SERVER], env: serverEnv, ...opts });
  }
  requireIdemgate();
  return connectStdio(t, {
    command: IDEMGATE,
    args: [...mcpArgs(dir, idemArgs), '--', 'node', EXAMPLE_SERVER],
    env: serverEnv,
    ...opts,
  });
}

// ---------------------------------------------------------------------------------------------
// The example server's ledger.

export function readLedger(file) {
  let text;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    if (e.code === 'ENOENT') return [];
    throw e;
  }
  return text.split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

/** Polls `fn` until it returns a truthy value; fails after `ms`. No fixed sleeps. */
export async function until(fn, { ms = 15000, every = 20, what = 'condition' } = {}) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, every));
  }
}

// ---------------------------------------------------------------------------------------------
// Undoing idemgate's documented rewrites (docs/DESIGN.md §6.1).

/** True when a tool result is marked as a replay by idemgate. */
export function isReplay(result) {
  return result?._meta?.[META + 'replayed'] === true;
}

/** The idempotency condition of a result ("in_progress", "outcome_unknown", …) or undefined. */
export function condition(result) {
  return result?._meta?.[META + 'condition'];
}

/**
 * A tool result without idemgate's replay additions: the `dev.idemgate/*` _meta keys and the
 * one extra "[idemgate] …" text block at the end. Asserts that the block is there when the
 * result is marked replayed.
 */
export function stripReplay(result) {
  const r = structuredClone(result);
  if (isReplay(r)) {
    const last = r.content?.[r.content.length - 1];
    assert.ok(
      last?.type === 'text' && last.text.startsWith('[idemgate]'),
      `a replayed result ends with an "[idemgate] …" text block; got ${JSON.stringify(last)}`,
    );
    r.content.pop();
  }
  if (r._meta) {
    for (const k of Object.keys(r._meta)) if (k.startsWith(META)) delete r._meta[k];
    if (Object.keys(r._meta).length === 0) delete r._meta;
  }
  return r;
}

/** Asserts the replay markers of docs/DESIGN.md §6.1 on a result. */
export function assertReplayMarkers(result) {
  assert.equal(result._meta?.[META + 'replayed'], true, 'replayed marker');
  assert.equal(typeof result._meta?.[META + 'key'], 'string', 'dev.idemgate/key');
  assert.ok(result._meta?.[META + 'firstAt'], 'dev.idemgate/firstAt');
  const last = result.content[result.content.length - 1];
  assert.equal(last.type, 'text');
  assert.match(last.text, /^\[idemgate\] This is the stored result of an identical earlier call/);
}

/**
 * A proxied tools/list entry put back the way the upstream sent it, given the upstream's entry:
 * the "[idemgate] …" description suffix, idempotentHint and the repeat_nonce property removed.
 */
export function unrewriteTool(proxied, direct) {
  const t = structuredClone(proxied);
  if (typeof t.description === 'string') {
    const i = t.description.indexOf('[idemgate]');
    if (i >= 0) t.description = t.description.slice(0, i).trimEnd();
    if (t.description === '' && direct.description === undefined) delete t.description;
  }
  if (t.annotations) {
    if (direct.annotations && 'idempotentHint' in direct.annotations) {
      t.annotations.idempotentHint = direct.annotations.idempotentHint;
    } else {
      delete t.annotations.idempotentHint;
    }
    if (Object.keys(t.annotations).length === 0 && direct.annotations === undefined) {
      delete t.annotations;
    }
  }
  const props = t.inputSchema?.properties;
  if (props && 'repeat_nonce' in props && !(direct.inputSchema?.properties ?? {}).repeat_nonce) {
    delete props.repeat_nonce;
  }
  return t;
}

/** Gated per docs/DESIGN.md §6.1: every tool whose annotations do not say readOnlyHint: true. */
export function isGated(tool) {
  return tool.annotations?.readOnlyHint !== true;
}

/**
 * Compares a proxied tools/list with the direct one: the same tools in the same order; gated
 * tools carry the documented rewrites and nothing else changed; read-only tools are unchanged.
 */
export function assertToolsListTransparent(proxiedTools, directTools) {
  assert.deepEqual(
    proxiedTools.map((t) => t.name),
    directTools.map((t) => t.name),
    'same tools, same order',
  );
  for (let i = 0; i < directTools.length; i++) {
    const d = directTools[i];
    const p = proxiedTools[i];
    if (isGated(d)) {
      assert.match(p.description ?? '', /\[idemgate\] Safe to retry/, `${d.name}: description`);
      assert.equal(p.annotations?.idempotentHint, true, `${d.name}: idempotentHint`);
      assert.equal(p.inputSchema?.properties?.repeat_nonce?.type, 'string', `${d.name}: nonce`);
      assert.ok(!(p.inputSchema.required ?? []).includes('repeat_nonce'), 'nonce is optional');
      assert.deepEqual(unrewriteTool(p, d), d, `${d.name}: nothing else changed`);
    } else {
      assert.deepEqual(p, d, `${d.name} (read-only) passes unchanged`);
    }
  }
}
