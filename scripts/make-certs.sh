#!/bin/sh
# Makes a CA and the certificates of a cellquota deployment, for a local run or a test (openssl).
#
#   scripts/make-certs.sh DIR [--replicas n1,n2,n3] [--cells cell-a,cell-b] [--hosts 127.0.0.1,localhost] [--days 30]
#
# Writes into DIR (created if missing; an existing ca.pem/ca.key there is reused, so more
# certificates can be added later):
#   ca.pem, ca.key                     the CA (EC P-256)
#   replica-<id>.pem, replica-<id>.key each coordinator replica: URI SAN urn:cellquota:replica:<id>,
#                                      CN <id>, the --hosts as DNS/IP SANs; server and client auth
#                                      (it serves the peer and lease ports and dials its peers)
#   cell-<id>.pem, cell-<id>.key       each cell's agent: URI SAN urn:cellquota:cell:<id>, CN <id>;
#                                      client auth only
# The coordinators take --tls-ca ca.pem --tls-cert replica-<id>.pem --tls-key replica-<id>.key, the
# agents --tls-ca ca.pem --tls-cert cell-<id>.pem --tls-key cell-<id>.key. Keys are written 0600.
# For production use your PKI (cert-manager in deploy/): any CA works if the certificates carry the
# same URI SANs (or only the CN).
set -eu

usage() { echo "usage: $0 DIR [--replicas n1,n2,n3] [--cells cell-a,cell-b] [--hosts 127.0.0.1,localhost] [--days 30]" >&2; exit 2; }
[ $# -ge 1 ] || usage
dir=$1; shift
replicas=n1,n2,n3
cells=cell-a,cell-b
hosts=127.0.0.1,localhost
days=30
while [ $# -gt 0 ]; do
  case $1 in
    --replicas) [ $# -ge 2 ] || usage; replicas=$2; shift 2 ;;
    --cells) [ $# -ge 2 ] || usage; cells=$2; shift 2 ;;
    --hosts) [ $# -ge 2 ] || usage; hosts=$2; shift 2 ;;
    --days) [ $# -ge 2 ] || usage; days=$2; shift 2 ;;
    *) usage ;;
  esac
done
command -v openssl >/dev/null 2>&1 || { echo "$0: openssl is not on PATH (Debian: apt-get install openssl)" >&2; exit 1; }
valid_id() { printf '%s' "$1" | grep -Eq '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'; }

mkdir -p "$dir"
umask 077
cd "$dir"
if [ ! -f ca.pem ] || [ ! -f ca.key ]; then
  openssl ecparam -name prime256v1 -genkey -noout -out ca.key
  openssl req -x509 -new -key ca.key -sha256 -days "$days" -subj "/CN=cellquota local CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -out ca.pem
fi

san_hosts=""
old_ifs=$IFS; IFS=,
for h in $hosts; do
  if printf '%s' "$h" | grep -Eq '^[0-9.]+$|:'; then san_hosts="$san_hosts,IP:$h"; else san_hosts="$san_hosts,DNS:$h"; fi
done
IFS=$old_ifs

# leaf ROLE ID EKU EXTRA_SANS
leaf() {
  role=$1 id=$2 eku=$3 extra=$4
  valid_id "$id" || { echo "$0: '$id' is not a valid $role id" >&2; exit 2; }
  name="$role-$id"
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=%s\nsubjectAltName=URI:urn:cellquota:%s:%s%s\n' "$eku" "$role" "$id" "$extra" > "$name.ext"
  openssl ecparam -name prime256v1 -genkey -noout -out "$name.key"
  openssl req -new -key "$name.key" -subj "/CN=$id" -out "$name.csr"
  openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days "$days" -sha256 -extfile "$name.ext" -out "$name.pem" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}

IFS=,
for r in $replicas; do IFS=$old_ifs; leaf replica "$r" serverAuth,clientAuth "$san_hosts"; IFS=,; done
for c in $cells; do IFS=$old_ifs; leaf cell "$c" clientAuth ""; IFS=,; done
IFS=$old_ifs
chmod 0644 ca.pem ./*.pem
echo "certificates in $(pwd): ca.pem, replica-{$replicas}.pem, cell-{$cells}.pem (keys beside them)"
