// The fault proxy over real loopback sockets: an echo server (TCP and Unix socket) and an HTTP
// server behind it. Timing is only ever checked as a lower bound.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { spawnSync } from 'node:child_process';
import { lstatSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { FaultProxy, type Endpoint } from '../../chaos/fault-proxy.js';
import { sleep, waitFor } from '../../testkit/wait.js';
import { Rng } from '../../testkit/random.js';

// ---------------------------------------------------------------------------------------------------
// Plumbing

function sha256(b: Buffer): string {
  return createHash('sha256').update(b).digest('hex');
}

/** An echo server that also records what it received and its open sockets. */
class EchoServer {
  received = 0;
  /** When each chunk reached the server (performance.now()), with its text. */
  readonly arrivals: { text: string; at: number }[] = [];
  readonly sockets = new Set<net.Socket>();
  private constructor(
    readonly server: net.Server,
    readonly endpoint: Endpoint,
  ) {}

  static async start(listen: Endpoint = { host: '127.0.0.1', port: 0 }): Promise<EchoServer> {
    const server = net.createServer();
    let echo: EchoServer | null = null;
    server.on('connection', (s) => {
      echo?.sockets.add(s);
      s.on('error', () => undefined);
      s.on('close', () => echo?.sockets.delete(s));
      s.on('data', (d: Buffer) => {
        if (echo === null) return;
        echo.received += d.length;
        echo.arrivals.push({ text: d.toString('utf8'), at: performance.now() });
      });
      s.pipe(s);
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      if ('path' in listen) server.listen(listen.path, () => resolve());
      else server.listen(listen.port, listen.host, () => resolve());
    });
    const addr = server.address();
    const endpoint: Endpoint =
      'path' in listen
        ? listen
        : { host: '127.0.0.1', port: typeof addr === 'object' && addr !== null ? addr.port : 0 };
    echo = new EchoServer(server, endpoint);
    return echo;
  }

  close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    return new Promise((r) => this.server.close(() => r()));
  }
}

/** A client connection that collects everything it reads and how it ended. */
class Client {
  readonly chunks: Buffer[] = [];
  bytes = 0;
  closed = false;
  ended = false;
  error: Error | null = null;
  connected = false;
  readonly socket: net.Socket;

  constructor(proxy: FaultProxy) {
    this.socket = proxy.port === null ? net.connect(proxy.address) : net.connect(proxy.port, '127.0.0.1');
    this.socket.on('connect', () => {
      this.connected = true;
    });
    this.socket.on('data', (d: Buffer) => {
      this.chunks.push(d);
      this.bytes += d.length;
    });
    this.socket.on('end', () => {
      this.ended = true;
    });
    this.socket.on('error', (e) => {
      this.error = e;
    });
    this.socket.on('close', () => {
      this.closed = true;
    });
  }

  data(): Buffer {
    return Buffer.concat(this.chunks);
  }

  text(): string {
    return this.data().toString('utf8');
  }

  async waitBytes(n: number, what = `${n} bytes`): Promise<void> {
    await waitFor(what, () => this.bytes >= n || this.closed, { timeoutMs: 8000, everyMs: 5 });
    assert.equal(
      this.bytes >= n,
      true,
      `${what}: connection closed after ${this.bytes} bytes (${this.error?.message ?? 'no error'})`,
    );
  }

  async waitClosed(): Promise<void> {
    await waitFor('the client connection to close', () => this.closed, { timeoutMs: 8000, everyMs: 5 });
  }

  destroy(): void {
    this.socket.destroy();
  }
}

/** 'ok' when "ping" echoes back through the proxy, 'closed' when the connection is closed instead. */
async function tryEcho(proxy: FaultProxy): Promise<'ok' | 'closed'> {
  const c = new Client(proxy);
  c.socket.write('ping');
  await waitFor('an echo or a close', () => c.bytes >= 4 || c.closed, { timeoutMs: 8000, everyMs: 5 });
  const r = c.bytes >= 4 ? 'ok' : 'closed';
  c.destroy();
  return r;
}

// ---------------------------------------------------------------------------------------------------
// Tests

