#!/usr/bin/env node
// bench/http peer: @aws-lambda-powertools/idempotency with its Redis cache persistence layer
// (CachePersistenceLayer on a connected @redis/client), in a plain Node http server, wired as its
// README and docs show: `makeIdempotent(fn, {persistenceStore, config})` with an
// IdempotencyConfig whose `eventKeyJmesPath` takes the key from the `Idempotency-Key` header.
// fn is the charge at the example vendor: the request is forwarded there (peer_common.mjs); its
// result {status, contentType, body} is what the layer stores and returns to a retry.
//
// Two deviations from the Lambda examples, both because this is not a Lambda:
// - `registerLambdaContext` gets an object whose remaining time is 30 s: the in-progress record's
//   expiry, the lease (idemgate's default lease is 30 s too). Without it the layer has no lease
//   and prints a warning on every call.
// - No `payloadValidationJmesPath` (the README's default): in 2.35.0 the cache layer drops the
//   payload hash when it completes a record, so with validation on every retry of a completed
//   call is refused with IdempotencyValidationError (powertools-lambda-typescript issue 5705,
//   fixed after 2.35.0). So this peer does not detect a reused key with another body.
import { makeIdempotent, IdempotencyConfig, IdempotencyAlreadyInProgressError,
  IdempotencyValidationError } from '@aws-lambda-powertools/idempotency';
import { CachePersistenceLayer } from '@aws-lambda-powertools/idempotency/cache';
import { createClient } from '@redis/client';
import { peerOptions, makeForwarder, serve, send, problem } from './peer_common.mjs';

const opts = peerOptions();
const client = await createClient({ url: opts.redis }).connect();
const persistenceStore = new CachePersistenceLayer({ client });
const config = new IdempotencyConfig({
  eventKeyJmesPath: 'headers."idempotency-key"',
  expiresAfterSeconds: 24 * 3600,
});
config.registerLambdaContext({ getRemainingTimeInMillis: () => 30_000 });
const forward = makeForwarder(opts.upstream);

// The event is what is hashed ({headers: {idempotency-key}, body}); the raw bytes ride along as
// the second argument so that the vendor gets exactly what the client sent.
const charge = makeIdempotent(
  (event, req, raw) => forward(req.method, req.url, req.headers, raw),
  { persistenceStore, config },
);

serve(opts, '/v1/charges', async (req, res, raw, body) => {
  const event = { headers: { 'idempotency-key': req.headers['idempotency-key'] }, body };
  let r;
  try {
    r = await charge(event, req, raw);
  } catch (e) {
    if (e instanceof IdempotencyAlreadyInProgressError) return problem(res, 409, e.message);
    if (e instanceof IdempotencyValidationError) return problem(res, 422, e.message);
    throw e;
  }
  send(res, r.status, r.contentType, r.body);
}, forward, () => client.close?.() ?? client.quit());
