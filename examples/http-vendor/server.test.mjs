// Self-test of the example HTTP vendor: `node --test examples/http-vendor/server.test.mjs`.
// Starts the real server on port 0 with a temporary ledger and drives every route and fault.
// No sleeps for timing: the delays asked for are only checked to hold the answer back.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { once } from 'node:events';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import http from 'node:http';
import https from 'node:https';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';

const SERVER = path.join(path.dirname(fileURLToPath(import.meta.url)), 'server.mjs');
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'http-vendor-test-'));

/** Starts the vendor with `args`; resolves to {proc, url} once it printed its first line. */
async function start(args = [], env = {}) {
  const proc = spawn(process.execPath, [SERVER, ...args], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const lines = readline.createInterface({ input: proc.stdout });
  const [first] = await once(lines, 'line');
  const m = /^listening on (https?:\/\/127\.0\.0\.1:\d+)$/.exec(first);
  assert.ok(m, `first line: ${first}`);
  return { proc, url: m[1] };
}

async function stop(proc) {
  if (proc.exitCode !== null) return proc.exitCode;
  proc.kill('SIGTERM');
  const [code] = await once(proc, 'exit');
  return code;
}

/**
 * One request on a fresh connection. Resolves to {status, headers, body (parsed if JSON), raw},
 * or to {dropped: true} when the server closed the socket without answering.
 */
function request(url, method, pathname, { body, headers = {}, tls = false } = {}) {
  const mod = tls ? https : http;
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body);
    const req = mod.request(
      new URL(pathname, url),
      {
        method,
        agent: false,
        rejectUnauthorized: false,
        headers: {
          ...(data !== undefined ? { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) } : {}),
          ...headers,
        },
      },
      (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => {
          const raw = Buffer.concat(chunks).toString('utf8');
          let parsed = raw;
          if ((res.headers['content-type'] || '').startsWith('application/json')) parsed = JSON.parse(raw);
          resolve({ status: res.statusCode, headers: res.headers, body: parsed, raw });
        });
        res.on('error', reject);
      },
    );
    req.on('error', (e) => (e.code === 'ECONNRESET' || e.message === 'socket hang up' ? resolve({ dropped: true }) : reject(e)));
    if (data !== undefined) req.write(data);
    req.end();
  });
}

const charge = (n = 1) => ({ amount: 100 * n, currency: 'eur', customer: `cus_${n}` });

let vendor;
let ledgerFile;
const ledger = () => fs.readFileSync(ledgerFile, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));

before(async () => {
  ledgerFile = path.join(dir, 'ledger.jsonl');
  vendor = await start(['--ledger', ledgerFile]);
});

after(async () => {
  assert.equal(await stop(vendor.proc), 0);
  fs.rmSync(dir, { recursive: true, force: true });
});

test('healthz', async () => {
  const r = await request(vendor.url, 'GET', '/healthz');
  assert.equal(r.status, 200);
});

test('POST /v1/charges honours the key: one side effect, the same answer again', async () => {
  const n = ledger().length;
  const a = await request(vendor.url, 'POST', '/v1/charges', { body: charge(1), headers: { 'Idempotency-Key': 'k-1', 'X-Trace': 't' } });
  assert.equal(a.status, 201);
  assert.match(a.body.id, /^ch_/);
  assert.deepEqual({ ...a.body, id: undefined }, { id: undefined, object: 'charge', ...charge(1), idempotency_key: 'k-1' });
  const b = await request(vendor.url, 'POST', '/v1/charges', { body: charge(1), headers: { 'Idempotency-Key': 'k-1' } });
  assert.equal(b.status, 201);
  assert.equal(b.raw, a.raw);
  assert.equal(b.headers['x-vendor-replayed'], 'true');
  const lines = ledger().slice(n);
  assert.equal(lines.length, 1);
  const [l] = lines;
  assert.equal(l.route, '/v1/charges');
  assert.equal(l.effect, 'charge');
  assert.equal(l.id, a.body.id);
  assert.equal(l.idempotency_key, 'k-1');
  assert.equal(l.headers['x-trace'], 't');
  assert.equal(l.headers['idempotency-key'], 'k-1');
  assert.deepEqual(l.body, charge(1));
  assert.ok(!Number.isNaN(Date.parse(l.at)));
});

test('POST /v1/charges without a key charges every time, key null', async () => {
  const n = ledger().length;
  const a = await request(vendor.url, 'POST', '/v1/charges', { body: charge(2) });
  const b = await request(vendor.url, 'POST', '/v1/charges', { body: charge(2) });
  assert.equal(a.status, 201);
  assert.equal(a.body.idempotency_key, null);
  assert.notEqual(a.body.id, b.body.id);
  assert.deepEqual(ledger().slice(n).map((l) => l.idempotency_key), [null, null]);
});

