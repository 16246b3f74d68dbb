// The drills' load generator, a process of its own (forked by chaos/load.ts) so that what the drill
// runner does meanwhile — polling metrics, injecting faults, checking writes — never delays a request
// or its measurement. It sends Envoy RLS checks for one tenant over each cell agent's Unix socket,
// paced (open loop) at a rate per cell that the parent may change at any time, and reports every
// 100 ms what each cell sent and got back, in bins of SEND time (an answer is added to the bin its
// check was sent in), with the decision latency of every answer (from the write of the request to
// the end of its answer, as Envoy's RLS client sees it).
//
// A cell whose agent is gone (restarted, killed) fails its checks at once as errors; the connection is
// retried every 100 ms, so checks resume as soon as the agent serves again.
import {
  RawH2Session,
  grpcRequestHeaderBlock,
  requestTemplate,
  type RequestTemplate,
  type StreamSink,
} from '../shared/h2-raw.js';
import {
  CODE_OK,
  CODE_OVER_LIMIT,
  DEGRADED_FLAG,
  FAIL_OPEN_FLAG,
  RLS_PATH,
  decodeResponse,
  encodeRateLimitRequest,
  grpcFrame,
} from '../testkit/load/rls-wire.js';
import type { BinUpdate, LoadBin, LoadCommand, LoadMessage } from './load-protocol.js';

const TICK_MS = 1;
const RECONNECT_MS = 100;
const REPORT_MS = 100;

interface Token {
  readonly cell: number;
  readonly sentAt: number;
  readonly bin: number;
}

interface CellState {
  readonly socket: string;
  session: RawH2Session | null;
  connecting: boolean;
  lastAttempt: number;
  rate: number;
  credit: number;
}

const emptyBin = (): LoadBin => ({
  sent: 0,
  admitted: 0,
  refused: 0,
  errors: 0,
  degraded: 0,
  failOpen: 0,
  latenciesUs: [],
  maxAdmittedLatencyUs: 0,
});

class Load implements StreamSink {
  private readonly cells: CellState[];
  private readonly template: RequestTemplate;
  private last = 0;
  private inFlight = 0;
  private tickTimer: NodeJS.Timeout | null = null;
  private reportTimer: NodeJS.Timeout | null = null;
  /** Bins changed since the last report: `${index}:${cell}` → what changed. */
  private dirty = new Map<string, BinUpdate>();

  constructor(
    sockets: readonly string[],
    tenant: string,
    domain: string,
    private readonly binMs: number,
  ) {
    this.cells = sockets.map((socket) => ({
      socket,
      session: null,
      connecting: false,
      lastAttempt: -Infinity,
      rate: 0,
      credit: 0,
    }));
    this.template = requestTemplate(
      grpcRequestHeaderBlock(RLS_PATH, 'localhost'),
      grpcFrame(encodeRateLimitRequest(domain, [[{ key: 'tenant', value: tenant }]])),
    );
  }

  /** Wall-clock ms with sub-ms precision (both processes on one machine agree on it). */
  private epochMs(): number {
    return performance.timeOrigin + performance.now();
  }

  setRates(rates: readonly number[]): void {
    rates.forEach((r, i) => {
      const c = this.cells[i];
      if (c !== undefined) c.rate = Math.max(0, r);
    });
  }

  /** Connects to every agent first (a missing agent is retried while the load runs), then paces. */
  async start(): Promise<void> {
    await Promise.all(
      this.cells.map(async (c) => {
        c.lastAttempt = performance.now();
        c.session = await RawH2Session.connect(c.socket, this).catch(() => null);
      }),
    );
    this.last = performance.now();
    this.tickTimer = setInterval(() => this.tick(), TICK_MS);
    this.reportTimer = setInterval(() => this.report(), REPORT_MS);
  }

