// A throw-away redis-server for the rate-limiter-flexible Redis row: no persistence
// (`--save '' --appendonly no`), no TCP port (`--port 0`), a Unix socket in the benchmark's scratch
// directory. Found on PATH (or $REDIS_SERVER); when there is none the row is skipped.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import net from 'node:net';
import { delimiter, join } from 'node:path';

export function findRedisServer(): string | null {
  const explicit = process.env['REDIS_SERVER'];
  const candidates =
    explicit !== undefined && explicit !== ''
      ? [explicit]
      : (process.env['PATH'] ?? '')
          .split(delimiter)
          .filter((d) => d !== '')
          .map((d) => join(d, 'redis-server'));
  for (const c of candidates) {
    try {
      accessSync(c, constants.X_OK);
      return c;
    } catch {
      // next
    }
  }
  return null;
}

function ping(socket: string): Promise<boolean> {
  return new Promise((resolve) => {
    const conn = net.connect(socket);
    let buf = '';
    const done = (ok: boolean): void => {
      conn.destroy();
      resolve(ok);
    };
    conn.setTimeout(500, () => done(false));
    conn.on('error', () => done(false));
    conn.on('connect', () => conn.write('PING\r\n'));
    conn.on('data', (d) => {
      buf += d.toString('latin1');
      if (buf.includes('\r\n')) done(buf.startsWith('+PONG'));
    });
  });
}

export class RedisServer {
  private exited = false;

  private constructor(
    private readonly child: ChildProcess,
    readonly socket: string,
    readonly version: string,
  ) {
    child.once('exit', () => {
      this.exited = true;
    });
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  static async start(bin: string, dir: string, timeoutMs = 10_000): Promise<RedisServer> {
    const socket = join(dir, 'redis.sock');
    const versionOut = spawnSync(bin, ['--version'], { encoding: 'utf8' }).stdout;
    const version = /v=([\d.]+)/.exec(versionOut)?.[1] ?? 'unknown';
    const args = [
      '--port',
      '0',
      '--unixsocket',
      socket,
      '--unixsocketperm',
      '700',
      '--save',
      '',
      '--appendonly',
      'no',
      '--dir',
      dir,
      '--daemonize',
      'no',
      '--loglevel',
      'warning',
    ];
    const child = spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    const tail: string[] = [];
    const keep = (d: Buffer): void => {
      tail.push(
        ...d
          .toString('utf8')
          .split('\n')
          .filter((l) => l.trim() !== ''),
      );
      tail.splice(0, Math.max(0, tail.length - 10));
    };
    child.stdout?.on('data', keep);
    child.stderr?.on('data', keep);
    const server = new RedisServer(child, socket, version);
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (server.exited) throw new Error(`redis-server exited at start: ${tail.join(' | ')}`);
      if (await ping(socket)) return server;
      await new Promise((r) => setTimeout(r, 50));
    }
    server.killNow();
    throw new Error(`redis-server did not answer PING on ${socket} within ${timeoutMs} ms: ${tail.join(' | ')}`);
  }

  async stop(graceMs = 3000): Promise<void> {
    if (this.exited) return;
    const exited = new Promise<void>((resolve) => this.child.once('exit', () => resolve()));
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), graceMs);
    await exited;
    clearTimeout(timer);
  }

  killNow(): void {
    if (!this.exited) this.child.kill('SIGKILL');
  }

  /** SIGKILL (a crash, no shutdown work), resolved once the process has exited. */
  async kill(): Promise<void> {
    if (this.exited) return;
    const exited = new Promise<void>((resolve) => this.child.once('exit', () => resolve()));
    this.child.kill('SIGKILL');
    await exited;
  }
}
