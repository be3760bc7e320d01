// The host lab's shared harness: per-test temp dirs (HOME, project, XDG dirs, a fresh SQLite
// store), the real hosts run with a bounded timeout in their own process group, the audit log
// read through `idemgate audit --json`, the example server's ledger counted, the host set up
// behind idemgate (installHost), and the pieces every scripted model endpoint shares.
//
// # The neutral scripted model (every models/*.mjs exports the same shape)
//
//     startModel(decide) → Promise<{ url, requests, toolResults, close() }>
//
// An HTTP server on 127.0.0.1, port 0, speaking one vendor's streaming API (models/anthropic.mjs:
// Anthropic Messages SSE; models/openai_responses.mjs: OpenAI Responses SSE; models/gemini.mjs:
// Gemini streamGenerateContent SSE). Every other request the host makes (token counting, model
// lists, titles, …) is answered plausibly and logged. For each model request it calls
//
//     decide({ prompt, results, tools }) → { calls: [{ name, arguments }] } | { text }
//
//   prompt  – the text of the last user message (host-added wrappers stripped),
//   results – the tool results given back since that user message, in order:
//             [{ name, text, isError }] (text: the tool result's text content joined),
//   tools   – the tool names the request offers;
//
// and streams back one assistant message with those tool calls (two identical entries are two
// identical tool calls in one message) or with that text. `toolResults` records every tool
// result the host sent back ({ name, text, isError }, in arrival order, each once), so a test
// can assert that idemgate's replay sentence reached the model; `requests` logs every request
// the host made ({ method, path, body }, body parsed when JSON). `close()` stops the server.
//
// Scripts (chargeScript, …) below are decide functions the host tests share.
import assert from 'node:assert/strict';
import { execFile, spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { LineLog, readLedger } from '../integration/mcp/helpers.mjs';

const run = promisify(execFile);
export const HERE = path.dirname(fileURLToPath(import.meta.url));
export const ROOT = path.resolve(HERE, '../..');
export const IDEMGATE = process.env.IDEMGATE || path.join(ROOT, 'build/idemgate');
export const EXAMPLE_SERVER = path.join(ROOT, 'examples/mcp-server/server.js');
/** The native Claude Code binary (npm runs no postinstall for us: call the platform package). */
export const CLAUDE_BIN = path.join(HERE, 'node_modules/@anthropic-ai/claude-code-linux-x64/claude');
/** How long one host run may take before its process group is killed and the test fails. */
export const HOST_TIMEOUT_MS = Number(process.env.HOST_TIMEOUT_MS || 60000);
/** The arguments every script charges with. */
export const CHARGE = { customer: 'cus_lab', amount_cents: 4200, currency: 'EUR' };
/** The start of idemgate's replay sentence (docs/DESIGN.md §6.1). */
export const REPLAY_SENTENCE = '[idemgate] This is the stored result of an identical earlier call';

/** Fails the test with a clear message when the binary under test is missing. */
export function requireIdemgate() {
  assert.ok(fs.existsSync(IDEMGATE), `idemgate binary not found at ${IDEMGATE}: build it or set IDEMGATE`);
}

/**
 * True when the idemgate under test has the subcommand `name` (hook, install: issue 35), as its
 * `--help` lists them (`idemgate NAME --help` exits 0 for any NAME: the top-level help).
 */
export function hasCommand(name) {
  if (!hasCommand.names) {
    const r = fs.existsSync(IDEMGATE) ? spawnSync(IDEMGATE, ['--help'], { encoding: 'utf8', timeout: 10000 }) : null;
    const list = (r?.stdout ?? '').split(/^Subcommands:$/m)[1] ?? '';
    hasCommand.names = new Set([...list.matchAll(/^ {2}(\S+)/gm)].map((m) => m[1]));
  }
  return hasCommand.names.has(name);
}

// ---------------------------------------------------------------------------------------------
// Per-test directories.

/**
 * Runs `fn` when the test ends, after everything deferred later (last in, first out), whatever
 * the others throw: a host is killed before its dir is removed. (node:test runs t.after hooks
 * first in, first out and skips the rest after one throws, which left a host running, and the
 * test process with it, when removing its dir failed under it.)
 */
export function defer(t, fn) {
  if (!t.deferred) {
    t.deferred = [];
    t.after(async () => {
      const errors = [];
      for (const f of t.deferred.reverse()) {
        try {
          await f();
        } catch (e) {
          errors.push(e);
        }
      }
      if (errors.length) throw errors[0];
    });
  }
  t.deferred.push(fn);
}

/** A fresh temp dir for one test, removed when the test ends (kept if KEEP_TMP is set). */
export function tempDir(t, prefix = 'idemgate-hosts-') {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  defer(t, () => {
    if (!process.env.KEEP_TMP) fs.rmSync(dir, { recursive: true, force: true, maxRetries: 3 });
    else process.stderr.write(`kept ${dir}\n`);
  });
  return dir;
}

/**
 * Everything one test's host needs, under one temp dir: `home` (HOME, so user-scope settings land
 * there), `project` (the host's cwd), XDG dirs (XDG_RUNTIME_DIR too, so idemgate's hook files are
 * the test's own), `store` (a fresh SQLite store URL) and `ledger` (the example server's).
 * `env` is the environment every host and idemgate of the test run with: the parent's PATH and
 * little else, so no setting of the machine's user leaks in.
 */
export function labDirs(t, prefix) {
  const dir = tempDir(t, prefix);
  const sub = (name, mode = 0o700) => {
    const p = path.join(dir, name);
    fs.mkdirSync(p, { recursive: true, mode });
    return p;
  };
  const home = sub('home');
  const project = sub('project');
  const env = {
    PATH: process.env.PATH,
    HOME: home,
    USER: os.userInfo().username,
    LANG: 'C.UTF-8',
    TERM: 'dumb',
    TMPDIR: sub('tmp'),
    XDG_CONFIG_HOME: sub('xdg/config'),
    XDG_CACHE_HOME: sub('xdg/cache'),
    XDG_DATA_HOME: sub('xdg/data'),
    XDG_STATE_HOME: sub('xdg/state'),
    XDG_RUNTIME_DIR: sub('xdg/runtime'),
  };
  const ledger = path.join(dir, 'ledger.jsonl');
  const store = `sqlite:${path.join(dir, 'idem.db')}`;
  defer(t, () => {
    for (const pid of readPids(ledger)) killPid(pid);
  });
  return { dir, home, project, env, store, ledger };
}

// ---------------------------------------------------------------------------------------------
// Setting a host up behind idemgate.

/** The example server as a host's stdio server entry ({ command, args, env }), unwrapped. */
export function exampleServer({ ledger }) {
  return { command: 'node', args: [EXAMPLE_SERVER], env: { EXAMPLE_LEDGER: ledger } };
}

/**
 * Sets `host` ('claude-code' | 'gemini-cli' | 'codex') up the way a user does: its settings file
 * gets `servers` as a user has them ({ NAME: { command, args, env, … } } for stdio, { type:
 * 'http', url } / { url } / { httpUrl } for HTTP; extra keys such as Codex's `required` are
 * written too), then the real `idemgate install HOST --store STORE` wraps the stdio ones in
 * `idemgate mcp --store STORE --` and (claude-code, gemini-cli) adds the prompt hook. The lab
 * writes nothing of idemgate's own: what the host runs is what the install command made. User
 * scope under `home`, or project scope in `project` (scope: 'project'); for claude-code
 * `mcpConfig: FILE` puts the servers in FILE. Returns { files, output } (the settings files and
 * the install command's stdout, its diff).
 */
export async function installHost(host, { home, project, env, store }, servers, opts = {}) {
  const { scope = 'user', mcpConfig } = opts;
  assert.ok(hasCommand('install'), `${IDEMGATE} has no \`idemgate install\` (issue 35 item 3): the lab sets every host up with it`);
  const files = settingsFiles(host, { home, project, scope, mcpConfig });
  writeServers(host, files.servers, servers);
  const args = ['install', host, '--scope', scope, '--store', store];
  if (scope === 'project') args.push('--project', project);
  if (mcpConfig) args.push('--mcp-config', mcpConfig);
  let stdout;
  try {
    ({ stdout } = await run(IDEMGATE, args, { env, cwd: project }));
  } catch (e) {
    throw new Error(`idemgate ${args.join(' ')} failed (${e.code}):\n${e.stdout}${e.stderr}`);
  }
  return { files: [...new Set(Object.values(files))], output: stdout };
}

/**
 * Asserts that `idemgate install` set `host` up in the lab dir `d` (user scope): the stdio server
 * `name` runs `idemgate mcp --store STORE -- COMMAND ARGS…` (the binary's absolute path, as
 * install writes it) and, for claude-code and gemini-cli, the prompt hook runs `idemgate hook`.
 * `server` is the entry as the user had it (exampleServer(d)). Returns the settings' text.
 */
export function assertInstalled(host, d, name, server) {
  const files = settingsFiles(host, { home: d.home, project: d.project, scope: 'user' });
  const binary = fs.realpathSync(IDEMGATE);
  const wrapped = { command: binary, args: ['mcp', '--store', d.store, '--', server.command, ...(server.args ?? [])] };
  const hook = `${binary} hook --store ${d.store}`;
  const text = fs.readFileSync(files.servers, 'utf8');
  if (host === 'codex') {
    const table = text.split(/(?=^\[)/m).find((tbl) => tbl.startsWith(`[mcp_servers.${name}]`));
    assert.ok(table, `no [mcp_servers.${name}] in ${files.servers}:\n${text}`);
    assert.ok(table.includes(`command = ${JSON.stringify(wrapped.command)}\n`), `${name} runs idemgate:\n${table}`);
    const args = `args = [${wrapped.args.map((a) => JSON.stringify(a)).join(', ')}]\n`;
    assert.ok(table.includes(args), `${name}'s args are idemgate mcp's, then the server's (${args.trim()}):\n${table}`);
    return text;
  }
  const entry = JSON.parse(text).mcpServers?.[name];
  assert.deepEqual({ command: entry?.command, args: entry?.args }, wrapped, `${name} in ${files.servers}`);
  assert.deepEqual(entry.env, server.env, 'the rest of the entry is kept');
  const settings = JSON.parse(fs.readFileSync(files.hooks, 'utf8'));
  const hooks = host === 'claude-code' ? settings.hooks?.UserPromptSubmit : settings.hooks?.BeforeAgent;
  const commands = (hooks ?? []).flatMap((h) => h.hooks ?? []).map((h) => h.command);
  assert.deepEqual(commands, [hook], `the prompt hook in ${files.hooks}: ${JSON.stringify(settings.hooks)}`);
  return text;
}

/** Where `idemgate install` puts servers and the hook for each host and scope. */
function settingsFiles(host, { home, project, scope, mcpConfig }) {
  const root = scope === 'project' ? project : home;
  switch (host) {
    case 'claude-code':
      return {
        servers: mcpConfig ?? (scope === 'project' ? path.join(project, '.mcp.json') : path.join(home, '.claude.json')),
        hooks: path.join(root, '.claude/settings.json'),
      };
    case 'gemini-cli': {
      const f = path.join(root, '.gemini/settings.json');
      return { servers: f, hooks: f };
    }
    case 'codex':
      return { servers: path.join(root, '.codex/config.toml') };
    default:
      throw new Error(`installHost: unknown host ${host}`);
  }
}

function readJson(file) {
  try {
    return JSON.parse(fs.readFileSync(file, 'utf8'));
  } catch (e) {
    if (e.code === 'ENOENT') return {};
    throw e;
  }
}

/** A TOML value for a server entry's string, number, boolean, array or (inline) table. */
function tomlValue(v) {
  if (Array.isArray(v)) return `[${v.map(tomlValue).join(', ')}]`;
  if (v && typeof v === 'object') return `{ ${Object.entries(v).map(([k, x]) => `${k} = ${tomlValue(x)}`).join(', ')} }`;
  return typeof v === 'string' ? JSON.stringify(v) : String(v);
}

/** Adds `servers` to the host's settings file as a user writes them (nothing of idemgate's). */
function writeServers(host, file, servers) {
  fs.mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
  if (host === 'codex') {
    // [mcp_servers.NAME] tables after whatever config.toml holds (the Codex test writes its
    // model provider first).
    let text = fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : '';
    for (const [name, s] of Object.entries(servers)) {
      text += `\n[mcp_servers.${name}]\n`;
      for (const [k, v] of Object.entries(s)) text += `${k} = ${tomlValue(v)}\n`;
    }
    fs.writeFileSync(file, text, { mode: 0o600 });
    return;
  }
  const settings = readJson(file);
  settings.mcpServers = { ...(settings.mcpServers ?? {}), ...servers };
  fs.writeFileSync(file, JSON.stringify(settings, null, 2) + '\n', { mode: 0o600 });
}

// ---------------------------------------------------------------------------------------------
// Running a host. Each run is its own process group, killed by pid when it times out or when the
// test ends; one host process at a time (node --test --test-concurrency=1).


/** True while a process with this pid exists and is not a zombie. */
export function alive(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return false;
  }
}

/** Resolves once `pid` is gone (or a zombie); rejects after `ms`. */
export async function pidGone(pid, ms = 10000) {
  const deadline = Date.now() + ms;
  while (alive(pid)) {
    if (Date.now() > deadline) throw new Error(`process ${pid} still running after ${ms} ms`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
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

/** The live (non-zombie) pids in process group `pgid`, from /proc. */
export function groupMembers(pgid) {
  const pids = [];
  for (const name of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    let stat;
    try {
      stat = fs.readFileSync(`/proc/${name}/stat`, 'utf8');
    } catch {
      continue;
    }
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // f[0] state, f[1] ppid, f[2] pgrp
    if (f[0] !== 'Z' && Number(f[2]) === pgid) pids.push(Number(name));
  }
  return pids;
}

/** SIGKILLs every process of group `pgid` (the group of a host started by startHost). */
export function killGroup(pgid) {
  try {
    process.kill(-pgid, 'SIGKILL');
  } catch {
    /* no such group any more */
  }
}

/**
 * Starts a host: `command args` in its own process group, stdin a pipe, stdout and stderr
 * collected. Returns { child, pid, stdout, stderr, write(text), end(), exited, done() }:
 * done() resolves once the host exited AND every other process of its group (the MCP servers it
 * started: idemgate and the example server) is gone, with { code, signal, ms, stdout, stderr };
 * it rejects with the host's output when that takes longer than `timeoutMs` from the start,
 * after killing the group. The group is killed when the test ends in any case (defer).
 */
export function startHost(t, command, args, { env, cwd, timeoutMs = HOST_TIMEOUT_MS } = {}) {
  const began = Date.now();
  const child = spawn(command, args, { cwd, env, stdio: ['pipe', 'pipe', 'pipe'], detached: true });
  const pid = child.pid;
  const stdout = new LineLog(child.stdout);
  const stderr = new LineLog(child.stderr);
  child.stdin.on('error', () => {}); // a host that exits early closes its stdin under us
  const exited = new Promise((resolve, reject) => {
    child.on('error', reject);
    child.on('exit', (code, signal) => resolve({ code, signal, exitedAt: Date.now() }));
  });
  defer(t, async () => {
    killGroup(pid);
    for (let i = 0; i < 500 && groupMembers(pid).length > 0; i++) await new Promise((r) => setTimeout(r, 10));
  });
  const output = () => `--- stdout:\n${stdout.text.slice(-20000)}\n--- stderr:\n${stderr.text.slice(-20000)}`;
  const done = async () => {
    const left = () => timeoutMs - (Date.now() - began);
    let timer;
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(() => {
        const members = groupMembers(pid);
        killGroup(pid);
        reject(new Error(`${path.basename(command)} did not finish within ${timeoutMs} ms` +
          ` (still running: ${members.join(' ') || 'none'}; killed)\n${output()}`));
      }, Math.max(0, left()));
    });
    try {
      const r = await Promise.race([exited, timeout]);
      // The host is gone; its MCP servers may still be stopping (flushing the audit log).
      while (groupMembers(pid).length > 0) {
        if (left() <= 0) await timeout;
        await new Promise((res) => setTimeout(res, 10));
      }
      return { ...r, ms: Date.now() - began, groupGoneAt: Date.now(), stdout: stdout.text, stderr: stderr.text };
    } finally {
      clearTimeout(timer);
    }
  };
  return {
    child,
    pid,
    stdout,
    stderr,
    exited,
    output,
    done,
    write: (text) => child.stdin.write(text),
    end: () => child.stdin.end(),
  };
}

// ---------------------------------------------------------------------------------------------
// What happened: the example server's ledger and idemgate's audit log.

/** The example server's ledger entries (one per real execution): the MCP tests' reader. */
export { readLedger };

export function readPids(ledger) {
  try {
    return fs.readFileSync(ledger + '.pids', 'utf8').split('\n').filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/** How many times `tool` really ran (ledger entries). */
export function executions(ledger, tool = 'charge') {
  return readLedger(ledger).filter((e) => e.tool === tool).length;
}

/** The `_meta` the host sent with each execution of `tool`, idemgate's own keys removed. */
export function hostMeta(ledger, tool = 'charge') {
  return readLedger(ledger)
    .filter((e) => e.tool === tool)
    .map((e) => Object.fromEntries(Object.entries(e.meta ?? {}).filter(([k]) => !k.startsWith('dev.idemgate/'))));
}

/** Every attempt of the audit log (`idemgate audit --json`: newest first); `tool` filters. */
export async function readAudit(store, { tool } = {}) {
  const args = ['audit', '--json', '--store', store, ...(tool ? ['--tool', tool] : [])];
  let stdout;
  try {
    ({ stdout } = await run(IDEMGATE, args));
  } catch (e) {
    throw new Error(`idemgate ${args.join(' ')} failed (${e.code}):\n${e.stdout}${e.stderr}`);
  }
  return stdout.split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

/** How many attempts of the audit log have each outcome: { executed: 2, replayed: 2, … }. */
export function outcomes(attempts) {
  const n = {};
  for (const a of attempts) n[a.outcome] = (n[a.outcome] ?? 0) + 1;
  return n;
}

// ---------------------------------------------------------------------------------------------
// The scripted model endpoints' shared parts.

/**
 * Starts an HTTP server on 127.0.0.1, port 0, that logs every request into `requests`
 * ({ method, path, headers, body }; body parsed as JSON when it is) and hands it to
 * `handle(req, res, entry)`. A handler that throws answers 500 with the message (and the test
 * sees the host fail). Returns { url, requests, close() }.
 */
export async function startRecordingServer(handle) {
  const requests = [];
  const server = http.createServer(async (req, res) => {
    let raw = '';
    req.setEncoding('utf8');
    for await (const chunk of req) raw += chunk;
    let body = raw;
    try {
      body = raw ? JSON.parse(raw) : undefined;
    } catch {
      /* not JSON: kept as text */
    }
    const entry = { method: req.method, path: req.url, headers: req.headers, body };
    requests.push(entry);
    try {
      await handle(req, res, entry);
    } catch (e) {
      entry.error = String(e?.stack ?? e);
      if (!res.headersSent) res.writeHead(500, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: String(e?.message ?? e) } }));
    }
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections?.();
        server.close(() => resolve());
      }),
  };
}

/** Starts a text/event-stream answer and returns send(event, data) (data JSON-encoded). */
export function sse(res) {
  res.writeHead(200, {
    'content-type': 'text/event-stream',
    'cache-control': 'no-cache',
    connection: 'keep-alive',
  });
  return (event, data) => {
    if (event) res.write(`event: ${event}\n`);
    res.write(`data: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`);
  };
}

/** The offered tool whose name ends with `suffix` (hosts prefix MCP tools differently). */
export function toolNamed(tools, suffix) {
  const name = tools.find((n) => n === suffix || n.endsWith(`__${suffix}`) || n.endsWith(`_${suffix}`));
  if (!name) throw new Error(`no tool named like "${suffix}" among the ${tools.length} offered: ${tools.join(', ')}`);
  return name;
}

/**
 * The model of every retry scenario: for a prompt that matches `ask` (default: mentions
 * "charge"), call `tool`(args) (default charge(CHARGE)); after one result, call it again with the
 * same arguments (the model's retry); after two, say "done". A prompt that also says "twice at
 * once" gets two identical calls in one message, then "done". Any other prompt (a host's own side
 * requests: titles, summaries) gets a short text.
 */
export function chargeScript({ tool = 'charge', args = CHARGE, ask = /charge/i } = {}) {
  return ({ prompt, results, tools }) => {
    if (!ask.test(prompt)) return { text: 'ok' };
    const name = toolNamed(tools, tool);
    const call = { name, arguments: args };
    if (/twice at once/i.test(prompt)) return results.length === 0 ? { calls: [call, call] } : { text: 'done' };
    if (results.length < 2) return { calls: [call] };
    return { text: 'done' };
  };
}
