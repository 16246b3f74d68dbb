// Operators' writes during a drill, and the check that none acknowledged is lost: a few clients
// update a handful of tenants (each a register: its rate override, a fresh value per write) and read
// them back with linearizable reads, through whichever replica they pick, following redirects to the
// leader. Every operation is recorded with its call and return time; a write whose outcome is
// unknown (timeout, 5xx, connection reset) may or may not have happened, and is recorded as such.
// At the end the history is checked for linearizability (testkit/check/linearizability.ts, Wing & Gong
// with memoization, per key, without the timed-out writes no read saw): an acknowledged write that
// vanished, or a read of a value that was never acknowledged and then disappeared, makes it fail.
import {
  checkLinearizable,
  kvModel,
  type KvInput,
  type KvOutput,
  type Operation,
} from '../testkit/check/linearizability.js';
import { sleep } from '../testkit/wait.js';

/**
 * The register tenants (also on a staging deployment: named so nobody mistakes them). Six, so that
 * the operations whose outcome is unknown (all of them while the coordinators are down) spread
 * thin: the checker searches each key on its own.
 */
export const ADMIN_KEYS: readonly string[] = Array.from({ length: 6 }, (_, i) => `chaos-lin-${i}`);
const KEYS = ADMIN_KEYS;
const OP_TIMEOUT_MS = 3000;

export interface AdminTarget {
  /** Admin URLs of the replicas to pick from (any; writes are redirected to the leader). */
  urls(): readonly string[];
  /** The tier every register tenant is on. */
  readonly tier: string;
  /** Bearer token for the admin API (null: none). */
  readonly token: string | null;
}

export interface AdminWorkloadSummary {
  readonly writesOk: number;
  readonly writesUnknown: number;
  readonly writesFailed: number;
  readonly readsOk: number;
  readonly readsFailed: number;
}

export class AdminWorkload {
  readonly history: Operation<KvInput, KvOutput>[] = [];
  private running = false;
  private loops: Promise<void>[] = [];
  private seq = 0;
  private summary = { writesOk: 0, writesUnknown: 0, writesFailed: 0, readsOk: 0, readsFailed: 0 };

  constructor(
    private readonly target: AdminTarget,
    private readonly clock: () => number,
    private readonly clients = 3,
  ) {}

  /** Writes a first value to every register (retrying until acknowledged), then starts the clients. */
  async start(): Promise<void> {
    for (const key of KEYS) {
      for (;;) {
        const r = await this.write(0, key, null);
        if (r.outcome === 'ok') break;
        await sleep(200);
      }
    }
    this.running = true;
    this.loops = Array.from({ length: this.clients }, (_, i) => this.loop(i + 1));
  }

  async stop(): Promise<AdminWorkloadSummary> {
    this.running = false;
    await Promise.all(this.loops);
    return { ...this.summary };
  }

  private async loop(client: number): Promise<void> {
    let n = 0;
    while (this.running) {
      const key = KEYS[(client + n) % KEYS.length] as string;
      if (n % 2 === 0) await this.write(client, key, null);
      else await this.read(client, key, null);
      n++;
      await sleep(20);
    }
  }

  private auth(): Record<string, string> {
    return this.target.token === null ? {} : { authorization: `Bearer ${this.target.token}` };
  }

  private pick(pinned: string | null): string | null {
    if (pinned !== null) return pinned;
    const urls = this.target.urls();
    return urls.length === 0 ? null : (urls[Math.floor(Math.random() * urls.length)] as string);
  }

