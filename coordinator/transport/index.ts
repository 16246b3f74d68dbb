export {
  PeerTransport,
  backoffDelay,
  defaultBackoff,
  peerServerCredentials,
  peerServerOptions,
  probeAddress,
  type BackoffOptions,
  type PeerLinkStats,
  type PeerStatusHint,
  type PeerTlsOptions,
  type PeerTransportOptions,
  type PeerTransportStats,
  type ProbeOptions,
  type ProbeResult,
} from './peer-transport.js';
export {
  decodeFrame,
  defaultPeerCodecLimits,
  encodeFrame,
  validateMessage,
  MESSAGE_TYPES,
  PEER_FRAME_VERSION,
  type DecodeResult,
  type PeerCodecLimits,
} from './peer-codec.js';
export { loadRaftPeerService, findRaftPeerProto, RAFT_PEER_SERVICE, CLUSTER_ID_HEADER, NODE_ID_HEADER, type RaftPeerService } from './peer-proto.js';
