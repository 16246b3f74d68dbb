// Loads proto/raft-peer.proto once and exposes the RaftPeer service definition with typed messages.
// Shared by the transport, its tests and (later) anything that wants to Probe a coordinator.

import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

export const RAFT_PEER_SERVICE = 'cellquota.raft.v1.RaftPeer';

/** Metadata keys carried on the Stream call (request) and its response headers. */
export const CLUSTER_ID_HEADER = 'cellquota-cluster-id';
export const NODE_ID_HEADER = 'cellquota-node-id';
/**
 * The newest Raft command format the sender's build reads (a decimal integer), carried both ways so
 * a leader writes a newer entry format only once every replica declared it reads it. A replica that
 * sends no such header (a build from before it) reads format 1 only.
 */
export const COMMAND_FORMAT_HEADER = 'cellquota-command-format';

export interface FrameMessage {
  data: Uint8Array;
}
export interface StreamSummaryMessage {
  framesReceived: number;
  messagesReceived: number;
}
export interface ProbeRequestMessage {
  clusterId: string;
  nodeId: string;
}
export interface ProbeResponseMessage {
  nodeId: string;
  clusterId: string;
  termHint: number;
  leaderHint: string;
}

export interface RaftPeerService {
  readonly definition: grpc.ServiceDefinition;
  readonly stream: grpc.MethodDefinition<FrameMessage, StreamSummaryMessage>;
  readonly probe: grpc.MethodDefinition<ProbeRequestMessage, ProbeResponseMessage>;
}

/** Finds proto/raft-peer.proto walking up from this module (works from the sources and from dist/). */
export function findRaftPeerProto(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 6; i++) {
    const candidate = join(dir, 'proto', 'raft-peer.proto');
    if (existsSync(candidate)) return candidate;
    const parent = dirname(dir);
    if (parent === dir) break;
    dir = parent;
  }
  throw new Error('proto/raft-peer.proto not found above ' + dirname(fileURLToPath(import.meta.url)));
}

let cached: RaftPeerService | undefined;

export function loadRaftPeerService(protoPath: string = findRaftPeerProto()): RaftPeerService {
  if (cached !== undefined) return cached;
  const pkg = protoLoader.loadSync(protoPath, {
    keepCase: false,
    longs: Number,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const def = pkg[RAFT_PEER_SERVICE];
  if (def === undefined || !('Stream' in def) || !('Probe' in def))
    throw new Error(`${protoPath} does not define ${RAFT_PEER_SERVICE}`);
  const definition = def as grpc.ServiceDefinition;
  cached = {
    definition,
    stream: definition['Stream'] as grpc.MethodDefinition<FrameMessage, StreamSummaryMessage>,
    probe: definition['Probe'] as grpc.MethodDefinition<ProbeRequestMessage, ProbeResponseMessage>,
  };
  return cached;
}