test('POST /v1/charges rejects a bad body or key with 400 and no side effect', async () => {
  const n = ledger().length;
  for (const body of ['not json', [], { amount: -1, currency: 'eur', customer: 'c' }, { amount: 1, currency: 'euro', customer: 'c' }, { amount: 1, currency: 'eur' }]) {
    const r = await request(vendor.url, 'POST', '/v1/charges', { body, headers: { 'Idempotency-Key': 'k-bad' } });
    assert.equal(r.status, 400, JSON.stringify(body));
    assert.equal(typeof r.body.error, 'string');
  }
  const long = await request(vendor.url, 'POST', '/v1/charges', { body: charge(), headers: { 'Idempotency-Key': 'x'.repeat(256) } });
  assert.equal(long.status, 400);
  assert.equal(ledger().length, n);
  // A 400 does not burn the key.
  const ok = await request(vendor.url, 'POST', '/v1/charges', { body: charge(), headers: { 'Idempotency-Key': 'k-bad' } });
  assert.equal(ok.status, 201);
});

test('POST /v1/tickets does not honour the key', async () => {
  const n = ledger().length;
  const a = await request(vendor.url, 'POST', '/v1/tickets', { body: { title: 'Printer on fire' }, headers: { 'Idempotency-Key': 't-1' } });
  const b = await request(vendor.url, 'POST', '/v1/tickets', { body: { title: 'Printer on fire' }, headers: { 'Idempotency-Key': 't-1' } });
  assert.equal(a.status, 201);
  assert.deepEqual({ ...a.body, id: undefined }, { id: undefined, object: 'ticket', title: 'Printer on fire' });
  assert.notEqual(a.body.id, b.body.id);
  const lines = ledger().slice(n);
  assert.equal(lines.length, 2);
  assert.deepEqual(lines.map((l) => [l.route, l.effect, l.idempotency_key]), [
    ['/v1/tickets', 'ticket', 't-1'],
    ['/v1/tickets', 'ticket', 't-1'],
  ]);
  const bad = await request(vendor.url, 'POST', '/v1/tickets', { body: { title: '' } });
  assert.equal(bad.status, 400);
  assert.equal(ledger().length, n + 2);
});

test('GET /v1/charges?idempotency_key= looks a charge up, read-only', async () => {
  const a = await request(vendor.url, 'POST', '/v1/charges', { body: charge(3), headers: { 'Idempotency-Key': 'k-lookup' } });
  const n = ledger().length;
  const found = await request(vendor.url, 'GET', '/v1/charges?idempotency_key=k-lookup');
  assert.equal(found.status, 200);
  assert.deepEqual(found.body, a.body);
  const missing = await request(vendor.url, 'GET', '/v1/charges?idempotency_key=k-never');
  assert.equal(missing.status, 404);
  assert.equal(ledger().length, n);
});

test('GET /v1/ledger returns the ledger lines', async () => {
  const r = await request(vendor.url, 'GET', '/v1/ledger');
  assert.equal(r.status, 200);
  assert.deepEqual(r.body.lines, ledger());
});

test('unknown route 404, wrong method 405', async () => {
  assert.equal((await request(vendor.url, 'GET', '/nope')).status, 404);
  assert.equal((await request(vendor.url, 'DELETE', '/v1/charges')).status, 405);
});

test('GET /v1/export streams N bytes, byte i being i % 251; no side effect', async () => {
  const n = ledger().length;
  const bytes = 200_000;
  const res = await new Promise((resolve, reject) =>
    http.get(new URL(`/v1/export?bytes=${bytes}`, vendor.url), { agent: false }, resolve).on('error', reject),
  );
  assert.equal(res.statusCode, 200);
  assert.equal(res.headers['content-length'], String(bytes));
  const chunks = [];
  for await (const c of res) chunks.push(c);
  const body = Buffer.concat(chunks);
  assert.equal(body.length, bytes);
  assert.ok(body.every((b, i) => b === i % 251));
  assert.equal((await request(vendor.url, 'GET', '/v1/export?bytes=-1')).status, 400);
  assert.equal(ledger().length, n);
});

test('GET /v1/events sends the first event at once, the second after the release', async () => {
  const res = await new Promise((resolve, reject) =>
    http.get(new URL('/v1/events', vendor.url), { agent: false }, resolve).on('error', reject),
  );
  assert.equal(res.statusCode, 200);
  assert.equal(res.headers['content-type'], 'text/event-stream');
  res.setEncoding('utf8');
  const [first] = await once(res, 'data');
  assert.equal(first, 'data: first\n\n');
  const rest = [];
  res.on('data', (c) => rest.push(c));
  const ended = once(res, 'end');
  const released = await request(vendor.url, 'POST', '/v1/events/release', { body: {} });
  assert.deepEqual(released.body, { released: 1 });
  await ended;
  assert.equal(rest.join(''), 'data: second\n\n');
});

// Faults ------------------------------------------------------------------------------------

