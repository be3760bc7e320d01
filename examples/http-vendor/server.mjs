#!/usr/bin/env node
// An HTTP "vendor" API with real side effects, for idemgate's HTTP front (`idemgate http`): its
// examples, integration tests and benchmark (bench/http/). Every side effect appends one JSON
// line to a ledger file and fsyncs it before the answer, so "did this run twice?" is answered by
// counting lines. Node 20 standard library only.
//
//   node server.mjs [--port N] [--host H] [--ledger FILE] [--delay-ms N] [--key-header NAME]
//                   [--api-key KEY] [--no-fsync] [--https --cert FILE --key FILE]
//
// The first line on stdout is exactly `listening on http://HOST:PORT` (or https://).
// See README.md for the routes, the ledger lines and the faults a request can ask for.
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { parseArgs } from 'node:util';

const USAGE = `usage: node server.mjs [--port N] [--host H] [--ledger FILE] [--delay-ms N]
                      [--key-header NAME] [--api-key KEY] [--no-fsync]
                      [--https --cert FILE --key FILE]`;

let opts;
try {
  ({ values: opts } = parseArgs({
    options: {
      port: { type: 'string', default: '0' },
      host: { type: 'string', default: '127.0.0.1' },
      ledger: { type: 'string' },
      'delay-ms': { type: 'string', default: '0' },
      'key-header': { type: 'string', default: 'Idempotency-Key' },
      'api-key': { type: 'string' },
      'no-fsync': { type: 'boolean', default: false },
      https: { type: 'boolean', default: false },
      cert: { type: 'string' },
      key: { type: 'string' },
      help: { type: 'boolean', short: 'h', default: false },
    },
    strict: true,
  }));
} catch (e) {
  console.error(`${e.message}\n${USAGE}`);
  process.exit(2);
}
if (opts.help) {
  console.log(USAGE);
  process.exit(0);
}
const PORT = Number(opts.port);
const DELAY_MS = Number(opts['delay-ms']);
if (!Number.isInteger(PORT) || PORT < 0 || PORT > 65535 || !(DELAY_MS >= 0)) {
  console.error(`bad --port or --delay-ms\n${USAGE}`);
  process.exit(2);
}
if (opts.https && (!opts.cert || !opts.key)) {
  console.error(`--https needs --cert FILE and --key FILE\n${USAGE}`);
  process.exit(2);
}
const KEY_HEADER = opts['key-header'].toLowerCase(); // Node lower-cases request header names
const API_KEY = opts['api-key']; // when set, every route but /healthz wants `Authorization: Bearer KEY`
const FSYNC = !opts['no-fsync'];
const LEDGER = path.resolve(opts.ledger || process.env.EXAMPLE_LEDGER || './vendor-ledger.jsonl');
const MAX_BODY = 10 << 20;
const MAX_KEY = 255; // Stripe's limit for an idempotency key

// ---------------------------------------------------------------------------------------------
// The ledger: one JSON object per line, appended (and fsynced unless --no-fsync) before the
// answer, so a crash right after a side effect still shows that it happened.

const ledgerFd = fs.openSync(LEDGER, 'a', 0o600);

function appendDurably(entry) {
  fs.writeSync(ledgerFd, JSON.stringify(entry) + '\n');
  if (FSYNC) fs.fsyncSync(ledgerFd);
}

function readLedger() {
  let text;
  try {
    text = fs.readFileSync(LEDGER, 'utf8');
  } catch (e) {
    if (e.code === 'ENOENT') return [];
    throw e;
  }
  const lines = [];
  for (const l of text.split('\n')) {
    if (!l) continue;
    try {
      lines.push(JSON.parse(l));
    } catch {
      // A line torn by a crash mid-write, or not ours: skipped.
    }
  }
  return lines;
}

// ---------------------------------------------------------------------------------------------
// Charges by idempotency key. Rebuilt from the ledger at start, so a restarted vendor still
// honours the keys it has seen (like a real vendor, whose key table outlives a process).

const chargesByKey = new Map();

