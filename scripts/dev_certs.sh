#!/usr/bin/env bash
# Makes a certificate authority and certificates for a Chorus cluster with
# openssl: one for the coordinator, one per worker, one per admin and one per
# application client. Each lands in a directory of its own that the daemons'
# and chorusctl's --tls_dir takes (ca.pem, cert.pem, key.pem).
#
# Identities are URI subject alternative names: chorus://coordinator,
# chorus://worker/NAME, chorus://admin/NAME and chorus://client/NAME; with
# --job=JOB, the workers and clients are JOB's: chorus://job/JOB/worker/NAME
# and chorus://job/JOB/client/NAME (run it once per job on one DIR). The
# coordinator's and workers' certificates also name localhost, 127.0.0.1 and
# every --hosts entry, for clients that check the host they dial.
#
# For development and tests: the CA key is left next to the certificates.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/dev_certs.sh --out=DIR [--workers=w0,w1] [--admins=admin]
                            [--clients=app] [--hosts=10.0.0.1,node1]
                            [--days=365] [--job=JOB] [--revoke=CERT]
                            [--etcd=HOST,...]
Writes DIR/ca.pem (and DIR/ca.key) and, each with ca.pem, cert.pem, key.pem:
  DIR/coordinator/      identity chorus://coordinator
  DIR/worker-NAME/      identity chorus://worker/NAME, one per --workers name
  DIR/admin-NAME/       identity chorus://admin/NAME (ListWorkers, trace, ...)
  DIR/client-NAME/      identity chorus://client/NAME (a worker's local API
                        over TLS)
With --job=JOB, the workers and clients belong to job JOB (identities
chorus://job/JOB/worker/NAME, chorus://job/JOB/client/NAME) and land in
DIR/job-JOB/worker-NAME/ and DIR/job-JOB/client-NAME/; admins serve every
job, so --job issues none. The coordinator's certificate is made when DIR has
none, or again when --hosts is given.
An existing CA in DIR is reused, so certificates can be added later.
DIR/crl.pem is the CA's certificate revocation list (the daemons' --tls_crl),
empty at first; --revoke=CERT (e.g. DIR/client-app/cert.pem) adds CERT to it
and writes it again (a daemon given --tls_crl reads it within --tls_refresh).
--etcd=HOST,... makes a second CA for etcd, DIR/etcd/ca.pem, so that no
Chorus identity is an etcd client: DIR/etcd/server/ for the etcd members
(serving and peer certificate naming localhost, 127.0.0.1 and each HOST,
e.g. *.chorus-etcd.chorus.svc.cluster.local) and DIR/etcd/client/ for the
coordinators (--etcd_ca, --etcd_cert, --etcd_key).
EOF
}

out="" workers="" admins="admin" clients="" hosts="" days=365 job="" revoke=""
etcd_hosts=""
admins_given=false
for arg in "$@"; do
  case "$arg" in
    --out=*) out=${arg#*=} ;;
    --workers=*) workers=${arg#*=} ;;
    --admins=*) admins=${arg#*=}; admins_given=true ;;
    --clients=*) clients=${arg#*=} ;;
    --hosts=*) hosts=${arg#*=} ;;
    --days=*) days=${arg#*=} ;;
    --job=*) job=${arg#*=} ;;
    --revoke=*) revoke=${arg#*=} ;;
    --etcd=*) etcd_hosts=${arg#*=} ;;
    -h|--help) usage; exit 0 ;;
    *) echo "dev_certs.sh: unknown argument $arg" >&2; usage >&2; exit 2 ;;
  esac
done
if [ -z "$out" ]; then
  echo "dev_certs.sh: --out=DIR is required" >&2
  usage >&2
  exit 2
fi
mkdir -p "$out"
umask 077