void test('fault-proxy: bytes pass through unchanged both ways (4 MiB of random bytes)', async () => {
  const echo = await EchoServer.start();
  const proxy = await FaultProxy.start({ target: echo.endpoint, name: 'pass' });
  try {
    assert.equal(proxy.name, 'pass');
    assert.match(proxy.address, /^127\.0\.0\.1:\d+$/);
    assert.equal(proxy.address, `127.0.0.1:${proxy.port}`);
    const payload = randomBytes(4 * 1024 * 1024);
    const c = new Client(proxy);
    for (let off = 0; off < payload.length; off += 65_536) c.socket.write(payload.subarray(off, off + 65_536));
    await c.waitBytes(payload.length, 'the whole payload echoed');
    assert.equal(c.bytes, payload.length);
    assert.equal(sha256(c.data()), sha256(payload));
    const s = proxy.stats();
    assert.equal(s.bytesUp, payload.length);
    assert.equal(s.bytesDown, payload.length);
    assert.equal(s.accepted, 1);
    assert.equal(s.open, 1);
    assert.equal(s.heldUp, 0);
    assert.equal(s.heldDown, 0);
    // A clean half-close travels through: the echo server ends, so does our side.
    c.socket.end();
    await c.waitClosed();
    assert.equal(c.ended, true, 'FIN forwarded back');
    await waitFor('the proxied connection to be forgotten', () => proxy.stats().open === 0, {
      timeoutMs: 8000,
      everyMs: 5,
    });
  } finally {
    await proxy.stop();
    await echo.close();
  }
});

void test('fault-proxy: delayDownMs=100 delays the echo by at least 100 ms and keeps order across many chunks', async () => {
  const echo = await EchoServer.start();
  const proxy = await FaultProxy.start({ target: echo.endpoint });
  try {
    const c = new Client(proxy);
    await waitFor('connect', () => c.connected, { timeoutMs: 8000, everyMs: 5 });
    c.socket.write('warm');
    await c.waitBytes(4);
    proxy.set({ delayDownMs: 100 });
    assert.deepEqual(proxy.faults, { delayDownMs: 100 });
    const t0 = performance.now();
    c.socket.write('x');
    await c.waitBytes(5, 'the delayed echo');
    assert.equal(performance.now() - t0 >= 90, true, `round trip took ${performance.now() - t0} ms`);

    // Many small chunks, written with pauses so they arrive as separate chunks; order must hold.
    const lines: string[] = [];
    for (let i = 0; i < 300; i++) lines.push(`line-${i};`);
    const expected = lines.join('');
    const start = c.bytes;
    for (let i = 0; i < lines.length; i++) {
      c.socket.write(lines[i] ?? '');
      if (i % 30 === 0) await sleep(3);
    }
    await c.waitBytes(start + Buffer.byteLength(expected), 'every line echoed');
    assert.equal(c.data().subarray(start).toString('utf8'), expected);
  } finally {
    await proxy.stop();
    await echo.close();
  }
});