function chargeAnswer(line) {
  const { amount, currency, customer } = line.body;
  return {
    id: line.id,
    object: 'charge',
    amount,
    currency,
    customer,
    idempotency_key: line.idempotency_key,
  };
}

for (const line of readLedger()) {
  if (line.route === '/v1/charges' && line.effect === 'charge' && line.idempotency_key != null) {
    chargesByKey.set(line.idempotency_key, { status: 201, body: chargeAnswer(line) });
  }
}

function newId(prefix) {
  return prefix + randomBytes(12).toString('hex');
}

// ---------------------------------------------------------------------------------------------
// Routes. Each handler returns {status, body, mutated}: `mutated` says whether this request
// performed a side effect (a new ledger line), or it throws a Reject for a 4xx.

class Reject extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function isNonEmptyString(v) {
  return typeof v === 'string' && v.length > 0;
}

function record(req, route, effect, id, key, body) {
  appendDurably({
    at: new Date().toISOString(),
    route,
    effect,
    id,
    idempotency_key: key,
    headers: req.headers,
    body,
  });
}

function requestKey(req) {
  const key = req.headers[KEY_HEADER];
  if (key === undefined) return null;
  if (key.length === 0 || key.length > MAX_KEY) {
    throw new Reject(400, `${opts['key-header']} must be 1 to ${MAX_KEY} characters`);
  }
  return key;
}

function postCharge(req, body) {
  const key = requestKey(req);
  if (key !== null) {
    const stored = chargesByKey.get(key);
    if (stored) return { status: stored.status, body: stored.body, mutated: false, replayed: true };
  }
  if (body === null || typeof body !== 'object' || Array.isArray(body)) {
    throw new Reject(400, 'body must be a JSON object {amount, currency, customer}');
  }
  const { amount, currency, customer } = body;
  if (!Number.isInteger(amount) || amount <= 0) {
    throw new Reject(400, 'amount must be a positive integer');
  }
  if (typeof currency !== 'string' || !/^[A-Za-z]{3}$/.test(currency)) {
    throw new Reject(400, 'currency must be a three-letter code');
  }
  if (!isNonEmptyString(customer)) throw new Reject(400, 'customer must be a non-empty string');
  const id = newId('ch_');
  record(req, '/v1/charges', 'charge', id, key, body);
  const answer = { id, object: 'charge', amount, currency, customer, idempotency_key: key };
  if (key !== null) chargesByKey.set(key, { status: 201, body: answer });
  return { status: 201, body: answer, mutated: true };
}

function postTicket(req, body) {
  if (body === null || typeof body !== 'object' || !isNonEmptyString(body.title)) {
    throw new Reject(400, 'body must be a JSON object {title}');
  }
  const id = newId('tkt_');
  // The key is written down, not honoured: this route is what a vendor without idempotency
  // support looks like.
  const key = req.headers[KEY_HEADER] ?? null;
  record(req, '/v1/tickets', 'ticket', id, key, body);
  return { status: 201, body: { id, object: 'ticket', title: body.title }, mutated: true };
}

function getCharge(url) {
  const key = url.searchParams.get('idempotency_key');
  if (key === null) throw new Reject(400, 'idempotency_key query parameter required');
  const stored = chargesByKey.get(key);
  if (!stored) throw new Reject(404, 'no charge with that idempotency_key');
  return { status: 200, body: stored.body, mutated: false };
}

// Streamed answers, written as they are produced (no side effect): what a pass-through route of
// a real API looks like when it serves a download or an event stream.
const EXPORT_BLOCK = Buffer.from(Array.from({ length: 251 * 256 }, (_, i) => i % 251));
const MAX_EXPORT = 1 << 30;

