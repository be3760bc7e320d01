#!/usr/bin/env node
// The upstream MCP server of the MCP benchmark: its tools answer at once, with no disk I/O, so
// what the benchmark measures is the transport and the proxy, not a tool. It uses the SDK's
// low-level Server (no zod validation of arguments), which is about the cheapest an SDK server
// gets; a real tool server costs more per call, which would make the proxy's share smaller.
//
//   node echo_server.mjs              serve MCP over stdio
//   node echo_server.mjs --http PORT  Streamable HTTP at http://127.0.0.1:PORT/mcp, one session
//                                     per client (PORT 0 picks a free port; the URL is printed
//                                     on stderr as `listening on URL`)
//
// Tools:
//   charge        gated (destructive, not read-only): returns a new charge id and its text
//   list_charges  read-only: returns a fixed text about the customer
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { sdk } from './sdk.mjs';

const { Server } = await sdk('server/index.js');
const { CallToolRequestSchema, ListToolsRequestSchema, isInitializeRequest } =
  await sdk('types.js');

const TOOLS = [
  {
    name: 'charge',
    description: 'Charges a customer. Every call moves money.',
    inputSchema: {
      type: 'object',
      properties: {
        customer: { type: 'string' },
        amount_cents: { type: 'integer' },
        currency: { type: 'string' },
      },
      required: ['customer', 'amount_cents', 'currency'],
    },
    annotations: { readOnlyHint: false, destructiveHint: true, idempotentHint: false },
  },
  {
    name: 'list_charges',
    description: 'Lists the charges of a customer.',
    inputSchema: { type: 'object', properties: { customer: { type: 'string' } } },
    annotations: { readOnlyHint: true },
  },
];

let charges = 0;

function buildServer() {
  const server = new Server(
    { name: 'idemgate-bench-echo', version: '0.1.0' },
    { capabilities: { tools: {} } },
  );
  server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: TOOLS }));
  server.setRequestHandler(CallToolRequestSchema, async (req) => {
    const { name, arguments: args = {} } = req.params;
    if (name === 'charge') {
      const id = `ch_${process.pid}_${++charges}`;
      const at = new Date().toISOString();
      return {
        content: [
          {
            type: 'text',
            text: `${id}: ${args.amount_cents} ${args.currency} charged to ${args.customer} at ${at}`,
          },
        ],
      };
    }
    if (name === 'list_charges') {
      return {
        content: [
          { type: 'text', text: `no charges for ${args.customer ?? 'any customer'} since ${charges}` },
        ],
      };
    }
    return { content: [{ type: 'text', text: `unknown tool ${name}` }], isError: true };
  });
  return server;
}

async function serveStdio() {
  const { StdioServerTransport } = await sdk('server/stdio.js');
  await buildServer().connect(new StdioServerTransport());
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

function jsonRpcError(res, status, message) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32000, message }, id: null }));
}

async function serveHttp(port) {
  const { StreamableHTTPServerTransport } = await sdk('server/streamableHttp.js');
  const sessions = new Map();
  const httpServer = http.createServer(async (req, res) => {
    try {
      if (new URL(req.url, 'http://localhost').pathname !== '/mcp') {
        res.writeHead(404).end();
        return;
      }
      const sessionId = req.headers['mcp-session-id'];
      if (req.method === 'POST') {
        let body;
        try {
          body = JSON.parse(await readBody(req));
        } catch {
          jsonRpcError(res, 400, 'Parse error');
          return;
        }
        let transport = sessionId ? sessions.get(sessionId) : undefined;
        if (!transport) {
          if (sessionId || !isInitializeRequest(body)) {
            jsonRpcError(res, sessionId ? 404 : 400, 'Unknown or missing session');
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
          jsonRpcError(res, sessionId ? 404 : 400, 'Unknown or missing session');
          return;
        }
        await transport.handleRequest(req, res);
        return;
      }
      res.writeHead(405, { allow: 'GET, POST, DELETE' }).end();
    } catch (e) {
      process.stderr.write(`echo server: ${e.stack || e}\n`);
      if (!res.headersSent) jsonRpcError(res, 500, 'Internal error');
    }
  });
  await new Promise((resolve) => httpServer.listen(port, '127.0.0.1', resolve));
  process.stderr.write(`listening on http://127.0.0.1:${httpServer.address().port}/mcp\n`);
  const stop = () => httpServer.close(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

const i = process.argv.indexOf('--http');
if (i >= 0) {
  const port = Number(process.argv[i + 1]);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    process.stderr.write('usage: echo_server.mjs [--http PORT]\n');
    process.exit(2);
  }
  await serveHttp(port);
} else {
  await serveStdio();
}
