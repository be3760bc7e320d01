// A storm of duplicates across processes executes once (docs/DESIGN.md §4 steps 1 and 3): ten
// clients, each with its own `idemgate mcp` process, all on one SQLite file, send the same
// charge in the same turn at once. The example server takes EXAMPLE_DELAY_MS to answer, so the
// calls really overlap: one executes, the others attach to it and replay its outcome.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  TURN,
  connectExample,
  exampleEnv,
  isReplay,
  readLedger,
  stripReplay,
  tempDir,
} from './helpers.mjs';

const N = 10;
const ARGS = { customer: 'cus_storm', amount_cents: 999, currency: 'USD' };

test(`${N} idemgate processes on one SQLite file: one charge, ${N} identical answers`, async (t) => {
  const dir = tempDir(t);
  const ledger = exampleEnv(dir).EXAMPLE_LEDGER;
  // Connect every client first, so the calls below start together.
  const clients = await Promise.all(
    Array.from({ length: N }, (_, i) =>
      connectExample(t, dir, {
        env: { EXAMPLE_DELAY_MS: '300' },
        name: `storm-${i}`,
      }).then((c) => c.client),
    ),
  );
  const results = await Promise.all(
    clients.map((c) =>
      c.callTool({ name: 'charge', arguments: ARGS, _meta: { [TURN]: 'turn-storm' } }),
    ),
  );
  const charges = readLedger(ledger).filter((e) => e.tool === 'charge');
  assert.equal(charges.length, 1, 'exactly one charge');
  for (const r of results) assert.ok(!r.isError, `no condition: ${JSON.stringify(r)}`);
  const executed = results.filter((r) => !isReplay(r));
  assert.equal(executed.length, 1, 'one answer is the execution, the others are replays');
  const outcomes = results.map(stripReplay);
  for (const o of outcomes) assert.deepEqual(o, outcomes[0], 'identical outcomes');
  assert.equal(outcomes[0].structuredContent.id, charges[0].result.id);
});