/** `bytes` bytes (default 1 MiB), byte i being i % 251, written block by block as the client reads. */
async function getExport(req, res, url) {
  const bytes = Number(url.searchParams.get('bytes') ?? 1 << 20);
  if (!Number.isInteger(bytes) || bytes < 0 || bytes > MAX_EXPORT) {
    throw new Reject(400, `bytes must be an integer from 0 to ${MAX_EXPORT}`);
  }
  countOpen(res);
  res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': bytes });
  for (let sent = 0; sent < bytes && !res.destroyed; ) {
    const block = EXPORT_BLOCK.subarray(0, Math.min(EXPORT_BLOCK.length, bytes - sent));
    sent += block.length;
    if (!res.write(block)) await new Promise((resolve) => res.once('drain', resolve).once('close', resolve));
  }
  res.end();
}

let openStreams = 0; // streamed answers not finished or abandoned yet (GET /healthz shows it)
function countOpen(res) {
  openStreams += 1;
  res.on('close', () => (openStreams -= 1));
}

const heldStreams = new Set(); // event streams waiting for POST /v1/events/release

/** An event stream: `data: first` now, `data: second` and the end once /v1/events/release is posted. */
function getEvents(req, res) {
  countOpen(res);
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  res.write('data: first\n\n');
  const finish = () => {
    heldStreams.delete(finish);
    res.end('data: second\n\n');
  };
  heldStreams.add(finish);
  res.on('close', () => heldStreams.delete(finish));
}

function releaseEvents() {
  const waiting = [...heldStreams];
  waiting.forEach((finish) => finish());
  return { status: 200, body: { released: waiting.length }, mutated: false };
}

const STREAMED_ROUTES = {
  'GET /v1/export': getExport,
  'GET /v1/events': getEvents,
};

const ROUTES = {
  'POST /v1/events/release': releaseEvents,
  'POST /v1/charges': postCharge,
  'POST /v1/tickets': postTicket,
  'GET /v1/charges': (req, body, url) => getCharge(url),
  'GET /v1/ledger': () => ({ status: 200, body: { lines: readLedger() }, mutated: false }),
  'GET /healthz': () => ({ status: 200, body: { ok: true, open_streams: openStreams }, mutated: false }),
};

// ---------------------------------------------------------------------------------------------
// Faults, asked for per request in X-Vendor-Fault (tests only). "-before" faults and 400 happen
// instead of the handler; the others after it, on whatever it answered.

function parseFault(value) {
  if (value === undefined) return null;
  if (['500', '500-before', 'drop', 'drop-before', '400'].includes(value)) return { kind: value };
  let m = /^delay:(\d+)$/.exec(value);
  if (m) return { kind: 'delay', ms: Number(m[1]) };
  m = /^big:(\d+)$/.exec(value);
  if (m) return { kind: 'big', bytes: Number(m[1]) };
  m = /^big500:(\d+)$/.exec(value);
  if (m) return { kind: 'big500', bytes: Number(m[1]) };
  m = /^refuse(-once)?:([1-5]\d\d)$/.exec(value);
  if (m) return { kind: m[1] ? 'refuse-once' : 'refuse', status: Number(m[2]) };
  throw new Reject(400, `unknown X-Vendor-Fault: ${value}`);
}

/** A body of exactly `bytes` bytes: `answer` padded as JSON, or 'x'… if too short for that. */
function bigBody(answer, bytes) {
  const base = JSON.stringify({ ...answer, pad: '' });
  if (bytes < base.length) return { type: 'text/plain', data: 'x'.repeat(bytes) };
  return { type: 'application/json', data: JSON.stringify({ ...answer, pad: 'x'.repeat(bytes - base.length) }) };
}

