#!/usr/bin/env node
// A tiny MCP server written by hand (no SDK) that speaks the stateless 2026-07-28 dialect:
// `server/discover`, `resultType` on every result, per-request `_meta` instead of an
// `initialize` handshake, and a Multi Round-Trip Request: `delete_repo` first answers
// `resultType: "input_required"` with an elicitation, and deletes only when called again with
// the answer in `inputResponses` (and the `requestState` it handed out).
//
// It also accepts the legacy `initialize` handshake, like a server that supports both.
//
// Every tools/call that arrives is appended to RAW_LEDGER (one JSON line: the params received
// and what was answered), so a test can count how often a call reached the upstream.
import fs from 'node:fs';
import readline from 'node:readline';

const LEDGER = process.env.RAW_LEDGER || './raw-ledger.jsonl';
const VERSIONS = ['2026-07-28', '2025-11-25'];
const INFO = { name: 'raw-2026-test-server', version: '1.0.0' };

const TOOLS = [
  {
    name: 'delete_repo',
    description: 'Deletes a repository after the user confirms.',
    inputSchema: {
      type: 'object',
      properties: { repo: { type: 'string' } },
      required: ['repo'],
    },
    annotations: { destructiveHint: true },
  },
  {
    name: 'repo_status',
    description: 'Tells whether a repository exists.',
    inputSchema: { type: 'object', properties: { repo: { type: 'string' } }, required: ['repo'] },
    annotations: { readOnlyHint: true },
  },
  {
    // SEP-2243: a Streamable HTTP client mirrors `turn` into Mcp-Param-TurnId.
    name: 'transfer',
    description: 'Moves money.',
    inputSchema: {
      type: 'object',
      properties: {
        turn: { type: 'string', 'x-mcp-header': 'TurnId' },
        amount: { type: 'integer' },
      },
      required: ['amount'],
    },
  },
];

const deleted = new Set();

function log(entry) {
  const fd = fs.openSync(LEDGER, 'a');
  fs.writeSync(fd, JSON.stringify(entry) + '\n');
  fs.fsyncSync(fd);
  fs.closeSync(fd);
}

function send(msg) {
  process.stdout.write(JSON.stringify(msg) + '\n');
}

// The state is the repository name, so the continuation can be checked against the call.
const stateFor = (repo) => Buffer.from(JSON.stringify({ repo })).toString('base64url');

function callTool(params) {
  const { name, arguments: args = {}, inputResponses, requestState } = params;
  if (name === 'repo_status') {
    return {
      resultType: 'complete',
      content: [{ type: 'text', text: deleted.has(args.repo) ? 'deleted' : 'exists' }],
    };
  }
  if (name === 'transfer') {
    return { resultType: 'complete', content: [{ type: 'text', text: `Moved ${args.amount}.` }] };
  }
  if (name !== 'delete_repo') return null;
  const answer = inputResponses?.confirm;
  if (!answer) {
    return {
      resultType: 'input_required',
      inputRequests: {
        confirm: {
          method: 'elicitation/create',
          params: {
            mode: 'form',
            message: `Really delete ${args.repo}? This cannot be undone.`,
            requestedSchema: {
              type: 'object',
              properties: { confirm: { type: 'boolean', title: 'Delete it' } },
              required: ['confirm'],
            },
          },
        },
      },
      requestState: stateFor(args.repo),
    };
  }
  if (requestState !== stateFor(args.repo)) {
    return {
      resultType: 'complete',
      isError: true,
      content: [{ type: 'text', text: 'requestState does not match the arguments' }],
    };
  }
  if (answer.action !== 'accept' || answer.content?.confirm !== true) {
    return { resultType: 'complete', content: [{ type: 'text', text: 'Not deleted.' }] };
  }
  deleted.add(args.repo);
  return {
    resultType: 'complete',
    content: [{ type: 'text', text: `Deleted ${args.repo}.` }],
    structuredContent: { deleted: args.repo },
  };
}

function handle(msg) {
  if (msg.id === undefined) return; // notifications: nothing to answer
  const reply = (result) => send({ jsonrpc: '2.0', id: msg.id, result });
  const fail = (code, message) => send({ jsonrpc: '2.0', id: msg.id, error: { code, message } });
  switch (msg.method) {
    case 'server/discover':
      return reply({
        resultType: 'complete',
        supportedVersions: VERSIONS,
        capabilities: { tools: {} },
        serverInfo: INFO,
        instructions: 'A hand-written 2026-07-28 test server.',
        ttlMs: 60000,
        cacheScope: 'public',
      });
    case 'initialize':
      return reply({
        protocolVersion: '2025-11-25',
        capabilities: { tools: {} },
        serverInfo: INFO,
      });
    case 'ping':
      return reply({ resultType: 'complete' });
    case 'tools/list':
      return reply({ resultType: 'complete', tools: TOOLS, ttlMs: 0, cacheScope: 'private' });
    case 'tools/call': {
      const result = callTool(msg.params ?? {});
      if (!result) return fail(-32602, `Unknown tool: ${msg.params?.name}`);
      log({ params: msg.params, resultType: result.resultType });
      return reply(result);
    }
    default:
      return fail(-32601, `Method not found: ${msg.method}`);
  }
}

const rl = readline.createInterface({ input: process.stdin });
rl.on('line', (line) => {
  if (!line.trim()) return;
  let msg;
  try {
    msg = JSON.parse(line);
  } catch {
    send({ jsonrpc: '2.0', id: null, error: { code: -32700, message: 'Parse error' } });
    return;
  }
  handle(msg);
});
rl.on('close', () => process.exit(0));
