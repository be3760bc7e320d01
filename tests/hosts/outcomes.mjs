// Assertions on what a host run left in the audit log and the example server's ledger, shared
// by the Codex, Gemini CLI and agent SDK tests.
import assert from 'node:assert/strict';
import { executions, outcomes, readAudit } from './lib.mjs';

/**
 * How many calls got each answer: outcomes() of the audit log without `claimed`, which a fresh
 * call logs before its `executed` (docs/DESIGN.md §7: an audit-only entry).
 */
export function answers(attempts) {
  return outcomes(attempts.filter((a) => a.outcome !== 'claimed'));
}

/**
 * Two identical charge calls in one model message: one execution, both calls answered (the
 * second replayed, or attached to the first while it ran) and in the audit log, and neither
 * answer an error for the model. Returns the answers.
 */
export async function assertTwinCallsRanOnce(d, model) {
  assert.equal(executions(d.ledger), 1, 'one charge for two identical calls');
  const attempts = await readAudit(d.store, { tool: 'charge' });
  const answered = answers(attempts);
  assert.equal(answered.executed, 1, JSON.stringify(attempts));
  const total = Object.values(answered).reduce((a, b) => a + b, 0);
  assert.equal(total, 2, `both calls answered and logged: ${JSON.stringify(attempts)}`);
  assert.equal(model.toolResults.length, 2, JSON.stringify(model.toolResults));
  for (const r of model.toolResults) assert.ok(!r.isError, r.text);
  return answered;
}