function send(res, status, body, extraHeaders = {}) {
  const data = typeof body === 'string' ? body : JSON.stringify(body);
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(data),
    ...extraHeaders,
  });
  res.end(data);
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on('data', (c) => {
      size += c.length;
      if (size > MAX_BODY) {
        reject(new Reject(413, 'body too large'));
        req.destroy();
        return;
      }
      chunks.push(c);
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// The requests refuse-once has refused, by method, path, key and body: the next one with the
// same four (a retry) is served.
const refusedOnce = new Set();

/** A refusal as vendors send it: STATUS, Retry-After, a Location for a redirect; no side effect. */
function refuse(req, res, url, status) {
  const headers = { 'retry-after': '1' };
  if (status >= 300 && status < 400) headers.location = `${url.pathname}?moved=1`;
  send(res, status, { error: `injected refusal: ${status}` }, headers);
}

async function handle(req, res) {
  const url = new URL(req.url, 'http://vendor');
  if (API_KEY !== undefined && url.pathname !== '/healthz' &&
      req.headers.authorization !== `Bearer ${API_KEY}`) {
    throw new Reject(401, 'missing or wrong Authorization: Bearer <api key>');
  }
  const raw = await readBody(req);
  const fault = parseFault(req.headers['x-vendor-fault']);
  if (fault?.kind === 'drop-before') return req.socket.destroy();
  if (fault?.kind === '500-before') return send(res, 500, { error: 'injected fault: 500-before' });
  if (fault?.kind === '400') return send(res, 400, { error: 'injected fault: 400' });
  if (fault?.kind === 'refuse') return refuse(req, res, url, fault.status);
  if (fault?.kind === 'refuse-once') {
    const id = `${req.method} ${url.pathname} ${req.headers[KEY_HEADER] ?? ''} ${raw}`;
    if (!refusedOnce.has(id)) {
      refusedOnce.add(id);
      return refuse(req, res, url, fault.status);
    }
  }

  const streamed = STREAMED_ROUTES[`${req.method} ${url.pathname}`];
  if (streamed) return streamed(req, res, url);
  const handler = ROUTES[`${req.method} ${url.pathname}`];
  if (!handler) {
    const known = [...Object.keys(ROUTES), ...Object.keys(STREAMED_ROUTES)].some((r) =>
      r.endsWith(` ${url.pathname}`),
    );
    throw new Reject(known ? 405 : 404, known ? 'method not allowed' : 'not found');
  }
  let body = null;
  if (req.method === 'POST') {
    try {
      body = JSON.parse(raw.toString('utf8'));
    } catch {
      throw new Reject(400, 'body is not JSON');
    }
  }
  const out = handler(req, body, url);
  // The side effect (if any) is on disk now; everything below can lose the answer.
  if (req.method === 'POST' && DELAY_MS > 0) await sleep(DELAY_MS);
  const headers = out.replayed ? { 'x-vendor-replayed': 'true' } : {};
  switch (fault?.kind) {
    case 'drop':
      return req.socket.destroy();
    case '500':
      return send(res, 500, { error: 'injected fault: 500 (after the side effect)' });
    case 'delay':
      await sleep(fault.ms);
      break;
    case 'big': {
      const big = bigBody(out.body, fault.bytes);
      return send(res, out.status, big.data, { ...headers, 'content-type': big.type });
    }
    case 'big500': {
      const big = bigBody({ error: 'injected fault: big500 (after the side effect)' }, fault.bytes);
      return send(res, 500, big.data, { 'content-type': big.type });
    }
  }
  send(res, out.status, out.body, headers);
}

function onRequest(req, res) {
  handle(req, res).catch((e) => {
    if (res.headersSent || req.socket.destroyed) return;
    if (e instanceof Reject) return send(res, e.status, { error: e.message });
    console.error(e);
    send(res, 500, { error: 'internal error' });
  });
}

const server = opts.https
  ? https.createServer({ cert: fs.readFileSync(opts.cert), key: fs.readFileSync(opts.key) }, onRequest)
  : http.createServer(onRequest);
// Longer than a client pool's idle timeout, so a pooled connection is not closed under it.
server.keepAliveTimeout = 65_000;
server.headersTimeout = 66_000;

server.listen(PORT, opts.host, () => {
  const { address, port } = server.address();
  const host = address.includes(':') ? `[${address}]` : address;
  process.stdout.write(`listening on ${opts.https ? 'https' : 'http'}://${host}:${port}\n`);
});

function shutdown() {
  server.close(() => {
    fs.closeSync(ledgerFd);
    process.exit(0);
  });
  server.closeAllConnections();
}
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);