void test('fault-proxy: a slow reader pauses the source (backpressure), then gets every byte', async () => {
  const total = 32 * 1024 * 1024;
  const payload = randomBytes(total);
  const server = net.createServer((s) => {
    s.on('error', () => undefined);
    s.end(payload);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const addr = server.address();
  const port = typeof addr === 'object' && addr !== null ? addr.port : 0;
  const proxy = await FaultProxy.start({ target: { host: '127.0.0.1', port } });
  try {
    const c = new Client(proxy);
    c.socket.pause();
    await waitFor('the first bytes', () => proxy.stats().bytesDown > 0, { timeoutMs: 8000, everyMs: 5 });
    await sleep(300);
    const s = proxy.stats();
    assert.equal(s.bytesDown < total / 2, true, `the proxy kept pushing to a paused reader: ${s.bytesDown} bytes`);
    assert.equal(
      s.heldDown < 4 * 1024 * 1024,
      true,
      `the proxy buffered ${s.heldDown} bytes instead of pausing the source`,
    );
    c.socket.resume();
    await c.waitBytes(total, 'the whole stream');
    assert.equal(sha256(c.data()), sha256(payload));
    await c.waitClosed();
    assert.equal(c.ended, true, 'the server FIN reached the client');
  } finally {
    await proxy.stop();
    await new Promise<void>((r) => server.close(() => r()));
  }
});

void test('fault-proxy: delay both ways on a bulk transfer keeps every byte in order', async () => {
  const echo = await EchoServer.start();
  const proxy = await FaultProxy.start({ target: echo.endpoint });
  try {
    proxy.set({ delayUpMs: 20, delayDownMs: 20 });
    const payload = randomBytes(4 * 1024 * 1024);
    const c = new Client(proxy);
    for (let off = 0; off < payload.length; off += 4096) c.socket.write(payload.subarray(off, off + 4096));
    await c.waitBytes(payload.length, 'the whole payload echoed');
    assert.equal(sha256(c.data()), sha256(payload));
    assert.equal(proxy.stats().heldUp + proxy.stats().heldDown, 0);
  } finally {
    await proxy.stop();
    await echo.close();
  }
});

void test('fault-proxy: delayUpMs delays client→server as well', async () => {
  // Side by side in one run: the same bytes, written at the same moment, through a delaying proxy
  // and through one that does not delay. A slow machine slows both alike, so only the delay itself
  // can put the delayed bytes ~120 ms behind the others (and a delay can never make them early).
  const echo = await EchoServer.start();
  const delayed = await FaultProxy.start({ target: echo.endpoint });
  const plain = await FaultProxy.start({ target: echo.endpoint });
  try {
    delayed.set({ delayUpMs: 120 });
    const slow = new Client(delayed);
    const fast = new Client(plain);
    await waitFor('both clients connected', () => slow.connected && fast.connected, { timeoutMs: 8000, everyMs: 5 });
    const t0 = performance.now();
    slow.socket.write('slow');
    fast.socket.write('fast');
    await slow.waitBytes(4);
    await fast.waitBytes(4);
    const at = (text: string): number => echo.arrivals.find((a) => a.text === text)?.at ?? Number.NaN;
    assert.equal(
      at('slow') - t0 >= 119,
      true,
      `the delayed bytes reached the server ${at('slow') - t0} ms after the write`,
    );
    assert.equal(
      at('slow') - at('fast') >= 100,
      true,
      `the delayed bytes arrived ${at('slow') - at('fast')} ms after the undelayed ones`,
    );
    assert.equal(slow.text(), 'slow');
  } finally {
    await delayed.stop();
    await plain.stop();
    await echo.close();
  }
});

void test('fault-proxy: cutUp holds the bytes and delivers them in order after heal()', async () => {
  const echo = await EchoServer.start();
  const proxy = await FaultProxy.start({ target: echo.endpoint });
  try {
    const c = new Client(proxy);
    c.socket.write('before|');
    await c.waitBytes(7);
    proxy.set({ cutUp: true });
    const parts = ['one|', 'two|', 'three|', 'four|'];
    for (const p of parts) {
      c.socket.write(p);
      await sleep(10);
    }
    const held = Buffer.byteLength(parts.join(''));
    await waitFor('the proxy to hold every byte', () => proxy.stats().heldUp === held, { timeoutMs: 8000, everyMs: 5 });
    await sleep(100);
    assert.equal(echo.received, 7, 'nothing crossed the cut');
    assert.equal(c.bytes, 7);
    proxy.heal();
    assert.deepEqual(proxy.faults, {});
    await c.waitBytes(7 + held, 'the held bytes after heal');
    assert.equal(c.text(), `before|${parts.join('')}`);
    assert.equal(proxy.stats().heldUp, 0);
    assert.equal(proxy.stats().open, 1, 'the connection survived the cut');
  } finally {
    await proxy.stop();
    await echo.close();
  }
});

void test('fault-proxy: cutDown holds the replies; lifting the cut still honours the current delay', async () => {
  const echo = await EchoServer.start();
  const proxy = await FaultProxy.start({ target: echo.endpoint });
  try {
    const c = new Client(proxy);
    proxy.set({ cutDown: true });
    c.socket.write('held');
    await waitFor('the server to get the request', () => echo.received === 4, { timeoutMs: 8000, everyMs: 5 });
    await waitFor('the reply held', () => proxy.stats().heldDown === 4, { timeoutMs: 8000, everyMs: 5 });
    await sleep(50);
    assert.equal(c.bytes, 0);
    const t0 = performance.now();
    proxy.set({ delayDownMs: 100 });
    await c.waitBytes(4);
    assert.equal(performance.now() - t0 >= 90, true, `delivered ${performance.now() - t0} ms after the lift`);
    assert.equal(c.text(), 'held');
  } finally {
    await proxy.stop();
    await echo.close();
  }
});

void test('fault-proxy: a cut beyond maxHeldBytes destroys the connection', async () => {
  const echo = await EchoServer.start();
  const proxy = await FaultProxy.start({ target: echo.endpoint, maxHeldBytes: 1000 });
  try {
    proxy.set({ cutUp: true });
    const c = new Client(proxy);
    c.socket.write(Buffer.alloc(600));
    await waitFor('600 bytes held', () => proxy.stats().heldUp === 600, { timeoutMs: 8000, everyMs: 5 });
    assert.equal(c.closed, false);
    c.socket.write(Buffer.alloc(600));
    await c.waitClosed();
    await waitFor('the connection to be gone', () => proxy.stats().open === 0, { timeoutMs: 8000, everyMs: 5 });
    const s = proxy.stats();
    assert.equal(s.heldUp, 0);
    assert.equal(s.dropped, 1);
    assert.equal(echo.received, 0);
  } finally {
    await proxy.stop();
    await echo.close();
  }
});

void test('fault-proxy: reject destroys open connections and refuses new ones; heal() accepts again', async () => {
  const echo = await EchoServer.start();
  const proxy = await FaultProxy.start({ target: echo.endpoint });
  try {
    const a = new Client(proxy);
    const b = new Client(proxy);
    a.socket.write('a');
    b.socket.write('b');
    await a.waitBytes(1);
    await b.waitBytes(1);
    assert.equal(proxy.stats().open, 2);
    proxy.set({ reject: true });
    await a.waitClosed();
    await b.waitClosed();
    await waitFor('the server side to be closed too', () => echo.sockets.size === 0, { timeoutMs: 8000, everyMs: 5 });
    assert.equal(proxy.stats().open, 0);
    assert.equal(await tryEcho(proxy), 'closed');
    assert.equal(await tryEcho(proxy), 'closed');
    assert.equal(proxy.stats().dropped, 4);
    proxy.heal();
    assert.equal(await tryEcho(proxy), 'ok');
  } finally {
    await proxy.stop();
    await echo.close();
  }
});

void test('fault-proxy: resetConnections() destroys both sides of every open connection', async () => {
  const echo = await EchoServer.start();
  const proxy = await FaultProxy.start({ target: echo.endpoint });
  try {
    const a = new Client(proxy);
    a.socket.write('a');
    await a.waitBytes(1);
    proxy.resetConnections();
    await a.waitClosed();
    await waitFor('the server side to be closed', () => echo.sockets.size === 0, { timeoutMs: 8000, everyMs: 5 });
    assert.equal(await tryEcho(proxy), 'ok', 'new connections are still accepted');
  } finally {
    await proxy.stop();
    await echo.close();
  }
});

void test('fault-proxy: dropConnections=1 drops every new connection; a seeded 0.5 drops some', async () => {
  const echo = await EchoServer.start();
  const proxy = await FaultProxy.start({ target: echo.endpoint });
  try {
    proxy.set({ dropConnections: 1 });
    for (let i = 0; i < 5; i++) assert.equal(await tryEcho(proxy), 'closed', `connection ${i}`);
    assert.equal(proxy.stats().dropped, 5);
    assert.equal(proxy.stats().accepted, 5);
    assert.equal(echo.received, 0);
  } finally {
    await proxy.stop();
  }

  const seeded = await FaultProxy.start({ target: echo.endpoint, random: new Rng(42).asRandom() });
  try {
    seeded.set({ dropConnections: 0.5 });
    const results: string[] = [];
    for (let i = 0; i < 30; i++) results.push(await tryEcho(seeded));
    const dropped = results.filter((r) => r === 'closed').length;
    assert.equal(dropped > 0 && dropped < 30, true, `dropped ${dropped} of 30`);
    assert.equal(seeded.stats().dropped, dropped);

    // The same seed drops the same connections.
    const again = await FaultProxy.start({ target: echo.endpoint, random: new Rng(42).asRandom() });
    try {
      again.set({ dropConnections: 0.5 });
      const second: string[] = [];
      for (let i = 0; i < 30; i++) second.push(await tryEcho(again));
      assert.deepEqual(second, results);
    } finally {
      await again.stop();
    }
  } finally {
    await seeded.stop();
    await echo.close();
  }
});

void test('fault-proxy: target down closes the client; the proxy survives and works once the target is up', async () => {
  const port = await new Promise<number>((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      const p = typeof addr === 'object' && addr !== null ? addr.port : 0;
      srv.close(() => resolve(p));
    });
  });
  const proxy = await FaultProxy.start({ target: { host: '127.0.0.1', port } });
  let echo: EchoServer | null = null;
  try {
    for (let i = 0; i < 3; i++) {
      const c = new Client(proxy);
      c.socket.write('lost');
      await c.waitClosed();
      assert.equal(c.bytes, 0);
    }
    await waitFor('no open connections', () => proxy.stats().open === 0, { timeoutMs: 8000, everyMs: 5 });
    echo = await EchoServer.start({ host: '127.0.0.1', port });
    assert.equal(await tryEcho(proxy), 'ok');
  } finally {
    await proxy.stop();
    await echo?.close();
  }
});

