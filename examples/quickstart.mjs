#!/usr/bin/env node
// idemgate in one minute: an MCP client talks to the example tool server through
// `idemgate mcp`, charges a customer, retries the same call, and shows that the customer was
// charged once. Run by scripts/quickstart (which builds idemgate and installs the packages), or:
//
//   node examples/quickstart.mjs [--idemgate build/idemgate] [--dir DIR]
//
// DIR (default: a new temp dir) holds the idemgate store (idem.db) and the example server's
// ledger (ledger.jsonl), so every run starts from nothing.
import fs from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const examples = path.dirname(fileURLToPath(import.meta.url));
const root = path.dirname(examples);
const serverDir = path.join(examples, 'mcp-server');
// The SDK is installed with the example server (npm install in examples/mcp-server).
const require = createRequire(path.join(serverDir, 'package.json'));
const { Client } = require('@modelcontextprotocol/sdk/client/index.js');
const { StdioClientTransport } = require('@modelcontextprotocol/sdk/client/stdio.js');

function option(name, fallback) {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : fallback;
}
const idemgate = path.resolve(option('--idemgate', path.join(root, 'build/idemgate')));
const dir = path.resolve(
  option('--dir', '') || fs.mkdtempSync(path.join(os.tmpdir(), 'idemgate-quickstart-')),
);
fs.mkdirSync(dir, { recursive: true });
const store = `sqlite:${path.join(dir, 'idem.db')}`;
const ledger = path.join(dir, 'ledger.jsonl');
const rel = (p) => {
  const r = path.relative(process.cwd(), p);
  return r && !r.startsWith('..') ? r : p;
};

const bold = (s) => (process.stdout.isTTY ? `\x1b[1m${s}\x1b[0m` : s);
const dim = (s) => (process.stdout.isTTY ? `\x1b[2m${s}\x1b[0m` : s);
const say = (s = '') => process.stdout.write(s + '\n');
const TURN = 'dev.idemgate/turnId';

function wrap(text, width) {
  const lines = [''];
  for (const word of text.split(/\s+/)) {
    const last = lines.length - 1;
    if (lines[last] && (lines[last] + ' ' + word).length > width) lines.push(word);
    else lines[last] = lines[last] ? lines[last] + ' ' + word : word;
  }
  return lines;
}

say(bold('idemgate quickstart'));
say(`An agent host runs the tool server through idemgate instead of directly:`);
const serverJs = rel(path.join(serverDir, 'server.js'));
say(dim(`  ${rel(idemgate)} mcp --store ${store} -- node ${serverJs}`));
say(`The example server appends one line to ${ledger} per real side effect.`);
say();

const transport = new StdioClientTransport({
  command: idemgate,
  args: ['mcp', '--store', store, '--', 'node', path.join(serverDir, 'server.js')],
  env: { EXAMPLE_LEDGER: ledger },
  stderr: 'inherit',
});
const client = new Client({ name: 'idemgate-quickstart', version: '1.0.0' });
await client.connect(transport);

// 1. What the model sees.
say(bold('1. tools/list — what the model reads'));
const { tools } = await client.listTools();
const gated = tools.filter((t) => /\[idemgate\]/.test(t.description ?? ''));
const passed = tools.filter((t) => !gated.includes(t));
say(`  gated:     ${gated.map((t) => t.name).join(', ')}`);
say(`  read-only: ${passed.map((t) => t.name).join(', ')} ${dim('(passed through untouched)')}`);
const note = gated[0]?.description.slice(gated[0].description.indexOf('[idemgate]'));
if (note) {
  say('  each gated description now ends with:');
  say(dim(wrap(note, 84).map((l) => '    ' + l).join('\n')));
}
say();

// 2. A charge, and 3. the same charge again, as a model retrying after a timeout would.
const args = { customer: 'cus_123', amount_cents: 1250, currency: 'EUR' };
const call = () =>
  client.callTool({ name: 'charge', arguments: args, _meta: { [TURN]: 'turn-1' } });
const show = (r) =>
  r.content.map((c) => `  → ${c.type === 'text' ? c.text : `[${c.type}]`}`).join('\n');

say(bold(`2. charge ${JSON.stringify(args)} in turn "turn-1"`));
const first = await call();
say(show(first));
say();

say(bold('3. the same call again (a retry: same turn, same arguments)'));
const second = await call();
say(show(second));
const m = second._meta ?? {};
say(dim(`  _meta: replayed=${m['dev.idemgate/replayed']} firstAt=${m['dev.idemgate/firstAt']}`));
say();

await client.close();

// 4. What really happened.
const charges = fs
  .readFileSync(ledger, 'utf8')
  .split('\n')
  .filter(Boolean)
  .map((l) => JSON.parse(l))
  .filter((e) => e.tool === 'charge');
say(bold(`4. the ledger: ${charges.length} charge${charges.length === 1 ? '' : 's'}`));
for (const { result: c, at } of charges) {
  say(`  ${c.id}  ${c.amount_cents} ${c.currency}  ${c.customer}  at ${at}`);
}
say();

const ok =
  charges.length === 1 &&
  m['dev.idemgate/replayed'] === true &&
  second.structuredContent?.id === first.structuredContent?.id;
if (!ok) {
  say('Something is off: expected one charge and a replayed second answer.');
  process.exit(1);
}
say(`Charged once, answered twice. See the attempts with:`);
say(dim(`  ${rel(idemgate)} audit --store ${store}`));
