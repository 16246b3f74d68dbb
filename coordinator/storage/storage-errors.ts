// Errors the durable Raft storage throws. Each carries a stable `code` for callers and logs.
import { CellquotaError } from '../../shared/errors.js';

/**
 * The data directory holds something that cannot be a state this storage wrote: a bad checksum or
 * a gap at or below the commit index, an unreadable hard state, snapshot or identity record, an
 * unknown key. Never repaired automatically: committed data may be lost, so the node must not run
 * on it (an operator wipes the directory and the node rejoins as a new incarnation).
 */
export class StorageCorruptionError extends CellquotaError {
  readonly code = 'STORAGE_CORRUPT' as const;
  /** The key at fault, as described by describeKey (e.g. 'hard', 'snap', 'log/42'). */
  readonly key: string;
  readonly dir: string;

  constructor(dir: string, key: string, reason: string, options?: ErrorOptions) {
    super(`raft storage at ${dir} is corrupt: key ${key}: ${reason}`, options);
    this.name = 'StorageCorruptionError';
    this.key = key;
    this.dir = dir;
  }
}

/** The data directory belongs to another node or cluster: refusing to open it. */
export class StorageIdentityError extends CellquotaError {
  readonly code = 'STORAGE_IDENTITY_MISMATCH' as const;
  readonly dir: string;

  constructor(dir: string, message: string) {
    super(`raft storage at ${dir}: ${message}`);
    this.name = 'StorageIdentityError';
    this.dir = dir;
  }
}

/** The data directory was written in a storage format this code does not know. */
export class StorageFormatError extends CellquotaError {
  readonly code = 'STORAGE_FORMAT' as const;
  readonly dir: string;

  constructor(dir: string, message: string) {
    super(`raft storage at ${dir}: ${message}`);
    this.name = 'StorageFormatError';
    this.dir = dir;
  }
}
