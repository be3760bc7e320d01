// The operator console (/console) in a real browser: Debian's chromium driven
// by playwright-core, against the real idemgate binary on a temporary SQLite
// store. The test makes records end `unknown` through the ledger API (begin,
// then mark_unknown: what a runtime does when its tool call died), settles
// them through the page (release; set outcome), and checks the store with
// `idemgate inspect` and the audit log with `idemgate audit`. It also checks
// that the API refuses missing (401) and non-admin (403) tokens, and that
// `idemgate http` and `idemgate mcp --listen` serve the console too.
//
// Screenshots of each view go to $CONSOLE_SCREENSHOTS (docs/console/ when run
// by CTest), for the README's "Operating it" section.
//
//   IDEMGATE=build/idemgate CHROMIUM=/usr/bin/chromium node --test console.test.mjs
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, writeFileSync, rmSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

const IDEMGATE = process.env.IDEMGATE || new URL("../../../build/idemgate", import.meta.url).pathname;
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const SHOTS = process.env.CONSOLE_SCREENSHOTS || "";
const ADMIN = "ops-token-7f3a";
const TENANT = "acme-token-91c2";

const dir = mkdtempSync(join(tmpdir(), "idemgate-console-"));
const store = "sqlite:" + join(dir, "idemgate.db");
const config = join(dir, "idemgate.toml");
writeFileSync(config, `store = "${store}"

[[tenant]]
name = "ops"
tokens = ["${ADMIN}"]
admin = true

[[tenant]]
name = "acme"
tokens = ["${TENANT}"]
`);

const children = [];

// Starts `idemgate ARGS…` and resolves to its base URL once it says where it listens.
function start(args) {
  // --config before any `--` (after it, mcp's upstream command begins).
  const child = spawn(IDEMGATE, [args[0], "--config", config, ...args.slice(1)], { stdio: ["ignore", "ignore", "pipe"] });
  children.push(child);
  let err = "";
  return new Promise((resolve, reject) => {
    child.stderr.on("data", (chunk) => {
      err += chunk;
      const m = /listening on (http:\/\/[0-9.]+:\d+)/.exec(err);
      if (m) resolve(m[1]);
    });
    child.on("exit", (code) => reject(new Error(`idemgate ${args[0]} exited ${code}: ${err}`)));
  });
}

function cli(...args) {
  return execFileSync(IDEMGATE, [...args, "--config", config], { encoding: "utf8" });
}