# make_ca DIR COMMON_NAME: a CA in DIR/ca.pem and DIR/ca.key, unless there.
make_ca() {
  [ ! -s "$1/ca.pem" ] || return 0
  mkdir -p "$1"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$1/ca.key" -out "$1/ca.pem" -days "$days" \
    -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}
make_ca "$out" "Chorus development CA"

# host_sans HOST,...: localhost, 127.0.0.1 and each host as SANs.
host_sans() {
  local sans="DNS:localhost,IP:127.0.0.1" host list
  IFS=',' read -r -a list <<<"$1"
  for host in "${list[@]}"; do
    [ -n "$host" ] || continue
    if [[ "$host" =~ ^[0-9.]+$ || "$host" == *:* ]]; then
      sans+=",IP:$host"
    else
      sans+=",DNS:$host"
    fi
  done
  echo "$sans"
}
# The host names and addresses every server certificate carries.
server_sans=$(host_sans "$hosts")

# issue DIRNAME COMMON_NAME SANS [CA_DIR]: a certificate signed by the CA in
# CA_DIR (default DIR).
issue() {
  local dir="$out/$1" cn=$2 sans=$3 ca=${4:-$out}
  mkdir -p "$dir"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$dir/key.pem" -out "$dir/cert.csr" -subj "/CN=$cn" 2>/dev/null
  openssl x509 -req -in "$dir/cert.csr" -CA "$ca/ca.pem" -CAkey "$ca/ca.key" \
    -CAcreateserial -out "$dir/cert.pem" -days "$days" \
    -extfile <(printf '%s\n' "subjectAltName=$sans" \
      "extendedKeyUsage=serverAuth,clientAuth" \
      "keyUsage=critical,digitalSignature,keyEncipherment") 2>/dev/null
  rm -f "$dir/cert.csr"
  cp "$ca/ca.pem" "$dir/ca.pem"
  echo "$dir"
}

check_name() {
  if [[ ! "$1" =~ ^[A-Za-z0-9._-]+$ ]]; then
    echo "dev_certs.sh: name '$1' may only hold letters, digits, '.', '_', '-'" >&2
    exit 2
  fi
}

# --revoke alone issues nothing.
if [ -n "$revoke" ] && ! $admins_given; then admins=""; fi
job_uri="" job_dir=""
if [ -n "$job" ]; then
  check_name "$job"
  if $admins_given && [ -n "$admins" ]; then
    echo "dev_certs.sh: admins serve every job; give --admins without --job" >&2
    exit 2
  fi
  admins="" job_uri="job/$job/" job_dir="job-$job/"
  mkdir -p "$out/job-$job"
fi

# The coordinator's certificate is made once, and again for new --hosts.
if [ -n "$hosts" ] || [ ! -s "$out/coordinator/cert.pem" ]; then
  issue coordinator "chorus-coordinator" "URI:chorus://coordinator,$server_sans"
fi
for list_kind in workers admins clients; do
  IFS=',' read -r -a names <<<"${!list_kind}"
  for name in "${names[@]}"; do
    [ -n "$name" ] || continue
    check_name "$name"
    case $list_kind in
      workers) issue "${job_dir}worker-$name" "$name" \
                 "URI:chorus://${job_uri}worker/$name,DNS:$name,$server_sans" ;;
      admins) issue "admin-$name" "$name" "URI:chorus://admin/$name" ;;
      clients) issue "${job_dir}client-$name" "$name" \
                 "URI:chorus://${job_uri}client/$name" ;;
    esac
  done
done

# etcd's own CA: its members and the coordinators, no Chorus identity.
if [ -n "$etcd_hosts" ]; then
  make_ca "$out/etcd" "Chorus etcd development CA"
  issue etcd/server "chorus-etcd" "$(host_sans "$etcd_hosts")" "$out/etcd"
  issue etcd/client "chorus-coordinator" "DNS:chorus-coordinator" "$out/etcd"
fi

# The revocation list: openssl's CA database in DIR/crl-db, the list itself
# written to a temporary file and renamed, so a daemon never reads half of it.
crl_db="$out/crl-db"
if [ ! -s "$crl_db/ca.cnf" ]; then
  mkdir -p "$crl_db"
  : >"$crl_db/index.txt"
  echo 01 >"$crl_db/crlnumber"
  printf '[ca]\ndefault_ca=c\n[c]\ndatabase=%s\ndefault_md=sha256\ncrlnumber=%s\n' \
    "$crl_db/index.txt" "$crl_db/crlnumber" >"$crl_db/ca.cnf"
fi
if [ -n "$revoke" ]; then
  if [ ! -s "$revoke" ]; then
    echo "dev_certs.sh: --revoke: no certificate at $revoke" >&2
    exit 2
  fi
  serial=$(openssl x509 -in "$revoke" -noout -serial | cut -d= -f2)
  if ! grep -q "^R.*[[:space:]]$serial[[:space:]]" "$crl_db/index.txt"; then
    openssl ca -config "$crl_db/ca.cnf" -keyfile "$out/ca.key" \
      -cert "$out/ca.pem" -revoke "$revoke" 2>/dev/null
  fi
  echo "revoked $revoke (serial $serial)"
fi
if [ -n "$revoke" ] || [ ! -s "$out/crl.pem" ]; then
  openssl ca -gencrl -config "$crl_db/ca.cnf" -keyfile "$out/ca.key" \
    -cert "$out/ca.pem" -crldays "$days" -out "$out/crl.pem.tmp" 2>/dev/null
  mv "$out/crl.pem.tmp" "$out/crl.pem"
fi
