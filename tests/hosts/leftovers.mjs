// The processes a host started for one test and did not take with it. Codex 0.169 starts each
// MCP server in a process group of its own, and Gemini CLI 0.61 exits without waiting for (or
// killing) a server that ignores SIGTERM, so "the host's process group is gone" does not mean
// "idemgate is gone": these find a test's processes by its temp dir instead, which every one
// of them has in its environment (HOME, or EXAMPLE_LEDGER/SIGNAL_LOG) or command line (the store).
import fs from 'node:fs';
import { alive, defer, killPid } from './lib.mjs';

/** Pids (other than this process) whose command line or environment names `dir`. */
export function processesNaming(dir) {
  const pids = [];
  for (const name of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) continue;
    let text;
    try {
      text = fs.readFileSync(`/proc/${name}/cmdline`, 'utf8') + fs.readFileSync(`/proc/${name}/environ`, 'utf8');
    } catch {
      continue; // gone, or not ours
    }
    if (text.includes(dir) && alive(Number(name))) pids.push(Number(name));
  }
  return pids;
}

function commandLine(pid) {
  try {
    return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ').trim();
  } catch {
    return 'gone';
  }
}

/**
 * Resolves once no process names `dir` any more; rejects after `ms` with the pids left (which
 * killLeftoversAfter kills when the test ends).
 */
export async function leftoversGone(dir, ms = 10000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const left = processesNaming(dir);
    if (left.length === 0) return;
    if (Date.now() > deadline) {
      const what = left.map((pid) => `${pid} (${commandLine(pid)})`).join(', ');
      throw new Error(`still running ${ms} ms after the host exited: ${what}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** Kills, when the test ends, every process that still names `dir` (by pid). */
export function killLeftoversAfter(t, dir) {
  defer(t, () => {
    for (const pid of processesNaming(dir)) killPid(pid);
  });
}
