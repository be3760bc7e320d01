// idemgate dies while the upstream executes (docs/DESIGN.md §4 steps 4–6): the record stays in
// progress, its lease runs out, and a retry after a restart must NOT charge again. It gets an
// explicit condition (in progress while the dead owner's lease lasts, then outcome unknown)
// until an operator runs `idemgate resolve KEY --release`; then the call may run again.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { promisify } from 'node:util';
import {
  IDEMGATE,
  META,
  TURN,
  alive,
  condition,
  connectExample,
  exampleEnv,
  isReplay,
  killPid,
  readLedger,
  requireIdemgate,
  until,
  tempDir,
} from './helpers.mjs';

const run = promisify(execFile);
const ARGS = { customer: 'cus_crash', amount_cents: 5000, currency: 'EUR' };

test('idemgate SIGKILLed mid-call: the retry does not charge again; resolve --release clears it', async (t) => {
  requireIdemgate();
  const dir = tempDir(t);
  const ledger = exampleEnv(dir).EXAMPLE_LEDGER;
  const store = `sqlite:${path.join(dir, 'idem.db')}`;
  // Short lease and wait so the test does not sit through the 30 s default.
  const config = path.join(dir, 'idemgate.toml');
  fs.writeFileSync(config, '[defaults]\nlease = "1s"\nwait = "500ms"\n');
  const slow = { EXAMPLE_SLOW_TOOL: 'charge', EXAMPLE_DELAY_MS: '3000' };
  const idemArgs = ['--config', config];
  const call = (client) =>
    client.callTool({ name: 'charge', arguments: ARGS, _meta: { [TURN]: 'turn-crash' } });

  // 1. Start a slow charge and kill idemgate once the charge is in the ledger (the upstream
  //    then sits in its delay: the side effect happened, the answer is not back yet).
  const first = await connectExample(t, dir, { env: slow, idemArgs });
  const pending = call(first.client).then(
    (r) => ({ result: r }),
    (e) => ({ error: e }),
  );
  await until(() => readLedger(ledger).length === 1, { what: 'the charge in the ledger' });
  const upstreamPid = readLedger(ledger)[0].pid;
  process.kill(first.pid, 'SIGKILL');
  const lost = await pending;
  assert.ok(lost.error, `the client lost its answer: ${JSON.stringify(lost)}`);
  // The killed idemgate's upstream may outlive it; stop it by its pid (its delay would end and
  // its answer go nowhere, but it must not linger).
  killPid(upstreamPid);
  await until(() => !alive(upstreamPid), { what: 'the orphaned upstream to exit' });

  // 2. Restart idemgate and retry: never a second charge.
  const second = await connectExample(t, dir, { idemArgs });
  const retry = await call(second.client);
  assert.equal(readLedger(ledger).length, 1, 'the retry did not charge again');
  if (!isReplay(retry)) {
    assert.equal(retry.isError, true, `a condition, not a success: ${JSON.stringify(retry)}`);
    assert.ok(
      ['in_progress', 'outcome_unknown'].includes(condition(retry)),
      `condition in_progress or outcome_unknown, got ${JSON.stringify(retry._meta)}`,
    );
  }

  // 3. Once the dead owner's lease is gone, the answer is "outcome unknown", and stays so.
  const unknown = await until(
    async () => {
      const r = await call(second.client);
      return condition(r) === 'outcome_unknown' ? r : null;
    },
    { ms: 15000, every: 200, what: 'an outcome_unknown answer' },
  );
  assert.equal(unknown.isError, true);
  assert.match(unknown.content.map((c) => c.text ?? '').join('\n'), /unknown/i);
  const key = unknown._meta[META + 'key'];
  assert.equal(typeof key, 'string');
  assert.equal(readLedger(ledger).length, 1, 'still one charge');

  // The audit log saw it too (attempts are written in the background: poll, bounded).
  await until(
    async () => {
      const { stdout } = await run(IDEMGATE, ['audit', '--json', '--store', store, '--key', key]);
      return stdout.split('\n').filter(Boolean).some((l) => JSON.parse(l).outcome === 'unknown');
    },
    { ms: 5000, every: 100, what: 'an "unknown" attempt in `idemgate audit`' },
  );

  // 4. The operator checked: the charge did not go through upstream (say) — release it.
  const resolved = await run(IDEMGATE, ['resolve', key, '--release', '--store', store]);
  assert.match(resolved.stdout, /released/);

  // 5. Now the call runs again.
  const again = await call(second.client);
  assert.ok(!again.isError && !isReplay(again), JSON.stringify(again));
  assert.equal(readLedger(ledger).length, 2);
});

test('the upstream dies mid-call: the caller is told "outcome unknown", and a retry does not charge again', async (t) => {
  requireIdemgate();
  const dir = tempDir(t);
  const ledger = exampleEnv(dir).EXAMPLE_LEDGER;
  const slow = { EXAMPLE_SLOW_TOOL: 'charge', EXAMPLE_DELAY_MS: '3000' };
  const call = (client) =>
    client.callTool({ name: 'charge', arguments: ARGS, _meta: { [TURN]: 'turn-upstream' } });

  // The charge is made (ledger line), then the tool server dies before it answers.
  const first = await connectExample(t, dir, { env: slow });
  const pending = call(first.client).then(
    (result) => ({ result }),
    (error) => ({ error }),
  );
  await until(() => readLedger(ledger).length === 1, { what: 'the charge in the ledger' });
  killPid(readLedger(ledger)[0].pid);
  const answer = await pending;
  // docs/DESIGN.md §4 step 7 and §6.1: a call sent upstream whose answer never came is "outcome
  // unknown", told to the model as a tool result (isError + condition), so it reads it.
  assert.ok(!answer.error, `a tool result, not a JSON-RPC error: ${answer.error}`);
  assert.equal(answer.result.isError, true);
  assert.equal(condition(answer.result), 'outcome_unknown', JSON.stringify(answer.result));

  // Whatever idemgate does next (it may exit: its server is gone), a new idemgate on the same
  // store does not run the charge again.
  const second = await connectExample(t, dir);
  const retry = await call(second.client);
  assert.equal(condition(retry), 'outcome_unknown', JSON.stringify(retry));
  assert.equal(readLedger(ledger).length, 1, 'one charge');
});
