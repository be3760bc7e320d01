#!/usr/bin/env node
// An MCP tool server with real side effects, for idemgate's quickstart, integration tests and
// benchmarks. Every tool that changes something appends one JSON line to a ledger file (and
// fsyncs it) before it answers, so "did this run twice?" is answered by counting lines.
//
//   node server.js              serve MCP over stdio
//   node server.js --http PORT  serve MCP over Streamable HTTP at http://127.0.0.1:PORT/mcp
//                               (PORT 0 picks a free port; the URL is printed on stderr)
//
// Environment:
//   EXAMPLE_LEDGER     ledger file (default ./example-ledger.jsonl). The server also appends its
//                      pid to LEDGER.pids when it starts, so a test can stop a server whose parent
//                      died without looking processes up by name.
//   EXAMPLE_DELAY_MS   how long a mutating tool waits between doing its work (the ledger line is
//                      already written) and answering: the window in which an answer can be lost
//                      after the side effect happened. Default 0.
//   EXAMPLE_SLOW_TOOL  when set, only this tool waits EXAMPLE_DELAY_MS.
//
// The delay is configured by environment, never by an argument, so tool arguments stay exactly
// what a model would send.
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { randomBytes, randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import * as z from 'zod';

const LEDGER = path.resolve(process.env.EXAMPLE_LEDGER || './example-ledger.jsonl');
const DELAY_MS = Number(process.env.EXAMPLE_DELAY_MS || 0);
const SLOW_TOOL = process.env.EXAMPLE_SLOW_TOOL || '';

// ---------------------------------------------------------------------------------------------
// The ledger: one JSON object per line, appended and fsynced, so a crash right after a tool ran
// still shows that it ran.

function appendDurably(file, line) {
  const fd = fs.openSync(file, 'a', 0o600);
  try {
    fs.writeSync(fd, line);
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

/**
 * Appends one entry for `tool`: `args` are the arguments exactly as received, `meta` the
 * request's _meta (where a proxy puts the idempotency key it forwards).
 */
function record(tool, args, result, meta) {
  const entry = { at: new Date().toISOString(), pid: process.pid, tool, args, meta, result };
  appendDurably(LEDGER, JSON.stringify(entry) + '\n');
  return entry;
}

/** Every entry in the ledger, oldest first ([] before the first write). */
function readLedger() {
  let text;
  try {
    text = fs.readFileSync(LEDGER, 'utf8');
  } catch (e) {
    if (e.code === 'ENOENT') return [];
    throw e;
  }
  return text.split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

async function maybeDelay(tool) {
  if (DELAY_MS > 0 && (!SLOW_TOOL || SLOW_TOOL === tool)) await sleep(DELAY_MS);
}

function text(t) {
  return { type: 'text', text: t };
}

// ---------------------------------------------------------------------------------------------
// Tools. Input schemas are loose (unknown arguments are kept, not silently dropped) so the
// ledger shows every argument the server really received: a proxy that forgot to strip one of
// its own arguments is caught there.

const MUTATING = { destructiveHint: true, idempotentHint: false, readOnlyHint: false };
const READ_ONLY = { readOnlyHint: true };

const chargeShape = {
  customer: z.string().describe('Customer id, e.g. "cus_123"'),
  amount_cents: z.number().int().positive().describe('Amount in the smallest currency unit'),
  currency: z.string().length(3).describe('ISO 4217 code, e.g. "EUR"'),
};
const chargeOutput = z.object({
  id: z.string(),
  customer: z.string(),
  amount_cents: z.number(),
  currency: z.string(),
  created_at: z.string(),
});

function describeCharge(c) {
  return `${c.id}: ${c.amount_cents} ${c.currency} charged to ${c.customer} at ${c.created_at}`;
}

function buildServer() {
  const server = new McpServer(
    { name: 'idemgate-example', version: '0.1.0' },
    {
      capabilities: { logging: {} },
      instructions:
        'Example tools with real side effects (tickets, charges, deploys), recorded in a ' +
        'ledger file.',
    },
  );

  server.registerTool(
    'create_ticket',
    {
      title: 'Create ticket',
      description: 'Opens a new support ticket and returns its number.',
      inputSchema: z.looseObject({
        title: z.string().describe('One-line summary'),
        body: z.string().optional().describe('Details'),
      }),
      // No annotations: MCP's defaults make the tool destructive and not idempotent.
    },
    async (args, extra) => {
      const number = readLedger().filter((e) => e.tool === 'create_ticket').length + 1;
      const ticket = { number, title: args.title, body: args.body ?? '' };
      record('create_ticket', args, ticket, extra._meta);
      await maybeDelay('create_ticket');
      return { content: [text(`Created ticket #${number}: ${args.title}`)] };
    },
  );

  server.registerTool(
    'charge',
    {
      title: 'Charge a customer',
      description: 'Charges a customer. Every call moves money.',
      inputSchema: z.looseObject(chargeShape),
      outputSchema: chargeOutput,
      annotations: MUTATING,
    },
    async (args, extra) => {
      const charge = {
        id: 'ch_' + randomBytes(8).toString('hex'),
        customer: args.customer,
        amount_cents: args.amount_cents,
        currency: args.currency,
        created_at: new Date().toISOString(),
      };
      record('charge', args, charge, extra._meta);
      await maybeDelay('charge');
      return { content: [text(describeCharge(charge))], structuredContent: charge };
    },
  );

  server.registerTool(
    'deploy',
    {
      title: 'Deploy a service',
      description:
        'Deploys a version of a service. Reports progress when the request carries a ' +
        'progressToken, and logs each step.',
      inputSchema: z.looseObject({
        service: z.string(),
        version: z.string(),
      }),
      annotations: MUTATING,
    },
    async (args, extra) => {
      const steps = ['build', 'push', 'roll out'];
      const token = extra._meta?.progressToken;
      const log = (level, data) =>
        extra.sendNotification({
          method: 'notifications/message',
          params: { level, logger: 'deploy', data },
        });
      for (let i = 0; i < steps.length; i++) {
        await log('info', `${args.service}@${args.version}: ${steps[i]}`);
        if (token !== undefined) {
          await extra.sendNotification({
            method: 'notifications/progress',
            params: {
              progressToken: token,
              progress: i + 1,
              total: steps.length,
              message: steps[i],
            },
          });
        }
      }
      const deployment = { id: 'dep_' + randomBytes(6).toString('hex'), ...args };
      record('deploy', args, deployment, extra._meta);
      await maybeDelay('deploy');
      return {
        content: [text(`Deployed ${args.service}@${args.version} as ${deployment.id}`)],
      };
    },
  );

  server.registerTool(
    'fail_sometimes',
    {
      title: 'Fail sometimes',
      description:
        'A tool that reports its own errors: the 1st, 3rd, 5th… execution (counted in the ' +
        'ledger) fails with isError, the others succeed.',
      inputSchema: z.looseObject({ note: z.string().optional() }),
    },
    async (args, extra) => {
      const n = readLedger().filter((e) => e.tool === 'fail_sometimes').length + 1;
      const failed = n % 2 === 1;
      record('fail_sometimes', args, { execution: n, failed }, extra._meta);
      await maybeDelay('fail_sometimes');
      return failed
        ? { content: [text(`execution ${n} failed: upstream said no`)], isError: true }
        : { content: [text(`execution ${n} succeeded`)] };
    },
  );

  server.registerTool(
    'list_charges',
    {
      title: 'List charges',
      description: 'Lists the charges made so far, optionally for one customer.',
      inputSchema: { customer: z.string().optional() },
      annotations: READ_ONLY,
    },
    async ({ customer }) => {
      const charges = readLedger()
        .filter((e) => e.tool === 'charge' && (!customer || e.result.customer === customer))
        .map((e) => e.result);
      return {
        content: [text(charges.length ? charges.map(describeCharge).join('\n') : 'no charges')],
      };
    },
  );

  server.registerTool(
    'find_charge',
    {
      title: 'Find a charge',
      description:
        'Finds the most recent charge with exactly these customer, amount and currency ' +
        '(what a reconcile uses). Answers structuredContent {found: true, charge} or ' +
        '{found: false}, and isError when it cannot read the ledger (it cannot tell).',
      inputSchema: chargeShape,
      annotations: READ_ONLY,
    },
    async ({ customer, amount_cents, currency }) => {
      let entries;
      try {
        entries = readLedger();
      } catch (e) {
        // idemgate's reconcile contract: "cannot tell" is an error, never "not found".
        return { content: [text(`cannot read the ledger: ${e.message}`)], isError: true };
      }
      const found = entries
        .filter(
          (e) =>
            e.tool === 'charge' &&
            e.result.customer === customer &&
            e.result.amount_cents === amount_cents &&
            e.result.currency === currency,
        )
        .pop();
      if (!found) return { content: [text('no such charge')], structuredContent: { found: false } };
      return {
        content: [text(JSON.stringify(found.result))],
        structuredContent: { found: true, charge: found.result },
      };
    },
  );

  server.registerTool(
    'list_tickets',
    {
      title: 'List tickets',
      description: 'Lists the tickets opened so far.',
      annotations: READ_ONLY,
    },
    async () => {
      const tickets = readLedger()
        .filter((e) => e.tool === 'create_ticket')
        .map((e) => `#${e.result.number}: ${e.result.title}`);
      return { content: [text(tickets.length ? tickets.join('\n') : 'no tickets')] };
    },
  );

  return server;
}

// ---------------------------------------------------------------------------------------------
// Transports.

async function serveStdio() {
  const server = buildServer();
  await server.connect(new StdioServerTransport());
  // Exit when the client closes stdin, like every well-behaved stdio server.
  process.stdin.on('end', () => process.exit(0));
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

function sendJsonRpcError(res, status, message) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32000, message }, id: null }));
}

