export {
  allocateRound,
  allocateRoundColumns,
  AllocatorInputError,
  AllocatorInvariantError,
  AllocatorWorkspace,
  DEFAULT_TUNING,
  GrantColumns,
  type AllocatorCell,
  type AllocatorColumnsOutput,
  type AllocatorInput,
  type AllocatorOutput,
  type AllocatorQuota,
  type AllocatorSlices,
  type AllocatorStats,
  type AllocatorTuning,
} from './allocator.js';
export {
  AllocatorInputBuffers,
  AllocatorInputBuilder,
  allocatorCells,
  type QuotaStateOptions,
  type RoundParams,
  type SliceInput,
} from './allocator-input.js';
export { waterFill, WaterFillScratch } from './water-fill.js';
export { float32Above, float32Below, roundTowards } from './grant-rounding.js';