void test('fault-proxy: Unix-socket listen (stale socket removed) and Unix-socket target', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'fault-proxy-'));
  try {
    const echoPath = join(dir, 'echo.sock');
    const proxyPath = join(dir, 'proxy.sock');
    // A socket file left behind by a process that died without closing it.
    const r = spawnSync(process.execPath, [
      '-e',
      `require('net').createServer().listen(${JSON.stringify(proxyPath)}, () => process.exit(0))`,
    ]);
    assert.equal(r.status, 0, r.stderr.toString());
    assert.equal(lstatSync(proxyPath).isSocket(), true, 'a stale socket is there');

    const echo = await EchoServer.start({ path: echoPath });
    const proxy = await FaultProxy.start({ target: { path: echoPath }, listen: { path: proxyPath } });
    try {
      assert.equal(proxy.address, proxyPath);
      assert.equal(proxy.port, null);
      const payload = randomBytes(512 * 1024);
      const c = new Client(proxy);
      c.socket.write(payload);
      await c.waitBytes(payload.length);
      assert.equal(sha256(c.data()), sha256(payload));
      proxy.set({ delayDownMs: 100 });
      const t0 = performance.now();
      c.socket.write('z');
      await c.waitBytes(payload.length + 1);
      assert.equal(performance.now() - t0 >= 90, true, `round trip took ${performance.now() - t0} ms`);
      proxy.set({ reject: true });
      await c.waitClosed();
    } finally {
      await proxy.stop();
      await echo.close();
    }

    // A path that is not a socket is left alone.
    const plain = join(dir, 'plain-file');
    writeFileSync(plain, 'keep me');
    await assert.rejects(FaultProxy.start({ target: { path: echoPath }, listen: { path: plain } }), /not a socket/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

void test('fault-proxy: HTTP through the proxy, with a delay', async () => {
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString('utf8')));
    req.on('end', () => res.end(`you said ${body}`));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const addr = server.address();
  const port = typeof addr === 'object' && addr !== null ? addr.port : 0;
  const proxy = await FaultProxy.start({ target: { host: '127.0.0.1', port } });
  const agent = new http.Agent({ keepAlive: false });
  try {
    const post = (body: string): Promise<string> =>
      new Promise((resolve, reject) => {
        const req = http.request(
          { host: '127.0.0.1', port: proxy.port ?? 0, method: 'POST', path: '/', agent },
          (res) => {
            let out = '';
            res.on('data', (d: Buffer) => (out += d.toString('utf8')));
            res.on('end', () => resolve(out));
            res.on('error', reject);
          },
        );
        req.on('error', reject);
        req.end(body);
      });
    assert.equal(await post('hello'), 'you said hello');
    proxy.set({ delayUpMs: 50, delayDownMs: 50 });
    const t0 = performance.now();
    assert.equal(await post('slowly'), 'you said slowly');
    assert.equal(performance.now() - t0 >= 90, true, `request took ${performance.now() - t0} ms`);
  } finally {
    agent.destroy();
    await proxy.stop();
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  }
});