  /**
   * One write of a fresh value. `pinned`: send it to that replica (e.g. a paused leader) instead of
   * a random one. Returns what happened; the history has it either way.
   */
  async write(
    client: number,
    key: string,
    pinned: string | null,
    opts: { timeoutMs?: number; followRedirects?: boolean } = {},
  ): Promise<{ outcome: 'ok' | 'unknown' | 'failed'; value: string; status: number | null }> {
    const value = String(1000 + ++this.seq);
    const url = this.pick(pinned);
    if (url === null) return { outcome: 'failed', value, status: null };
    const call = this.clock();
    const op = { clientId: client, input: { kind: 'put', key, value } as KvInput, output: null, call };
    let status: number | null = null;
    try {
      const r = await fetch(`${url}/v1/tenants/${key}`, {
        method: 'PUT',
        headers: { 'content-type': 'application/json', ...this.auth() },
        body: JSON.stringify({ tier: this.target.tier, rate: Number(value) }),
        redirect: opts.followRedirects === false ? 'manual' : 'follow',
        signal: AbortSignal.timeout(opts.timeoutMs ?? OP_TIMEOUT_MS),
      });
      await r.arrayBuffer();
      status = r.status;
      if (r.status === 200) {
        this.history.push({ ...op, return: this.clock() });
        this.summary.writesOk++;
        return { outcome: 'ok', value, status };
      }
      if ((r.status >= 300 && r.status < 400) || (r.status >= 400 && r.status < 500)) {
        // Redirected (not followed) or refused before it was proposed: not applied.
        this.summary.writesFailed++;
        return { outcome: 'failed', value, status };
      }
    } catch (e) {
      // Refused connection: the request never reached a server, so it was not applied. (Anything
      // else — a timeout, a reset, too many redirects — may have been.)
      if (e instanceof Error && (e.cause as { code?: string } | undefined)?.code === 'ECONNREFUSED') {
        this.summary.writesFailed++;
        return { outcome: 'failed', value, status };
      }
    }
    this.history.push({ ...op, return: Infinity });
    this.summary.writesUnknown++;
    return { outcome: 'unknown', value, status };
  }

  /** One linearizable read; only answered reads enter the history. */
  async read(client: number, key: string, pinned: string | null): Promise<string | null | undefined> {
    const url = this.pick(pinned);
    if (url === null) return undefined;
    const call = this.clock();
    try {
      const r = await fetch(`${url}/v1/tenants/${key}`, {
        redirect: 'follow',
        headers: this.auth(),
        signal: AbortSignal.timeout(OP_TIMEOUT_MS),
      });
      const body = (await r.json()) as { rate?: number };
      if (r.status === 200 || r.status === 404) {
        const value = r.status === 404 || typeof body.rate !== 'number' ? null : String(body.rate);
        this.history.push({
          clientId: client,
          input: { kind: 'get', key },
          output: { value },
          call,
          return: this.clock(),
        });
        this.summary.readsOk++;
        return value;
      }
    } catch {
      // no answer: a read constrains nothing
    }
    this.summary.readsFailed++;
    return undefined;
  }

  /** Reads every register once more (after the drill), then checks the whole history. */
  async check(): Promise<{ ok: boolean; detail: string }> {
    for (const key of KEYS) {
      let v: string | null | undefined;
      const until = Date.now() + 20_000;
      do {
        v = await this.read(0, key, null);
        if (v === undefined) await sleep(200);
      } while (v === undefined && Date.now() < until);
      if (v === undefined) return { ok: false, detail: `final read of ${key} never answered within 20 s` };
    }
    const ops = this.history.map((op) => ({ ...op, return: op.return <= op.call ? op.call + 0.001 : op.return }));
    const r = checkLinearizable(kvModel, ops);
    if (r.ok === true) return { ok: true, detail: `${ops.length} operations linearizable` };
    if (r.ok === 'unknown') return { ok: false, detail: `checker gave up: ${r.reason}` };
    return { ok: false, detail: `not linearizable: ${r.reason}` };
  }

  /** Every value any answered read returned for `key` (to show a value never became visible). */
  valuesRead(): Set<string> {
    const out = new Set<string>();
    for (const op of this.history)
      if (op.input.kind === 'get' && typeof op.output?.value === 'string') out.add(op.output.value);
    return out;
  }
}
