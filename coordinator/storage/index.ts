export { RaftStorage, type RaftStorageOptions } from './raft-storage.js';
export { LevelRaftStorage } from './raft-storage-level.js';
export type { ReadyToPersist } from './storage-checks.js';
export type {
  LevelRaftStorageOptions,
  StorageLogger,
  StorageMeta,
  StorageRepair,
  StorageStats,
  SyncStat,
} from './storage-base.js';
export { StorageCorruptionError, StorageFormatError, StorageIdentityError } from './storage-errors.js';
