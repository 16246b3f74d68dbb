// A cell holding more slices than one lease answer carries (issue 12: an agent that has seen
// 1,000,000 tenants held no grant, its full answer being one message too large to build within its
// deadline). The real LeaseService (over a real Ledger applied at once, its rounds on a timer) and
// the real LeaseClient over gRPC: every answer carries at most MAX_ANSWER_GRANTS grants; a restarted
// agent gets its cell's whole picture in pages and holds every grant again, also when one page of
// the picture is lost on the way; an agent without pages still gets it in one answer.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as grpc from '@grpc/grpc-js';
import { pino } from 'pino';
import { LeaseService, MAX_ANSWER_GRANTS } from '../../../coordinator/lease/lease-service.js';
import { GrpcLeaseTransport, LeaseClient } from '../../../cell-agent/lease/lease-client.js';
import type { LeaseCallResult, LeaseTransport } from '../../../cell-agent/lease/lease-client.js';
import type { OverrideEntry } from '../../../cell-agent/lease/quota-overrides.js';
import type { ReportRequestMessage } from '../../../shared/lease-proto.js';
import { waitFor } from '../../../testkit/wait.js';
import { InstantBackend, putGoldTenants, serveLease } from '../../../testkit/instant-lease-backend.js';

const TENANTS = Math.round(MAX_ANSWER_GRANTS * 2.4);

/** The gRPC transport, recording every answer's grant count; `lose(n)` makes the n-th answer from now arrive too late. */
class RecordingTransport implements LeaseTransport {
  readonly grantsPerAnswer: number[] = [];
  readonly requests: ReportRequestMessage[] = [];
  private loseAt = -1;
  constructor(private readonly inner: LeaseTransport) {}
  lose(nth: number): void {
    this.loseAt = this.grantsPerAnswer.length + nth;
  }
  async report(address: string, req: ReportRequestMessage, deadlineMs: number): Promise<LeaseCallResult> {
    this.requests.push(req);
    const r = await this.inner.report(address, req, deadlineMs);
    if (!('res' in r)) return r;
    this.grantsPerAnswer.push(r.res.grants.length);
    if (this.grantsPerAnswer.length - 1 === this.loseAt)
      return { err: { code: grpc.status.DEADLINE_EXCEEDED, details: 'lost by the test' } };
    return r;
  }
  close(): void {
    this.inner.close();
  }
}

function agent(
  address: string,
  keys: readonly string[],
  paged: boolean,
): { client: LeaseClient; transport: RecordingTransport; table: Map<string, OverrideEntry> } {
  const table = new Map<string, OverrideEntry>();
  const grpcTransport = new GrpcLeaseTransport();
  const inner: LeaseTransport = paged
    ? grpcTransport
    : {
        // An agent of before pages: the same report without paged_answers.
        report: (a, req, d) => grpcTransport.report(a, { ...req, pagedAnswers: false }, d),
        close: () => grpcTransport.close(),
      };
  const transport = new RecordingTransport(inner);
  const client = new LeaseClient({
    cellId: 'eu',
    coordinators: [address],
    logger: pino({ level: 'silent' }),
    velocity: () => keys.map((key) => ({ key, allowed: 0, refused: 1 })),
    deadlineMs: 20_000, // a loaded machine must not lapse the lease: this is about pages, not timing
    transport,
    onOverrides: (entries) => {
      for (const e of entries) {
        if ('remove' in e) table.delete(e.key);
        else table.set(e.key, e);
      }
    },
  });
  return { client, transport, table };
}

void test(`lease answers: ${TENANTS} slices of one cell travel in pages of at most ${MAX_ANSWER_GRANTS} grants; a restarted agent holds every grant again, also when a page is lost`, async () => {
  const backend = new InstantBackend();
  const keys = await putGoldTenants(backend, TENANTS);
  const service = new LeaseService({
    backend,
    logger: pino({ level: 'silent' }),
    roundMs: 20,
    expireEveryMs: 1e9,
    leaseTtlMs: 60_000,
  });
  const { address, server } = await serveLease(service);
  const agents: LeaseClient[] = [];
  try {
    // The first agent asks for every key (its refusals): every key is granted, in pages.
    const a = agent(address, keys, true);
    agents.push(a.client);
    a.client.start();
    await waitFor('the first agent holds every grant', () => a.client.status().grants === TENANTS, {
      timeoutMs: 90_000,
      everyMs: 20,
      context: () =>
        `${JSON.stringify(a.client.status())} answers ${a.transport.grantsPerAnswer.join(',')} velocity ${a.transport.requests.map((r) => r.velocity.length).join(',')} stats ${JSON.stringify(service.stats)}`,
    });
    assert.ok(Math.max(...a.transport.grantsPerAnswer) <= MAX_ANSWER_GRANTS, a.transport.grantsPerAnswer.join(','));
    a.client.stop();

    // A restarted agent (a new incarnation, no demand yet): the full picture in pages; one page lost.
    const b = agent(address, [], true);
    agents.push(b.client);
    b.transport.lose(1);
    b.client.start();
    await waitFor('the restarted agent holds every grant', () => b.client.status().grants === TENANTS, {
      timeoutMs: 90_000,
      everyMs: 20,
      context: () =>
        `${JSON.stringify(b.client.status())} answers ${b.transport.grantsPerAnswer.join(',')} wantFull ${b.transport.requests.map((r) => r.wantFull).join(',')}`,
    });
    assert.ok(b.transport.grantsPerAnswer.length >= 3, 'several pages');
    assert.ok(Math.max(...b.transport.grantsPerAnswer) <= MAX_ANSWER_GRANTS, b.transport.grantsPerAnswer.join(','));
    for (const k of keys) assert.equal((b.table.get(k) as { leased?: boolean } | undefined)?.leased, true, k);
    b.client.stop();

    // An agent without pages: its whole picture in one answer, as before.
    const c = agent(address, [], false);
    agents.push(c.client);
    c.client.start();
    await waitFor('the agent without pages holds every grant', () => c.client.status().grants === TENANTS, {
      timeoutMs: 90_000,
      everyMs: 20,
    });
    assert.equal(c.transport.grantsPerAnswer[0], TENANTS, 'one answer');
  } finally {
    for (const x of agents) x.stop();
    service.stop();
    server.forceShutdown();
  }
});
