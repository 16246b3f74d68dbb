export * from './raft-types.js';
export { RaftNode, type RaftStatus } from './raft-node.js';
export { ClientSessions, type SessionCheck, type SessionEntry } from './raft-sessions.js';
export { RaftInvariantError } from './raft-assert.js';
export {
  encodeConfChange,
  decodeConfChange,
  decodeConfEntry,
  bootstrapEntry,
  validateConfChange,
  applyConfChangeTo,
} from './raft-conf.js';