async function call(base, path, { token, body, method } = {}) {
  const headers = {};
  if (token) headers.Authorization = "Bearer " + token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(base + path, {
    method: method || (body !== undefined ? "POST" : "GET"),
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch (_) { /* not JSON */ }
  return { status: res.status, json, text, headers: res.headers };
}

// A call whose runtime died mid-way: begun, then marked unknown.
async function makeUnknown(base, tool, args) {
  const begun = await call(base, "/v1/calls/begin", { token: TENANT, body: { turn_id: "turn-1", tool, args } });
  assert.equal(begun.status, 200, begun.text);
  assert.equal(begun.json.decision, "execute");
  const marked = await call(base, "/v1/calls/mark_unknown", { token: TENANT, body: { key: begun.json.key, fence: begun.json.fence } });
  assert.equal(marked.status, 200, marked.text);
  return begun.json;
}

// A call that ran once and was retried `retries` times: replays for the chart.
async function runWithRetries(base, tool, args, retries) {
  const begun = await call(base, "/v1/calls/begin", { token: TENANT, body: { turn_id: "turn-2", tool, args } });
  assert.equal(begun.status, 200, begun.text);
  const done = await call(base, "/v1/calls/complete", {
    token: TENANT, body: { key: begun.json.key, fence: begun.json.fence, outcome: { status: "success", result: { ok: true } } },
  });
  assert.equal(done.status, 200, done.text);
  for (let i = 0; i < retries; i++) {
    const again = await call(base, "/v1/calls/begin", { token: TENANT, body: { turn_id: "turn-2", tool, args } });
    assert.equal(again.json.decision, "replay", again.text);
  }
}

// An hour of audit history for the replay chart, written into the SQLite file
// (the sqlite3 shell, scripts/setup): per 2.5 minutes, charge with a retry
// storm in the middle and create_ticket steady. Marked in their detail.
function seedHistory() {
  const now = Date.now();
  const rows = [];
  for (let i = 1; i <= 23; i++) {
    const at = now - i * 150_000;
    const storm = i >= 8 && i <= 12;
    for (const [tool, n, replays] of [["charge", 20, storm ? 14 : i % 3], ["create_ticket", 10, 1 + (i % 2)]]) {
      for (let j = 0; j < n; j++) {
        const outcome = j < replays ? "replayed" : "executed";
        rows.push(`(${at + j},'acme','seed-${tool}-${i}-${j}','${tool}','seed','${outcome}',3,'seed','seeded by the console test')`);
      }
    }
  }
  execFileSync("sqlite3", [join(dir, "idemgate.db")], {
    input: "INSERT INTO attempts (at_ms, tenant, key, tool, turn, outcome, latency_ms, instance, detail) VALUES " +
      rows.join(",") + ";\n",
  });
}

let serve;
let browser;

before(async () => {
  serve = await start(["serve", "--listen", "127.0.0.1:0"]);
  seedHistory();
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox"] });
  if (SHOTS) mkdirSync(SHOTS, { recursive: true });
});

after(async () => {
  if (browser) await browser.close();
  for (const c of children) c.kill("SIGTERM");
  await Promise.all(children.map((c) => c.exitCode !== null ? null : new Promise((r) => c.on("exit", r))));
  rmSync(dir, { recursive: true, force: true });
});

async function shot(page, name) {
  if (SHOTS) await page.screenshot({ path: join(SHOTS, name), fullPage: true });
}

test("the console settles unknown records through the page, written to the store and the audit log", async () => {
  const released = await makeUnknown(serve, "create_ticket", { title: "printer on fire" });
  const settled = await makeUnknown(serve, "charge", { customer: "cus_1", amount: 1200 });
  await runWithRetries(serve, "charge", { customer: "cus_2", amount: 300 }, 3);
  await runWithRetries(serve, "create_ticket", { title: "coffee machine" }, 1);

  const page = await browser.newPage({ viewport: { width: 1280, height: 760 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  // Refused requests (the 403 above, /favicon.ico's 401, a released record's 404) are logged
  // by the browser as failed loads; anything else the page logs as an error is a failure.
  page.on("console", (m) => {
    if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) errors.push(m.text());
  });
  await page.goto(serve + "/console");

  // A tenant's token is not an admin's: the page says so and stays on the login.
  await page.fill("#token", TENANT);
  await page.click("#login-form button[type=submit]");
  await page.waitForSelector("#status:has-text('403')");
  assert.ok(await page.isVisible("#login-view"));

  await page.fill("#token", ADMIN);
  await page.click("#login-form button[type=submit]");
  const row = (key) => page.locator(`#unknown-table tbody tr[data-key="${key}"]`);
  await row(released.key).waitFor();
  await row(settled.key).waitFor();
  assert.match(await row(settled.key).innerText(), /charge/);
  assert.match(await row(settled.key).innerText(), /acme/);
  await shot(page, "unknown.png");

  // The record's page, then release from it.
  await row(released.key).locator("a").click();
  await page.waitForSelector("#record-state:has-text('unknown')");
  assert.match(await page.innerText("#record-fields"), new RegExp(`fence\\s+${released.fence}`));
  await page.locator("#record-attempts tbody tr[data-outcome=unknown]").first().waitFor();
  await shot(page, "record.png");
  await page.click("#record-actions button[data-action=release]");
  await page.waitForSelector("#confirm[open]");
  assert.match(await page.innerText("#confirm-text"), /did NOT happen/);
  await page.click("#confirm-ok");
  await page.waitForSelector("#status:has-text('released')");
  await page.waitForSelector("#record-fields:has-text('no live record')");

  // Set the outcome of the other from the list; a cancelled dialog changes nothing first.
  await page.goto(serve + "/console#unknown");
  await row(settled.key).locator("button[data-action=set-outcome]").click();
  await page.waitForSelector("#confirm[open]");
  await page.click("#confirm-cancel");
  await page.waitForSelector("#confirm:not([open])", { state: "attached" });
  assert.equal((await call(serve, `/v1/records/${encodeURIComponent(settled.key)}?tenant=acme`, { token: ADMIN })).json.state, "unknown");
  await row(settled.key).locator("button[data-action=set-outcome]").click();
  await page.waitForSelector("#confirm[open]");
  const outcome = JSON.stringify({ status: "success", result: { charge: "ch_42" } });
  await page.selectOption("#confirm-class", "success");
  await page.fill("#confirm-body", outcome);
  await page.click("#confirm-ok");
  await page.waitForSelector("#status:has-text('outcome set')");
  await page.waitForSelector("#unknown-empty:visible");

  // The store, through the CLI: one record gone, the other completed with that outcome.
  assert.throws(() => cli("inspect", released.key, "--tenant", "acme"), /no record/);
  const inspected = JSON.parse(cli("inspect", settled.key, "--tenant", "acme", "--json", "--show-outcome"));
  assert.equal(inspected.state, "completed");
  assert.equal(inspected.outcome_body, outcome);
  // A retry now replays what the operator stored.
  const retry = await call(serve, "/v1/calls/begin", { token: TENANT, body: { turn_id: "turn-1", tool: "charge", args: { customer: "cus_1", amount: 1200 } } });
  assert.equal(retry.json.decision, "replay", retry.text);
  assert.deepEqual(retry.json.outcome, JSON.parse(outcome));
  // The audit log names who did each.
  const audit = cli("audit", "--outcome", "resolved", "--json").trim().split("\n").map((l) => JSON.parse(l));
  const byKey = Object.fromEntries(audit.map((a) => [a.key, a]));
  assert.equal(byKey[released.key].detail, "released by ops (console)");
  assert.match(byKey[settled.key].detail, /^outcome set \(success, \d+ bytes\) by ops \(console\)$/);
  assert.equal(byKey[settled.key].tenant, "acme");

  // The attempt log with its filters.
  await page.goto(serve + "/console#attempts");
  await page.locator("#attempts-table tbody tr").first().waitFor();
  await page.fill("#attempts-form [name=limit]", "14");
  await page.click("#attempts-form button[type=submit]");
  await page.waitForFunction(() => document.querySelectorAll("#attempts-table tbody tr").length === 14);
  await shot(page, "attempts.png");
  await page.fill("#attempts-form [name=tenant]", "acme");
  await page.selectOption("#attempts-form [name=outcome]", "resolved");
  await page.click("#attempts-form button[type=submit]");
  await page.waitForFunction(() => {
    const rows = [...document.querySelectorAll("#attempts-table tbody tr")];
    return rows.length === 2 && rows.every((r) => r.dataset.outcome === "resolved");
  });

  // The replay ratio per tool.
  await page.goto(serve + "/console#replay");
  await page.waitForSelector("#legend li[data-tool=charge]");
  await page.waitForSelector("#chart svg path[d*=L]");
  await shot(page, "replay.png");

  // Evict from the record page (the completed record).
  await page.goto(serve + "/console" + `#record/acme/${encodeURIComponent(settled.key)}`);
  await page.waitForSelector("#record-state:has-text('completed')");
  await page.click("#record-actions button[data-action=evict]");
  await page.waitForSelector("#confirm[open]");
  await page.click("#confirm-ok");
  await page.waitForSelector("#status:has-text('evicted')");
  assert.throws(() => cli("inspect", settled.key, "--tenant", "acme"), /no record/);
  const evicted = cli("audit", "--outcome", "evicted", "--json").trim().split("\n").map((l) => JSON.parse(l));
  assert.equal(evicted.length, 1);
  assert.match(evicted[0].detail, /by ops \(console\)$/);

  assert.deepEqual(errors, [], "the page logged errors");
  await page.close();
});

test("the console's API refuses a missing token (401) and a non-admin one (403)", async () => {
  const { key, fence } = await makeUnknown(serve, "deploy", { service: "web" });
  for (const path of ["/console/api/whoami", "/console/api/unknown", "/console/api/attempts",
    "/console/api/replay", `/console/api/record?tenant=acme&key=${encodeURIComponent(key)}`]) {
    assert.equal((await call(serve, path)).status, 401, path);
    assert.equal((await call(serve, path, { token: "not-a-token" })).status, 401, path);
    assert.equal((await call(serve, path, { token: TENANT })).status, 403, path);
    assert.equal((await call(serve, path, { token: ADMIN })).status, 200, path);
  }
  for (const action of ["release", "set-outcome", "evict"]) {
    const body = { tenant: "acme", key, fence, class: "success", body: "{}" };
    assert.equal((await call(serve, "/console/api/" + action, { body })).status, 401, action);
    assert.equal((await call(serve, "/console/api/" + action, { token: TENANT, body })).status, 403, action);
  }
  // A form post from another site: not JSON, so refused before anything is read.
  const form = await fetch(serve + "/console/api/release", {
    method: "POST", headers: { Authorization: "Bearer " + ADMIN, "Content-Type": "text/plain" },
    body: JSON.stringify({ tenant: "acme", key, fence }),
  });
  assert.equal(form.status, 415);
  assert.equal((await call(serve, `/v1/records/${encodeURIComponent(key)}?tenant=acme`, { token: ADMIN })).json.state, "unknown");

  const shell = await call(serve, "/console");
  assert.equal(shell.status, 200);
  assert.match(shell.headers.get("content-security-policy"), /script-src 'self'/);
  assert.equal(shell.headers.get("x-content-type-options"), "nosniff");
  assert.doesNotMatch(shell.text, /<script>(?!<\/script>)/, "no inline script");
});

test("idemgate http and idemgate mcp --listen serve the console too", async () => {
  const http = await start(["http", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9"]);
  const mcp = await start(["mcp", "--listen", "127.0.0.1:0", "--", "/bin/cat"]);
  for (const base of [http, mcp]) {
    const shell = await call(base, "/console");
    assert.equal(shell.status, 200, base);
    assert.match(shell.text, /idemgate console/);
    assert.equal((await call(base, "/console/console.js")).status, 200, base);
    assert.equal((await call(base, "/console/api/unknown")).status, 401, base);
    assert.equal((await call(base, "/console/api/unknown", { token: TENANT })).status, 403, base);
    const list = await call(base, "/console/api/unknown", { token: ADMIN });
    assert.equal(list.status, 200, base + " " + list.text);
    assert.ok(list.json.records.some((r) => r.tool === "deploy"), list.text);
  }
  // The page works there as in `serve`: log in, see the record waiting.
  const page = await browser.newPage();
  await page.goto(mcp + "/console");
  await page.fill("#token", ADMIN);
  await page.click("#login-form button[type=submit]");
  await page.locator("#unknown-table tbody tr", { hasText: "deploy" }).waitFor();
  await page.close();
});
