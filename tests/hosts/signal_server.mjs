// A minimal stdio MCP server that measures how a host stops its MCP servers: it answers
// initialize and an empty tools/list, and appends one JSON line per event to $SIGNAL_LOG —
// {"event":"start","pid":…}, {"event":"SIGINT"|"SIGTERM"|"SIGHUP","ms":…} (ms since the
// first signal; every line also has `at`, the wall clock in ms) and {"event":"stdin-end","ms":…}. It ignores those signals and stays up after
// its stdin ends, so a host that escalates shows every step, and the process being gone means
// SIGKILL. No dependencies, so it measures the host alone.
import fs from 'node:fs';

const log = process.env.SIGNAL_LOG;
let first = null;
const since = () => (first === null ? 0 : Number(process.hrtime.bigint() - first) / 1e6);
const record = (event, more = {}) =>
  fs.appendFileSync(log, JSON.stringify({ event, ms: Math.round(since()), at: Date.now(), ...more }) + '\n');

record('start', { pid: process.pid });
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.on(sig, () => {
    first ??= process.hrtime.bigint();
    record(sig);
  });
}

const answer = (id, result) => process.stdout.write(JSON.stringify({ jsonrpc: '2.0', id, result }) + '\n');
let buf = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (chunk) => {
  buf += chunk;
  for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
    const line = buf.slice(0, i).trim();
    buf = buf.slice(i + 1);
    if (!line) continue;
    const msg = JSON.parse(line);
    if (msg.id === undefined) continue; // a notification
    if (msg.method === 'initialize') {
      answer(msg.id, {
        protocolVersion: msg.params?.protocolVersion ?? '2025-06-18',
        capabilities: { tools: {} },
        serverInfo: { name: 'signal-recorder', version: '1.0.0' },
      });
    } else if (msg.method === 'tools/list') {
      answer(msg.id, { tools: [] });
    } else {
      answer(msg.id, {});
    }
  }
});
process.stdin.on('end', () => record('stdin-end'));
// Stays up after stdin ends: only a signal it cannot ignore stops it.
setInterval(() => {}, 1 << 30);
