// Who a certificate names: the cell of an agent, or the replica of a coordinator.
//
// A certificate names its role by a URI SAN, `urn:cellquota:cell:<id>` or `urn:cellquota:replica:<id>`
// (scripts/make-certs.sh and deploy/ issue them so). A certificate with no `urn:cellquota:` URI names
// its subject CN for either role (certificates from an existing PKI that only sets the CN). With a
// URI present the CN is NOT taken: a replica's certificate (CN n1, urn:cellquota:replica:n1) can
// never speak for a cell named n1, nor a cell's for a replica.
//
// Used by the coordinator on the TLS peer certificate of a call (tls.PeerCertificate, from grpc-js's
// getAuthContext) and by the agent on its own certificate at start (crypto.X509Certificate).
import { X509Certificate } from 'node:crypto';

export type CertRole = 'cell' | 'replica';

export const CERT_URI_PREFIX = 'urn:cellquota:';

/** The URI SAN that names `id` in `role` (what certificates for cellquota carry). */
export function identityUri(role: CertRole, id: string): string {
  return `${CERT_URI_PREFIX}${role}:${id}`;
}

/** The URIs of a subjectaltname string as Node prints it ("DNS:a, URI:urn:..., IP Address:..."). */
function sanUris(subjectAltName: string | undefined): string[] {
  if (subjectAltName === undefined || subjectAltName === '') return [];
  return subjectAltName
    .split(/,\s*/)
    .filter((p) => p.startsWith('URI:'))
    .map((p) => p.slice(4).trim());
}

/** The ids a certificate names in `role` (usually one; none when it names the other role only). */
export function namesFromParts(
  role: CertRole,
  parts: { readonly subjectAltName?: string | undefined; readonly commonName?: string | undefined },
): string[] {
  const ours = sanUris(parts.subjectAltName).filter((u) => u.startsWith(CERT_URI_PREFIX));
  if (ours.length > 0) {
    const prefix = `${CERT_URI_PREFIX}${role}:`;
    return ours
      .filter((u) => u.startsWith(prefix))
      .map((u) => u.slice(prefix.length))
      .filter((id) => id.length > 0);
  }
  const cn = parts.commonName;
  return cn === undefined || cn === '' ? [] : [cn];
}

/** The ids a peer certificate of a TLS connection names in `role`. */
export function certNames(
  role: CertRole,
  cert:
    | {
        readonly subject?: { readonly CN?: string | string[] } | undefined;
        readonly subjectaltname?: string | undefined;
      }
    | undefined,
): string[] {
  if (cert === undefined) return [];
  const cn = cert.subject?.CN;
  return namesFromParts(role, { subjectAltName: cert.subjectaltname, commonName: Array.isArray(cn) ? cn[0] : cn });
}

/** The ids a PEM certificate names in `role` (the agent checks its own against --cell). */
export function pemCertNames(role: CertRole, pem: string | Buffer): string[] {
  const x = new X509Certificate(pem);
  const cn = /(?:^|\n)CN=([^\n]*)/.exec(x.subject)?.[1];
  return namesFromParts(role, { subjectAltName: x.subjectAltName, commonName: cn });
}
