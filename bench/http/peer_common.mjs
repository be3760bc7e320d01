// What the two Node peers of bench/http share: options, the HTTP server around their
// middleware, and the forwarding of a charge to the example vendor (examples/http-vendor/) over
// a keep-alive connection pool — the same hop idemgate http makes, so the peers and idemgate
// are compared on the same topology: wrk → front → vendor, with the records in one Redis.
//
//   node peer_X.mjs --upstream http://127.0.0.1:VENDORPORT --redis redis://127.0.0.1:PORT/0
//                   [--port 0] [--host 127.0.0.1]
//
// The first line on stdout is `listening on http://HOST:PORT`. SIGTERM closes and exits 0.
import http from 'node:http';
import { parseArgs } from 'node:util';

export function peerOptions() {
  const { values } = parseArgs({
    options: {
      port: { type: 'string', default: '0' },
      host: { type: 'string', default: '127.0.0.1' },
      upstream: { type: 'string' },
      redis: { type: 'string' },
    },
  });
  if (!values.upstream || !values.redis) {
    console.error('usage: node peer_X.mjs --upstream URL --redis URL [--port N] [--host H]');
    process.exit(2);
  }
  return values;
}

// Hop-by-hop headers (RFC 9110 §7.6.1) and the ones the client library sets itself.
const NOT_FORWARDED = new Set(['connection', 'keep-alive', 'proxy-connection', 'te', 'trailer',
  'transfer-encoding', 'upgrade', 'host', 'content-length']);

/** Sends requests to `upstream` (a base URL) over a pool of keep-alive connections. */
export function makeForwarder(upstream) {
  const base = new URL(upstream);
  const agent = new http.Agent({ keepAlive: true, maxSockets: 256 });
  /** Resolves to {status, contentType, body (string)}; rejects on a transport error. */
  return function forward(method, path, inHeaders, raw) {
    const headers = {};
    for (const [k, v] of Object.entries(inHeaders)) if (!NOT_FORWARDED.has(k)) headers[k] = v;
    headers['content-length'] = raw.length;
    return new Promise((resolve, reject) => {
      const req = http.request(
        { agent, host: base.hostname, port: base.port, method, path, headers },
        (res) => {
          const chunks = [];
          res.on('data', (c) => chunks.push(c));
          res.on('end', () => resolve({
            status: res.statusCode,
            contentType: res.headers['content-type'] || 'application/octet-stream',
            body: Buffer.concat(chunks).toString('utf8'),
          }));
          res.on('error', reject);
        });
      req.on('error', reject);
      req.end(raw);
    });
  };
}

export function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

export function send(res, status, contentType, body, extra = {}) {
  res.writeHead(status, { 'content-type': contentType, 'content-length': Buffer.byteLength(body), ...extra });
  res.end(body);
}

export function problem(res, status, detail) {
  send(res, status, 'application/problem+json', JSON.stringify({ status, detail }));
}

/**
 * Serves `handle(req, res, raw, json)` for POST on `gated` (the parsed JSON body in `json`) and
 * forwards every other request to the upstream unchanged. Prints the listening line.
 */
export function serve(opts, gated, handle, forward, onClose) {
  const server = http.createServer(async (req, res) => {
    try {
      const raw = await readBody(req);
      const path = req.url.split('?')[0];
      if (req.method !== 'POST' || path !== gated) {
        const r = await forward(req.method, req.url, req.headers, raw);
        return send(res, r.status, r.contentType, r.body);
      }
      let json;
      try {
        json = JSON.parse(raw.toString('utf8'));
      } catch {
        return problem(res, 400, 'body is not JSON');
      }
      await handle(req, res, raw, json);
    } catch (e) {
      if (!res.headersSent) problem(res, 502, String(e?.message || e));
    }
  });
  server.keepAliveTimeout = 65_000;
  server.listen(Number(opts.port), opts.host, () => {
    const { address, port } = server.address();
    process.stdout.write(`listening on http://${address}:${port}\n`);
  });
  const stop = () => {
    server.close(async () => {
      try { await onClose?.(); } finally { process.exit(0); }
    });
    server.closeAllConnections();
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}
