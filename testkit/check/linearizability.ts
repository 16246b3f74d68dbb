// Linearizability checker: the Wing & Gong backtracking search with Lowe's memoization, run
// separately on each partition of the history (P-compositionality: a history is linearizable iff
// every independent part of it is, e.g. every key of a key-value store).
//
// Per partition, each operation contributes a call event and a return event. The events are sorted
// by time into a doubly linked list. At equal times calls sort before returns, so an operation that
// returns at t and one called at t are treated as concurrent (either order is allowed): with coarse
// clocks (ticks, ms) we cannot tell which really came first, and we must not report false
// violations. The search walks the list from its head:
//   - at a call event, try to linearize that operation now: step the model from the current state;
//     if the model accepts the operation's output and (set of linearized ops, new state) is not in
//     the cache, push (event, old state) on a stack, unlink the call and return events from the list
//     and restart from the head;
//   - at a return event, the operation it belongs to had to be linearized before this point and was
//     not: backtrack by popping the stack, relinking the popped operation's events and carrying on
//     with the event after its call. An empty stack means no linearization exists.
// The search succeeds when the list is empty. The cache (Lowe) holds every (bitset of linearized
// ops, model state key) reached so far: reaching one again cannot lead anywhere new, which is what
// makes the search practical.
//
// Unknown outcomes: an operation whose return time is Infinity (e.g. a write that timed out) may
// take effect at any time after its call, or never. Its return events sort after every finite
// event, so reaching one means every operation with a known outcome has been linearized: the
// history is accepted and the remaining unknown-outcome operations are taken never to have happened.
// The model still checks their output if it linearizes them earlier, so give such operations an
// output the model accepts whatever it is (a put's); an unknown-outcome read constrains nothing and
// is best left out of the history.
//
// Unknown outcomes are what makes a search explode: each one stays pending to the end, so every
// subset of them that might have taken effect is a different (bitset, state) pair to the cache, and
// a drill where the coordinators are down for a while leaves hundreds of them on a few keys. The
// key-value model therefore drops, before the search, every unknown-outcome put whose value no get
// of its key returned. This changes no verdict: in any linearization that contains such a put, the
// operations between it and the next put of that key are gets, which would have returned its value,
// so there are none, and the put can be taken out (taking it never to have happened is always
// allowed for an unknown outcome). The writer should make values unique (a fresh value per write),
// so that what remains are the unknown puts some read really saw.

export interface Operation<Input, Output> {
  clientId: number | string;
  input: Input;
  output: Output;
  /** Invocation time. */
  call: number;
  /** Response time, > call; Infinity when the outcome is unknown. */
  return: number;
}

export interface Model<State, Input, Output> {
  init(): State;
  /** Applies input to state; ok is false when the model could not have produced output. */
  step(state: State, input: Input, output: Output): { ok: boolean; state: State };
  /** A string equal for two states iff they are equivalent (used for memoization). */
  key(state: State): string;
  /** Splits the history into independent parts, each checked on its own. */
  partition?(ops: Operation<Input, Output>[]): Operation<Input, Output>[][];
  describe?(input: Input, output: Output): string;
}

export type CheckResult<Input, Output> =
  | { ok: true }
  | { ok: false; partition: number; reason: string; longestPrefix: Operation<Input, Output>[] }
  | { ok: 'unknown'; reason: string };

export interface CheckOptions {
  /** Search steps allowed per partition before giving up with 'unknown' (default 5 million). */
  maxSteps?: number;
}

const DEFAULT_MAX_STEPS = 5_000_000;
const NIL = -1;

type PartitionResult<Input, Output> =
  | { ok: true }
  | { ok: false; reason: string; longestPrefix: Operation<Input, Output>[] }
  | { ok: 'unknown'; reason: string };

export function checkLinearizable<State, Input, Output>(
  model: Model<State, Input, Output>,
  ops: Operation<Input, Output>[],
  opts: CheckOptions = {},
): CheckResult<Input, Output> {
  const maxSteps = opts.maxSteps ?? DEFAULT_MAX_STEPS;
  for (const [i, op] of ops.entries()) {
    if (!Number.isFinite(op.call) || Number.isNaN(op.return) || !(op.call < op.return)) {
      throw new RangeError(`operation ${i}: need a finite call time < return time, got [${op.call}, ${op.return}]`);
    }
  }
  const parts = model.partition ? model.partition(ops) : [ops];
  let unknown: { ok: 'unknown'; reason: string } | undefined;
  for (const [p, part] of parts.entries()) {
    const r = checkPartition(model, part, maxSteps);
    if (r.ok === false)
      return { ok: false, partition: p, reason: `partition ${p}: ${r.reason}`, longestPrefix: r.longestPrefix };
    if (r.ok === 'unknown') unknown ??= { ok: 'unknown', reason: `partition ${p}: ${r.reason}` };
  }
  return unknown ?? { ok: true };
}

function describeOp<State, Input, Output>(model: Model<State, Input, Output>, op: Operation<Input, Output>): string {
  const what = model.describe
    ? model.describe(op.input, op.output)
    : `${JSON.stringify(op.input)} -> ${JSON.stringify(op.output)}`;
  return `client ${op.clientId}: ${what} [${op.call}, ${op.return}]`;
}

