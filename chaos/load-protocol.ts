// Messages between the drill runner (chaos/load.ts) and its load process (chaos/load-process.ts).

/**
 * What one cell sent in one bin of send time, and what came back for those checks (an answer is
 * added to the bin its check was sent in, whenever it arrives). Counting by send time keeps the
 * bound check exact whatever either process's scheduling does: a check sent at s and answered at a
 * was decided within [s, a].
 */
export interface LoadBin {
  sent: number;
  admitted: number;
  refused: number;
  /** Checks that failed (no agent, transport or gRPC error): Envoy would apply its failure mode. */
  errors: number;
  /** Answers carrying x-ratelimit-degraded (floors, static shares or fail-open). */
  degraded: number;
  /** OK answers given without a decision (x-ratelimit-fail-open: the agent was overloaded). Not in
   * `admitted`: they are held to the bound's fail-open term apart (chaos/verdicts.ts). */
  failOpen: number;
  /** Decision latency of every answer in the bin, µs. */
  latenciesUs: number[];
  /** The longest latency of an admitted answer, µs (how late a decision may have been made). */
  maxAdmittedLatencyUs: number;
}

/** Changes to one bin since the last report: `index` = floor(epoch ms of the send / binMs). */
export interface BinUpdate {
  readonly index: number;
  readonly cell: number;
  readonly delta: LoadBin;
}

export type LoadCommand =
  | {
      readonly kind: 'start';
      readonly sockets: readonly string[];
      readonly rates: readonly number[];
      readonly tenant: string;
      readonly domain: string;
      readonly binMs: number;
    }
  | { readonly kind: 'rates'; readonly rates: readonly number[] }
  | { readonly kind: 'stop' };

export type LoadMessage =
  | { readonly kind: 'started' }
  | { readonly kind: 'bins'; readonly binMs: number; readonly updates: readonly BinUpdate[] }
  | { readonly kind: 'stopped' };
