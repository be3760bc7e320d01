// Idempotent tool calls through `idemgate serve` (the ledger API). Node 20+, `fetch` only.
//
//   import { withIdempotency } from "./idemgate-ledger.mjs";
//   const { result, replayed } = await withIdempotency(
//     { url: "http://127.0.0.1:8787", turnId, tool: "create_ticket", args },
//     async () => createTicket(args));   // runs at most once per (turn, tool, args)
//
// A replay returns the first call's stored result without calling fn. While fn runs, a
// background timer heartbeats every lease/3, so a call longer than the lease (default 30 s)
// stays in progress and a retry waits for it instead of taking it over. If fn throws, the record is marked unknown (the action may have
// happened), or released when the error has `notSent: true` (it certainly did not). Conditions
// (in progress, outcome unknown, drift, store down) throw a LedgerError carrying the problem.

export class LedgerError extends Error {
  constructor(status, problem) {
    super(`${status} ${problem.title ?? ""}: ${problem.detail ?? JSON.stringify(problem)}`);
    this.status = status;
    this.problem = problem;
    this.type = String(problem.type ?? "").split("/").pop(); // "in-progress", "drift", ...
  }
}

async function post(url, token, path, body) {
  const headers = { "content-type": "application/json" };
  if (token) headers.authorization = `Bearer ${token}`;
  const res = await fetch(url.replace(/\/$/, "") + path, {
    method: "POST",
    headers,
    body: JSON.stringify(body),
  });
  const text = await res.text();
  const json = text ? JSON.parse(text) : {};
  if (!res.ok) throw new LedgerError(res.status, json);
  return json;
}

export async function withIdempotency({ url, token, turnId, tool, args = {}, key }, fn) {
  const begin = { tool, args };
  if (turnId !== undefined) begin.turn_id = turnId;
  if (key !== undefined) begin.key = key;
  const d = await post(url, token, "/v1/calls/begin", begin);
  if (d.decision === "replay") {
    return { replayed: true, attached: d.attached, result: d.outcome.result, outcome: d.outcome };
  }
  if (d.unguarded) return { replayed: false, result: await fn() };
  const step = (name, extra = {}) =>
    post(url, token, `/v1/calls/${name}`, { key: d.key, fence: d.fence, ...extra });
  // Until fn ends. A refused heartbeat (lease lost, outcome unknown) ends them: the record is no
  // longer this call's to keep; complete still stores what fn did at its fence. A store that is
  // down (503) or a server out of reach: the next beat tries again.
  const renew = d.lease_ms
    ? setInterval(() => {
        step("heartbeat").catch((e) => {
          if (e instanceof LedgerError && e.status !== 503) clearInterval(renew);
        });
      }, Math.max(d.lease_ms / 3, 1))
    : undefined;
  let result;
  try {
    result = await fn();
  } catch (err) {
    clearInterval(renew);
    await step(err?.notSent ? "release" : "mark_unknown").catch(() => {});
    throw err;
  }
  clearInterval(renew);
  const outcome = { status: "success", result: result ?? null };
  await step("complete", { outcome }); // stored before we answer
  return { replayed: false, key: d.key, result, outcome };
}
