export { RaftStorage, type RaftStorageOptions } from './raft-storage.js';
export {
  LevelRaftStorage,
  type LevelRaftStorageOptions,
  type ReadyToPersist,
  type StorageLogger,
  type StorageMeta,
  type StorageRepair,
  type StorageStats,
  type SyncStat,
} from './raft-storage-level.js';
export { StorageCorruptionError, StorageFormatError, StorageIdentityError } from './storage-errors.js';