void test('fault-proxy: stop() closes the listener and every connection', async () => {
  const echo = await EchoServer.start();
  const proxy = await FaultProxy.start({ target: echo.endpoint });
  const port = proxy.port ?? 0;
  const a = new Client(proxy);
  const b = new Client(proxy);
  a.socket.write('a');
  b.socket.write('b');
  await a.waitBytes(1);
  await b.waitBytes(1);
  proxy.set({ cutUp: true });
  a.socket.write('held');
  await waitFor('bytes held', () => proxy.stats().heldUp === 4, { timeoutMs: 8000, everyMs: 5 });
  await proxy.stop();
  await a.waitClosed();
  await b.waitClosed();
  await waitFor('the server side to be closed', () => echo.sockets.size === 0, { timeoutMs: 8000, everyMs: 5 });
  const s = proxy.stats();
  assert.equal(s.open, 0);
  assert.equal(s.heldUp, 0);
  const refused = await new Promise<string>((resolve) => {
    const c = net.connect(port, '127.0.0.1');
    c.on('connect', () => {
      c.destroy();
      resolve('connected');
    });
    c.on('error', (e: NodeJS.ErrnoException) => resolve(e.code ?? 'error'));
  });
  assert.equal(refused, 'ECONNREFUSED');
  await proxy.stop(); // idempotent
  await echo.close();
});

void test('fault-proxy: invalid faults are refused', async () => {
  const echo = await EchoServer.start();
  const proxy = await FaultProxy.start({ target: echo.endpoint });
  try {
    assert.throws(() => proxy.set({ delayUpMs: -1 }), RangeError);
    assert.throws(() => proxy.set({ dropConnections: 1.5 }), RangeError);
    assert.throws(() => proxy.set({ delayDownMs: Number.NaN }), RangeError);
    assert.deepEqual(proxy.faults, {});
  } finally {
    await proxy.stop();
    await echo.close();
  }
});
