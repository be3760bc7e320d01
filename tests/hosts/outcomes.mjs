// Assertions on what a host run left in the audit log and the example server's ledger, shared
// by the Codex, Gemini CLI and agent SDK tests.
import assert from 'node:assert/strict';
import { executions, outcomes, readAudit } from './lib.mjs';

/**
 * Two identical charge calls in one model message: one execution, both calls answered (the
 * second replayed, or attached to the first while it ran) and in the audit log beside the
 * first's `claimed`, and neither answer an error for the model. Returns the audit's outcomes.
 */
export async function assertTwinCallsRanOnce(d, model) {
  assert.equal(executions(d.ledger), 1, 'one charge for two identical calls');
  const attempts = await readAudit(d.store, { tool: 'charge' });
  const seen = outcomes(attempts);
  assert.equal(seen.claimed, 1, JSON.stringify(attempts));
  assert.equal(seen.executed, 1, JSON.stringify(attempts));
  const second = (seen.replayed ?? 0) + (seen.attached ?? 0);
  assert.equal(attempts.length, 3, `both calls answered and logged: ${JSON.stringify(attempts)}`);
  assert.equal(second, 1, `the second call replayed or attached: ${JSON.stringify(attempts)}`);
  assert.equal(model.toolResults.length, 2, JSON.stringify(model.toolResults));
  for (const r of model.toolResults) assert.ok(!r.isError, r.text);
  return seen;
}