  private bin(index: number, cell: number): LoadBin {
    const key = `${index}:${cell}`;
    let u = this.dirty.get(key);
    if (u === undefined) {
      u = { index, cell, delta: emptyBin() };
      this.dirty.set(key, u);
    }
    return u.delta;
  }

  private connect(c: CellState, now: number): void {
    if (c.connecting || now - c.lastAttempt < RECONNECT_MS) return;
    c.connecting = true;
    c.lastAttempt = now;
    RawH2Session.connect(c.socket, this).then(
      (s) => {
        c.session = s;
        c.connecting = false;
      },
      () => {
        c.connecting = false;
      },
    );
  }

  private tick(): void {
    const now = performance.now();
    const dt = Math.min(100, now - this.last) / 1000;
    this.last = now;
    const index = Math.floor(this.epochMs() / this.binMs);
    for (let i = 0; i < this.cells.length; i++) {
      const c = this.cells[i] as CellState;
      if (c.session !== null && c.session.closedReason !== null) c.session = null;
      if (c.session === null) this.connect(c, now);
      const due = c.credit + c.rate * dt;
      const n = Math.floor(due);
      c.credit = due - n;
      if (n === 0) continue;
      const b = this.bin(index, i);
      b.sent += n;
      if (c.session === null) {
        b.errors += n; // the agent is not there: Envoy's call would fail the same way
        continue;
      }
      for (let k = 0; k < n; k++) {
        this.inFlight++;
        c.session.request(this.template, { cell: i, sentAt: performance.now(), bin: index } satisfies Token);
      }
    }
  }

  streamDone(token: unknown, body: Buffer | null, error: string | null): void {
    this.inFlight--;
    const t = token as Token;
    const b = this.bin(t.bin, t.cell);
    if (error !== null || body === null) {
      b.errors++;
      return;
    }
    const r = decodeResponse(body);
    const code = r < 0 ? -1 : r & 0xffff;
    const latencyUs = Math.round((performance.now() - t.sentAt) * 1000);
    if (code === CODE_OK && (r & FAIL_OPEN_FLAG) !== 0) b.failOpen++;
    else if (code === CODE_OK) {
      b.admitted++;
      if (latencyUs > b.maxAdmittedLatencyUs) b.maxAdmittedLatencyUs = latencyUs;
    } else if (code === CODE_OVER_LIMIT) b.refused++;
    else {
      b.errors++;
      return;
    }
    if ((r & DEGRADED_FLAG) !== 0) b.degraded++;
    b.latenciesUs.push(latencyUs);
  }

  private report(): void {
    if (this.dirty.size === 0) return;
    const msg: LoadMessage = { kind: 'bins', binMs: this.binMs, updates: [...this.dirty.values()] };
    this.dirty = new Map();
    process.send?.(msg);
  }

  async stop(): Promise<void> {
    if (this.tickTimer !== null) clearInterval(this.tickTimer);
    const until = Date.now() + 2000;
    while (this.inFlight > 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    // Checks still unanswered fail here (closing the sessions ends their streams with an error).
    await Promise.all(this.cells.map((c) => c.session?.close() ?? Promise.resolve()));
    if (this.reportTimer !== null) clearInterval(this.reportTimer);
    this.report();
  }
}

let load: Load | null = null;
process.on('message', (raw: unknown) => {
  const cmd = raw as LoadCommand;
  switch (cmd.kind) {
    case 'start':
      load = new Load(cmd.sockets, cmd.tenant, cmd.domain, cmd.binMs);
      load.setRates(cmd.rates);
      void load.start().then(() => process.send?.({ kind: 'started' } satisfies LoadMessage));
      break;
    case 'rates':
      load?.setRates(cmd.rates);
      break;
    case 'stop':
      void (load?.stop() ?? Promise.resolve()).then(() => {
        process.send?.({ kind: 'stopped' } satisfies LoadMessage, () => process.exit(0));
      });
      break;
  }
});
process.on('disconnect', () => process.exit(0));