function checkPartition<State, Input, Output>(
  model: Model<State, Input, Output>,
  ops: Operation<Input, Output>[],
  maxSteps: number,
): PartitionResult<Input, Output> {
  const n = ops.length;
  if (n === 0) return { ok: true };

  // Events 0..n-1 are calls, n..2n-1 returns (event e belongs to op e % n). Node 2n is the head.
  const events: number[] = [];
  for (let e = 0; e < 2 * n; e++) events.push(e);
  const time = (e: number): number => {
    const op = ops[e % n] as Operation<Input, Output>;
    return e < n ? op.call : op.return;
  };
  events.sort((a, b) => time(a) - time(b) || (a < n ? 0 : 1) - (b < n ? 0 : 1) || a - b);
  const head = 2 * n;
  const next = new Int32Array(2 * n + 1).fill(NIL);
  const prev = new Int32Array(2 * n + 1).fill(NIL);
  let last = head;
  for (const e of events) {
    next[last] = e;
    prev[e] = last;
    last = e;
  }
  const unlink = (e: number): void => {
    const p = prev[e] as number;
    const x = next[e] as number;
    next[p] = x;
    if (x !== NIL) prev[x] = p;
  };
  const relink = (e: number): void => {
    const p = prev[e] as number;
    const x = next[e] as number;
    next[p] = e;
    if (x !== NIL) prev[x] = e;
  };

  // Bitset of linearized ops, 16 bits per word so that it reads directly as a string key.
  const bits = new Uint16Array(Math.ceil(n / 16));
  const flip = (i: number): void => {
    bits[i >>> 4] = (bits[i >>> 4] as number) ^ (1 << (i & 15));
  };
  const bitsKey = (): string => {
    let s = '';
    for (let i = 0; i < bits.length; i += 4096) s += String.fromCharCode(...bits.subarray(i, i + 4096));
    return s;
  };
  // bitsKey() has a fixed length per partition, so concatenating the state key is unambiguous.
  const cache = new Set<string>();

  const stack: { call: number; state: State }[] = [];
  let state = model.init();
  let longestPrefix: Operation<Input, Output>[] = [];
  let blocker: { op: Operation<Input, Output>; stateKey: string } | undefined;
  let steps = 0;
  let e = next[head] as number;
  while (e !== NIL) {
    if (++steps > maxSteps) {
      return {
        ok: 'unknown',
        reason: `gave up after ${maxSteps} search steps (${n} operations, ${longestPrefix.length} linearized at best)`,
      };
    }
    if (e < n) {
      const op = ops[e] as Operation<Input, Output>;
      const r = model.step(state, op.input, op.output);
      if (r.ok) {
        flip(e);
        const key = bitsKey() + model.key(r.state);
        if (!cache.has(key)) {
          cache.add(key);
          stack.push({ call: e, state });
          state = r.state;
          unlink(e);
          unlink(e + n);
          e = next[head] as number;
          continue;
        }
        flip(e);
      }
      e = next[e] as number;
    } else {
      if (time(e) === Infinity) return { ok: true }; // only unknown-outcome ops are left
      if (blocker === undefined || stack.length > longestPrefix.length) {
        longestPrefix = stack.map((s) => ops[s.call] as Operation<Input, Output>);
        blocker = { op: ops[e - n] as Operation<Input, Output>, stateKey: model.key(state) };
      }
      const top = stack.pop();
      if (top === undefined) break;
      state = top.state;
      flip(top.call);
      relink(top.call + n);
      relink(top.call);
      e = next[top.call] as number;
    }
  }
  if (next[head] === NIL) return { ok: true };
  const b = blocker as { op: Operation<Input, Output>; stateKey: string };
  return {
    ok: false,
    reason:
      `not linearizable: at best ${longestPrefix.length} of ${n} operations linearize, ` +
      `reaching state ${b.stateKey}; then ${describeOp(model, b.op)} cannot be linearized before it returns ` +
      `(nor can any operation concurrent with it)`,
    longestPrefix,
  };
}

// ---------------------------------------------------------------------------------------------
// Key-value register model.

export type KvInput = { kind: 'put'; key: string; value: string } | { kind: 'get'; key: string };
/** Gets carry `value` (null = absent); a put's output is not checked. */
export type KvOutput = { readonly value?: string | null; readonly [extra: string]: unknown } | null | undefined;
/** Map from key to value. After partitioning by key it holds at most one entry. */
export type KvState = ReadonlyMap<string, string>;

export const kvModel: Model<KvState, KvInput, KvOutput> = {
  init: () => new Map<string, string>(),
  step(state, input, output) {
    if (input.kind === 'put') {
      return { ok: true, state: new Map(state).set(input.key, input.value) };
    }
    const seen = output?.value;
    if (seen === undefined) throw new TypeError(`get ${input.key}: output must carry a value (null = absent)`);
    return { ok: (state.get(input.key) ?? null) === seen, state };
  },
  key(state) {
    if (state.size <= 1) return JSON.stringify([...state]);
    return JSON.stringify([...state].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
  },
  partition(ops) {
    const byKey = new Map<string, Operation<KvInput, KvOutput>[]>();
    for (const op of ops) {
      const list = byKey.get(op.input.key);
      if (list) list.push(op);
      else byKey.set(op.input.key, [op]);
    }
    return [...byKey.values()].map(withoutUnseenUnknownPuts);
  },
  describe(input, output) {
    if (input.kind === 'put') return `put(${JSON.stringify(input.key)}, ${JSON.stringify(input.value)})`;
    return `get(${JSON.stringify(input.key)}) -> ${JSON.stringify(output?.value ?? null)}`;
  },
};

/** The key's operations without the unknown-outcome puts whose value no get returned (see the header). */
function withoutUnseenUnknownPuts(ops: Operation<KvInput, KvOutput>[]): Operation<KvInput, KvOutput>[] {
  const seen = new Set<string>();
  for (const op of ops) {
    if (op.input.kind === 'get' && typeof op.output?.value === 'string') seen.add(op.output.value);
  }
  return ops.filter((op) => !(op.input.kind === 'put' && op.return === Infinity && !seen.has(op.input.value)));
}
