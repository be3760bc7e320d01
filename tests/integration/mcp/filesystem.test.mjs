// A retried edit through the reference filesystem server runs once. The edit is deliberately
// not idempotent: replacing "A" with "AA" a second time would give "AAA".
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import {
  FILESYSTEM_SERVER,
  IDEMGATE,
  TURN,
  assertReplayMarkers,
  connectStdio,
  isReplay,
  mcpArgs,
  requireIdemgate,
  stripReplay,
  tempDir,
} from './helpers.mjs';

function edit(client, file, turn) {
  return client.callTool({
    name: 'edit_file',
    arguments: { path: file, edits: [{ oldText: 'A', newText: 'AA' }] },
    _meta: { [TURN]: turn },
  });
}

/** A temp dir with one file, and the allowed directory the server is started with. */
function workspace(t) {
  const dir = tempDir(t);
  const allowed = path.join(dir, 'files');
  fs.mkdirSync(allowed);
  fs.writeFileSync(path.join(allowed, 'note.txt'), 'A\n');
  // The server resolves symlinks (e.g. /tmp on some systems) and compares real paths.
  const real = fs.realpathSync(allowed);
  return { dir, allowed: real, file: path.join(real, 'note.txt') };
}

test('edit_file directly: a second identical edit changes the file again', async (t) => {
  const { allowed, file } = workspace(t);
  // No roots capability: the allowed directory comes from the command line.
  const { client } = await connectStdio(t, { command: 'node', args: [FILESYSTEM_SERVER, allowed] });
  await edit(client, file, 'turn-1');
  await edit(client, file, 'turn-1');
  assert.equal(fs.readFileSync(file, 'utf8'), 'AAA\n');
});

test('edit_file through idemgate: the retry in the same turn does not edit again', async (t) => {
  requireIdemgate();
  const { dir, allowed, file } = workspace(t);
  const { client } = await connectStdio(t, {
    command: IDEMGATE,
    args: [...mcpArgs(dir), '--', 'node', FILESYSTEM_SERVER, allowed],
  });
  const { tools } = await client.listTools();
  const editTool = tools.find((x) => x.name === 'edit_file');
  assert.match(editTool.description, /\[idemgate\] Safe to retry/);
  const readTool = tools.find((x) => x.name === 'read_text_file');
  assert.doesNotMatch(readTool.description, /\[idemgate\]/, 'read-only tools are not gated');

  const first = await edit(client, file, 'turn-1');
  assert.ok(!first.isError, JSON.stringify(first));
  assert.ok(!isReplay(first));
  assert.equal(fs.readFileSync(file, 'utf8'), 'AA\n');

  const retry = await edit(client, file, 'turn-1');
  assertReplayMarkers(retry);
  assert.deepEqual(stripReplay(retry), first, 'the retry gets the first diff back');
  assert.equal(fs.readFileSync(file, 'utf8'), 'AA\n', 'the file was edited once');

  // A new turn is a new edit.
  const next = await edit(client, file, 'turn-2');
  assert.ok(!isReplay(next));
  assert.equal(fs.readFileSync(file, 'utf8'), 'AAA\n');
});