/** Streamable HTTP with sessions: one McpServer and one transport per client session. */
async function serveHttp(port) {
  // Loaded only here: stdio needs none of the HTTP stack (which wants Node 20).
  const { StreamableHTTPServerTransport } = await import(
    '@modelcontextprotocol/sdk/server/streamableHttp.js'
  );
  const sessions = new Map(); // mcp-session-id → transport

  const httpServer = http.createServer(async (req, res) => {
    try {
      const url = new URL(req.url, 'http://localhost');
      if (url.pathname !== '/mcp') {
        res.writeHead(404).end();
        return;
      }
      const sessionId = req.headers['mcp-session-id'];
      if (req.method === 'POST') {
        const raw = await readBody(req);
        let body;
        try {
          body = JSON.parse(raw);
        } catch {
          sendJsonRpcError(res, 400, 'Parse error');
          return;
        }
        let transport = sessionId ? sessions.get(sessionId) : undefined;
        if (!transport) {
          if (sessionId || !isInitializeRequest(body)) {
            sendJsonRpcError(res, sessionId ? 404 : 400, 'Unknown or missing session');
            return;
          }
          transport = new StreamableHTTPServerTransport({
            sessionIdGenerator: () => randomUUID(),
            onsessioninitialized: (id) => sessions.set(id, transport),
          });
          transport.onclose = () => {
            if (transport.sessionId) sessions.delete(transport.sessionId);
          };
          await buildServer().connect(transport);
        }
        await transport.handleRequest(req, res, body);
        return;
      }
      if (req.method === 'GET' || req.method === 'DELETE') {
        const transport = sessionId && sessions.get(sessionId);
        if (!transport) {
          sendJsonRpcError(res, sessionId ? 404 : 400, 'Unknown or missing session');
          return;
        }
        await transport.handleRequest(req, res);
        return;
      }
      res.writeHead(405, { allow: 'GET, POST, DELETE' }).end();
    } catch (e) {
      process.stderr.write(`example server: ${e.stack || e}\n`);
      if (!res.headersSent) sendJsonRpcError(res, 500, 'Internal error');
    }
  });

  await new Promise((resolve) => httpServer.listen(port, '127.0.0.1', resolve));
  const { port: bound } = httpServer.address();
  process.stderr.write(`listening on http://127.0.0.1:${bound}/mcp\n`);
  const stop = () => httpServer.close(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

async function main() {
  fs.mkdirSync(path.dirname(LEDGER), { recursive: true });
  appendDurably(LEDGER + '.pids', `${process.pid}\n`);
  const i = process.argv.indexOf('--http');
  if (i >= 0) {
    const port = Number(process.argv[i + 1]);
    if (!Number.isInteger(port) || port < 0 || port > 65535) {
      process.stderr.write('usage: server.js [--http PORT]\n');
      process.exit(2);
    }
    await serveHttp(port);
  } else {
    await serveStdio();
  }
}

main().catch((e) => {
  process.stderr.write(`example server: ${e.stack || e}\n`);
  process.exit(1);
});
