// How the agent proves its cell to the coordinators' lease service (coordinator/lease/lease-auth.ts):
//   --tls-ca                       the CA of the coordinators' certificates: TLS to the coordinators
//   --tls-cert, --tls-key          this cell's client certificate (mutual TLS); it must name --cell
//                                  (URI urn:cellquota:cell:<id>, or the CN): checked here at start,
//                                  so a certificate for another cell fails fast instead of being
//                                  refused by every coordinator
//   --lease-token-file             a file holding this cell's bearer token (a Kubernetes Secret key),
//                                  sent as `authorization: Bearer` with every report, for deployments
//                                  where TLS is terminated in front of the coordinators
//   --tls-server-name              the name to expect in the coordinators' certificate when it is not
//                                  the host agents dial (e.g. dialled by IP)
import { readFileSync } from 'node:fs';
import * as grpc from '@grpc/grpc-js';
import { ConfigError } from '../../shared/cli-config.js';
import { pemCertNames } from '../../shared/cert-identity.js';

export interface LeaseCredentialSettings {
  readonly cell: string;
  readonly tlsCa?: string | undefined;
  readonly tlsCert?: string | undefined;
  readonly tlsKey?: string | undefined;
  readonly tlsServerName?: string | undefined;
  readonly leaseTokenFile?: string | undefined;
}

export interface LeaseCredentials {
  readonly channel: grpc.ChannelCredentials;
  readonly channelOptions: grpc.ChannelOptions;
  /** The bearer token sent with every report, or null. */
  readonly token: string | null;
  /** For the start-up log: how the agent identifies itself. */
  readonly describe: string;
  /** Set when the agent presents no identity: why coordinators that authenticate cells refuse it. */
  readonly noIdentityHint: string | undefined;
}

function readOrFail(path: string, what: string): Buffer {
  try {
    return readFileSync(path);
  } catch (err) {
    throw new ConfigError(`cannot read ${what} ${path}: ${err instanceof Error ? err.message : String(err)}`);
  }
}

/** Reads and checks the agent's lease credentials. Throws ConfigError (exit 2) on a bad setting. */
export function loadLeaseCredentials(s: LeaseCredentialSettings): LeaseCredentials {
  const ca = s.tlsCa === undefined ? null : readOrFail(s.tlsCa, '--tls-ca');
  const cert = s.tlsCert === undefined ? null : readOrFail(s.tlsCert, '--tls-cert');
  const key = s.tlsKey === undefined ? null : readOrFail(s.tlsKey, '--tls-key');
  if (cert !== null) {
    let names: string[];
    try {
      names = pemCertNames('cell', cert);
    } catch (err) {
      throw new ConfigError(
        `--tls-cert ${s.tlsCert ?? ''} is not a PEM certificate: ${err instanceof Error ? err.message : String(err)}`,
      );
    }
    if (!names.includes(s.cell)) {
      throw new ConfigError(
        `--tls-cert ${s.tlsCert ?? ''} names cell ${names.length === 0 ? '(none)' : names.join(', ')}, not ` +
          `--cell ${s.cell}: the coordinators take a cell's reports only from its own certificate`,
      );
    }
  }
  let token: string | null = null;
  if (s.leaseTokenFile !== undefined) {
    token = readOrFail(s.leaseTokenFile, '--lease-token-file').toString('utf8').trim();
    if (!/^\S{16,4096}$/.test(token))
      throw new ConfigError(`--lease-token-file ${s.leaseTokenFile}: a token is 16..4096 characters without spaces`);
  }
  const channel = ca === null ? grpc.credentials.createInsecure() : grpc.credentials.createSsl(ca, key, cert);
  const channelOptions: grpc.ChannelOptions =
    s.tlsServerName === undefined
      ? {}
      : { 'grpc.ssl_target_name_override': s.tlsServerName, 'grpc.default_authority': s.tlsServerName };
  const how = [
    cert !== null ? `client certificate for ${s.cell}` : null,
    token !== null ? 'bearer token' : null,
  ].filter((x) => x !== null);
  const describe = `${ca === null ? 'plaintext' : 'TLS'}; ${how.length === 0 ? 'no identity' : how.join(' and ')}`;
  const noIdentityHint =
    how.length === 0
      ? 'this agent presents no identity (no --tls-cert, no --lease-token-file): coordinators that authenticate ' +
        'cells refuse it (with TLS the handshake fails, the client certificate being required)'
      : undefined;
  return { channel, channelOptions, token, describe, noIdentityHint };
}
