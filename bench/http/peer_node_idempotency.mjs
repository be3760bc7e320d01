#!/usr/bin/env node
// bench/http peer: @node-idempotency/core with @node-idempotency/storage-adapter-redis in a plain
// Node http server, wired as the core package's README shows: `onRequest` before the business
// logic (answer the stored response if there is one), the business logic, then `onResponse` with
// `{body, additional: {status}}`. The business logic is the charge at the example vendor: the
// request is forwarded there (peer_common.mjs). @node-idempotency/express, the ready-made
// middleware, is not published on npm, hence the plain server around the core.
import core from '@node-idempotency/core';
import adapter from '@node-idempotency/storage-adapter-redis';
import { peerOptions, makeForwarder, serve, send, problem } from './peer_common.mjs';

const { Idempotency, IdempotencyError, IdempotencyErrorCodes } = core;
const opts = peerOptions();
const storage = new adapter.RedisStorageAdapter({ url: opts.redis });
await storage.connect();
const idempotency = new Idempotency(storage, {}); // defaults: `Idempotency-Key`, 24 h TTL
const forward = makeForwarder(opts.upstream);

const STATUS = {
  [IdempotencyErrorCodes.REQUEST_IN_PROGRESS]: 409,
  [IdempotencyErrorCodes.IDEMPOTENCY_FINGERPRINT_MISSMATCH]: 422,
  [IdempotencyErrorCodes.IDEMPOTENCY_KEY_LEN_EXEEDED]: 400,
  [IdempotencyErrorCodes.IDEMPOTENCY_KEY_MISSING]: 400,
};

serve(opts, '/v1/charges', async (req, res, raw, body) => {
  const request = { method: req.method, headers: req.headers, body, path: '/v1/charges' };
  let stored;
  try {
    stored = await idempotency.onRequest(request);
  } catch (e) {
    if (e instanceof IdempotencyError) return problem(res, STATUS[e.code] ?? 400, e.message);
    throw e;
  }
  if (stored) {
    return send(res, stored.additional.status, stored.additional.contentType, stored.body,
      { 'idempotent-replayed': 'true' });
  }
  const r = await forward(req.method, req.url, req.headers, raw);
  await idempotency.onResponse(request, { body: r.body, additional: { status: r.status, contentType: r.contentType } });
  send(res, r.status, r.contentType, r.body);
}, forward, () => storage.disconnect());