async function withFault(fault, key, n = 4) {
  const before = ledger().length;
  const r = await request(vendor.url, 'POST', '/v1/charges', { body: charge(n), headers: { 'Idempotency-Key': key, 'X-Vendor-Fault': fault } });
  return { r, added: ledger().slice(before) };
}

test('fault 500: side effect, then 500; the key then answers the charge', async () => {
  const { r, added } = await withFault('500', 'f-500');
  assert.equal(r.status, 500);
  assert.equal(added.length, 1);
  const again = await request(vendor.url, 'POST', '/v1/charges', { body: charge(4), headers: { 'Idempotency-Key': 'f-500' } });
  assert.equal(again.status, 201);
  assert.equal(again.body.id, added[0].id);
});

test('fault 500-before: 500, no side effect', async () => {
  const { r, added } = await withFault('500-before', 'f-500b');
  assert.equal(r.status, 500);
  assert.equal(added.length, 0);
  assert.equal((await request(vendor.url, 'GET', '/v1/charges?idempotency_key=f-500b')).status, 404);
});

test('fault drop: side effect, then the socket is destroyed', async () => {
  const { r, added } = await withFault('drop', 'f-drop');
  assert.deepEqual(r, { dropped: true });
  assert.equal(added.length, 1);
  assert.equal((await request(vendor.url, 'GET', '/v1/charges?idempotency_key=f-drop')).status, 200);
});

test('fault drop-before: no side effect, the socket is destroyed', async () => {
  const { r, added } = await withFault('drop-before', 'f-dropb');
  assert.deepEqual(r, { dropped: true });
  assert.equal(added.length, 0);
});

test('fault delay:MS: side effect first, the answer after MS', async () => {
  const t0 = process.hrtime.bigint();
  const { r, added } = await withFault('delay:50', 'f-delay');
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  assert.equal(r.status, 201);
  assert.equal(added.length, 1);
  assert.ok(ms >= 50, `answered after ${ms} ms`); // a lower bound only: never a timing limit
});

test('fault 400: 400, no side effect', async () => {
  const { r, added } = await withFault('400', 'f-400');
  assert.equal(r.status, 400);
  assert.equal(added.length, 0);
});

test('fault big:BYTES: side effect, a body of exactly BYTES', async () => {
  const { r, added } = await withFault('big:100000', 'f-big');
  assert.equal(r.status, 201);
  assert.equal(Buffer.byteLength(r.raw), 100000);
  assert.equal(r.body.id, added[0].id);
  assert.equal(added.length, 1);
  const small = await request(vendor.url, 'POST', '/v1/tickets', { body: { title: 't' }, headers: { 'X-Vendor-Fault': 'big:10' } });
  assert.equal(Buffer.byteLength(small.raw), 10);
});

test('an unknown fault is a 400 without a side effect', async () => {
  const { r, added } = await withFault('explode', 'f-unknown');
  assert.equal(r.status, 400);
  assert.equal(added.length, 0);
});

// Options -----------------------------------------------------------------------------------

test('--key-header, --delay-ms, --no-fsync, EXAMPLE_LEDGER; keys survive a restart', async () => {
  const file = path.join(dir, 'env-ledger.jsonl');
  let v = await start(['--key-header', 'X-Request-Key', '--delay-ms', '30', '--no-fsync'], { EXAMPLE_LEDGER: file });
  const t0 = process.hrtime.bigint();
  const a = await request(v.url, 'POST', '/v1/charges', { body: charge(5), headers: { 'X-Request-Key': 'h-1', 'Idempotency-Key': 'ignored' } });
  assert.ok(Number(process.hrtime.bigint() - t0) / 1e6 >= 30);
  assert.equal(a.status, 201);
  assert.equal(a.body.idempotency_key, 'h-1');
  assert.equal(await stop(v.proc), 0);

  v = await start(['--key-header', 'X-Request-Key'], { EXAMPLE_LEDGER: file });
  const b = await request(v.url, 'POST', '/v1/charges', { body: charge(5), headers: { 'X-Request-Key': 'h-1' } });
  assert.equal(b.raw, a.raw);
  assert.equal(fs.readFileSync(file, 'utf8').split('\n').filter(Boolean).length, 1);
  assert.equal(await stop(v.proc), 0);
});

test('--https serves TLS', async (t) => {
  const cert = path.join(dir, 'cert.pem');
  const key = path.join(dir, 'key.pem');
  try {
    execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', key, '-out', cert,
      '-days', '1', '-subj', '/CN=127.0.0.1'], { stdio: 'ignore' });
  } catch {
    t.skip('no openssl to make a certificate');
    return;
  }
  const v = await start(['--https', '--cert', cert, '--key', key, '--ledger', path.join(dir, 'tls.jsonl')]);
  assert.match(v.url, /^https:/);
  const r = await request(v.url, 'POST', '/v1/charges', { body: charge(6), headers: { 'Idempotency-Key': 'tls-1' }, tls: true });
  assert.equal(r.status, 201);
  assert.equal(await stop(v.proc), 0);
});
