// Invariant checks inside the Raft core. A broken invariant is a bug: it throws loudly and the
// node stops, rather than continuing on a state that may violate safety.
import { CellquotaError } from '../../shared/errors.js';

export class RaftInvariantError extends CellquotaError {
  readonly code = 'RAFT_INVARIANT';
  constructor(message: string) {
    super(`raft invariant violated: ${message}`);
    this.name = 'RaftInvariantError';
  }
}

export function assert(condition: unknown, message: string): asserts condition {
  if (!condition) throw new RaftInvariantError(message);
}
