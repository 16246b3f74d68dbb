// Single-server membership changes: validation, application and the entry encoding. One change at
// a time keeps any majority of the old configuration overlapping any majority of the new one.
import { EntryKind, type BootstrapConf, type ConfChange, type ConfState, type Entry } from './raft-types.js';

const encoder = new TextEncoder();
const decoder = new TextDecoder();

export function encodeConfChange(cc: ConfChange): Uint8Array {
  return encoder.encode(JSON.stringify(cc));
}

/** The identical first entry every founding member writes (see BootstrapConf). */
export function bootstrapEntry(voters: readonly string[]): Entry {
  const conf: BootstrapConf = { op: 'bootstrap', voters: [...new Set(voters)].sort() };
  return { term: 1, index: 1, kind: EntryKind.Conf, data: encoder.encode(JSON.stringify(conf)) };
}

export function decodeConfEntry(data: Uint8Array): ConfChange | BootstrapConf {
  const v = JSON.parse(decoder.decode(data)) as Partial<BootstrapConf>;
  if (v.op === 'bootstrap') {
    if (!Array.isArray(v.voters) || v.voters.some((x) => typeof x !== 'string'))
      throw new Error(`malformed bootstrap entry: ${decoder.decode(data)}`);
    return { op: 'bootstrap', voters: v.voters };
  }
  return decodeConfChange(data);
}

export function decodeConfChange(data: Uint8Array): ConfChange {
  const v = JSON.parse(decoder.decode(data)) as Partial<ConfChange>;
  if ((v.op !== 'add-learner' && v.op !== 'promote' && v.op !== 'remove') || typeof v.node !== 'string') {
    throw new Error(`malformed membership change entry: ${decoder.decode(data)}`);
  }
  return v.context === undefined ? { op: v.op, node: v.node } : { op: v.op, node: v.node, context: v.context };
}

/** Null if the change may be applied to conf, else why not. */
export function validateConfChange(conf: ConfState, cc: ConfChange): string | null {
  const isVoter = conf.voters.includes(cc.node);
  const isLearner = conf.learners.includes(cc.node);
  if (cc.node.length === 0) return 'node id must not be empty';
  switch (cc.op) {
    case 'add-learner':
      if (isVoter || isLearner) return `${cc.node} is already a member`;
      return null;
    case 'promote':
      if (!isLearner) return `${cc.node} is not a learner (add it as a learner first and let it catch up)`;
      return null;
    case 'remove':
      if (!isVoter && !isLearner) return `${cc.node} is not a member`;
      if (isVoter && conf.voters.length === 1) return 'cannot remove the last voter';
      return null;
  }
}

export function applyConfChangeTo(conf: ConfState, cc: ConfChange | BootstrapConf): ConfState {
  if (cc.op === 'bootstrap') return { voters: [...cc.voters].sort(), learners: [] };
  const voters = new Set(conf.voters);
  const learners = new Set(conf.learners);
  switch (cc.op) {
    case 'add-learner':
      if (!voters.has(cc.node)) learners.add(cc.node);
      break;
    case 'promote':
      learners.delete(cc.node);
      voters.add(cc.node);
      break;
    case 'remove':
      voters.delete(cc.node);
      learners.delete(cc.node);
      break;
  }
  return { voters: [...voters].sort(), learners: [...learners].sort() };
}
