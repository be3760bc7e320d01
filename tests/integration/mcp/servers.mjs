// Real Redis, Redis Cluster and PostgreSQL servers for the shared-store tests, started and
// stopped through tests/servers/redis.sh and tests/servers/postgres.sh in temp dirs. A test
// file starts one in a `before` hook and stops it in the matching `after` hook; in between it
// can take the server down the hard way (SIGKILL of redis-server by its pidfile, PostgreSQL's
// `pg_ctl stop -m immediate`) and bring it back on the same port with the same data.
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { ROOT, until } from './helpers.mjs';

const run = promisify(execFile);
export const REDIS_SH = path.join(ROOT, 'tests/servers/redis.sh');
export const POSTGRES_SH = path.join(ROOT, 'tests/servers/postgres.sh');

/** Runs a server script; its stderr is part of the error when it fails. Bounded. */
async function script(file, args, ms = 90000) {
  try {
    return await run('bash', [file, ...args], { timeout: ms, killSignal: 'SIGKILL' });
  } catch (e) {
    e.message +=
      `\n${path.basename(file)} ${args.join(' ')}` +
      `\nstdout:\n${e.stdout ?? ''}\nstderr:\n${e.stderr ?? ''}`;
    throw e;
  }
}

/**
 * True once `pid` no longer runs. A zombie (killed, not yet reaped by whoever inherited it)
 * counts as gone: it holds no sockets and no files.
 */
export function processGone(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z');
  } catch {
    return true;
  }
}

function readPidfile(file) {
  const pid = Number(fs.readFileSync(file, 'utf8').trim());
  if (!Number.isInteger(pid) || pid <= 0) throw new Error(`no pid in ${file}`);
  return pid;
}

/** One redis-server (`cluster: false`) or a three-master cluster, in a temp dir. */
export class RedisServer {
  constructor(dir, cluster) {
    this.dir = dir;
    this.cluster = cluster;
    this.baseUrl = fs.readFileSync(path.join(dir, 'url'), 'utf8').trim();
  }

  static async start({ cluster = false } = {}) {
    const prefix = cluster ? 'idemgate-rc-' : 'idemgate-redis-';
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
    try {
      await script(REDIS_SH, [cluster ? 'start-cluster' : 'start', dir]);
      return new RedisServer(dir, cluster);
    } catch (e) {
      await script(REDIS_SH, ['stop', dir]).catch(() => {});
      throw e;
    }
  }

  /** The store URL for idemgate, with a key prefix of its own. */
  url(prefix) {
    return this.cluster
      ? `${this.baseUrl}?prefix=${prefix}`
      : `${this.baseUrl}/0?prefix=${prefix}`;
  }

  /** The dirs holding one server each (pidfile, data, nodes.conf). */
  nodeDirs() {
    return this.cluster ? [1, 2, 3].map((i) => path.join(this.dir, `node${i}`)) : [this.dir];
  }

  /** kill -9 every redis-server of this store (by its pidfile) and waits until they are gone. */
  async kill() {
    const pids = this.nodeDirs().map((d) => readPidfile(path.join(d, 'redis.pid')));
    for (const pid of pids) process.kill(pid, 'SIGKILL');
    await until(() => pids.every(processGone), { ms: 10000, what: 'redis-server to die' });
    return pids;
  }

  /** Starts the killed server(s) again on the same port(s), on the same data (AOF). */
  async restart() {
    if (!this.cluster) {
      const port = new URL(this.baseUrl).port;
      await script(REDIS_SH, ['start', this.dir, port]);
      return;
    }
    for (const d of this.nodeDirs()) {
      const conf = fs.readFileSync(path.join(d, 'nodes.conf'), 'utf8');
      const m = conf.match(/^\S+ [\d.]+:(\d+)@(\d+)\S* \S*myself/m);
      if (!m) throw new Error(`no "myself" line in ${d}/nodes.conf:\n${conf}`);
      // The arguments of redis.sh start-cluster, minus the removal of nodes.conf: the node
      // comes back as the same member of the same cluster.
      await script(REDIS_SH, [
        'start', d, m[1],
        '--cluster-enabled', 'yes', '--cluster-port', m[2],
        '--cluster-config-file', path.join(d, 'nodes.conf'), '--cluster-node-timeout', '5000',
      ]);
    }
    const ports = this.baseUrl
      .replace(/^redis\+cluster:\/\//, '')
      .split(',')
      .map((h) => h.split(':')[1]);
    await until(
      async () => {
        for (const port of ports) {
          const args = ['-h', '127.0.0.1', '-p', port, 'cluster', 'info'];
          const { stdout } = await run('redis-cli', args, { timeout: 5000 }).catch(() => ({
            stdout: '',
          }));
          if (!/^cluster_state:ok/m.test(stdout)) return false;
        }
        return true;
      },
      { ms: 30000, every: 100, what: 'the restarted cluster to reach cluster_state:ok' },
    );
  }

  /** Stops every server and removes the dir. */
  async stop() {
    await script(REDIS_SH, ['stop', this.dir]);
  }
}

/**
 * A PostgreSQL 15 server in a temp dir directly under /tmp (postgres.sh hands the dir to the
 * `postgres` user, which must be able to reach it).
 */
export class PostgresServer {
  constructor(dir) {
    this.dir = dir;
    this.baseUrl = fs.readFileSync(path.join(dir, 'url'), 'utf8').trim();
  }

  static async start() {
    const dir = fs.mkdtempSync('/tmp/idemgate-pg-');
    try {
      await script(POSTGRES_SH, ['start', dir]);
      return new PostgresServer(dir);
    } catch (e) {
      await script(POSTGRES_SH, ['stop', dir]).catch(() => {});
      throw e;
    }
  }

  /** The store URL for idemgate, in a schema of its own. */
  url(schema) {
    return `${this.baseUrl}?schema=${schema}`;
  }

  /** `pg_ctl stop -m immediate` (postgres.sh crash): a power cut, data kept. */
  async kill() {
    await script(POSTGRES_SH, ['crash', this.dir]);
  }

  /** Starts it again on the same port and data (crash recovery). */
  async restart() {
    await script(POSTGRES_SH, ['start', this.dir]);
    const url = fs.readFileSync(path.join(this.dir, 'url'), 'utf8').trim();
    if (url !== this.baseUrl) throw new Error(`restarted on ${url}, was ${this.baseUrl}`);
  }

  async stop() {
    await script(POSTGRES_SH, ['stop', this.dir]);
  }
}
