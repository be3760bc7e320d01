// The MCP TypeScript SDK for the benchmark, without an npm install of its own: the copy that
// examples/mcp-server (`npm ci` there) or tests/integration/mcp already installed, imported by
// path. Both pin @modelcontextprotocol/sdk 1.32.2.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const ROOT = path.resolve(here, '../..');

const candidates = [
  path.join(ROOT, 'examples/mcp-server/node_modules/@modelcontextprotocol/sdk'),
  path.join(ROOT, 'tests/integration/mcp/node_modules/@modelcontextprotocol/sdk'),
];
const sdkDir = candidates.find((d) => fs.existsSync(path.join(d, 'dist/esm/types.js')));
if (!sdkDir) {
  throw new Error(
    'the MCP SDK is not installed: run `npm ci` in examples/mcp-server (or tests/integration/mcp)',
  );
}
export const SDK_DIR = sdkDir;
export const SDK_VERSION = JSON.parse(fs.readFileSync(path.join(sdkDir, 'package.json'))).version;

/** Imports `dist/esm/<rel>` of the SDK, e.g. sdk('client/index.js'). */
export function sdk(rel) {
  return import(pathToFileURL(path.join(sdkDir, 'dist/esm', rel)).href);
}
