#!/usr/bin/env bash
# Creates the mutual-TLS key material for a Cohort deployment on Kubernetes and writes it as two
# Secret manifests (cohort-tls-shards, cohort-tls-clients) into one YAML file of mode 0600.
#
#   deploy/k8s/make-secrets.sh [--shards S] [--clients N] [--namespace NS] [--pki DIR] --out FILE
#
#   --shards S      certificates shard-0 .. shard-(S-1)   (default 2; keep equal to the StatefulSet)
#   --clients N     certificates client-0 .. client-(N-1) (default 4; keep equal to the Job)
#   --namespace NS  namespace of the Secrets (default cohort)
#   --pki DIR       keep the CA (ca.pem, ca.key) in DIR, mode 0700, and reuse it when it exists,
#                   so that certificates can be added later; without it a throw-away CA is made
#                   and its key destroyed on exit
#   --out FILE      the Secret manifests (required; never stdout, the file holds private keys)
#
# Environment: COHORT_KEYGEN (default: cohort-keygen on PATH, else build/bin/cohort-keygen),
#              KUBECTL (default: kubectl).
# Key material is never printed: cohort-keygen and kubectl write into files only, node keys live in
# a private temporary directory removed on exit, and the CA key never enters the Secrets.
# Then:  kubectl apply -f FILE && shred -u FILE   (or keep FILE in a secret store, not in git)
set -euo pipefail
umask 077

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
die() { echo "make-secrets.sh: error: $*" >&2; exit 1; }

shards=2
clients=4
namespace=cohort
pki=""
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --shards) shards="${2:?--shards needs a value}"; shift 2 ;;
    --shards=*) shards="${1#*=}"; shift ;;
    --clients) clients="${2:?--clients needs a value}"; shift 2 ;;
    --clients=*) clients="${1#*=}"; shift ;;
    --namespace) namespace="${2:?--namespace needs a value}"; shift 2 ;;
    --namespace=*) namespace="${1#*=}"; shift ;;
    --pki) pki="${2:?--pki needs a value}"; shift 2 ;;
    --pki=*) pki="${1#*=}"; shift ;;
    --out) out="${2:?--out needs a value}"; shift 2 ;;
    --out=*) out="${1#*=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

case "$shards" in ''|*[!0-9]*|0) die "--shards must be a positive integer, got '$shards'" ;; esac
case "$clients" in ''|*[!0-9]*|0) die "--clients must be a positive integer, got '$clients'" ;; esac
[ -n "$out" ] || die "--out FILE is required (the manifests hold private keys, so never stdout)"
case "$out" in -|/dev/stdout|/dev/stderr|/dev/tty) die "--out must be a regular file, not '$out'" ;; esac

script_dir="$(cd "$(dirname "$0")" && pwd)"
keygen="${COHORT_KEYGEN:-}"
if [ -z "$keygen" ]; then
  if command -v cohort-keygen >/dev/null 2>&1; then
    keygen="$(command -v cohort-keygen)"
  elif [ -x "$script_dir/../../build/bin/cohort-keygen" ]; then
    keygen="$script_dir/../../build/bin/cohort-keygen"
  else
    die "cohort-keygen not found: put it on PATH or set COHORT_KEYGEN=/path/to/cohort-keygen"
  fi
fi
[ -x "$keygen" ] || die "COHORT_KEYGEN '$keygen' is not an executable file"
kubectl="${KUBECTL:-kubectl}"
command -v "$kubectl" >/dev/null 2>&1 || die "kubectl not found (set KUBECTL=/path/to/kubectl)"

work="$(mktemp -d "${TMPDIR:-/tmp}/cohort-secrets.XXXXXX")"
chmod 700 "$work"
tmp_out=""
cleanup() { rm -rf "$work"; if [ -n "$tmp_out" ]; then rm -f "$tmp_out"; fi; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# Runs cohort-keygen; its stdout names files (never their contents) and is discarded.
keygen_quiet() { "$keygen" "$@" >/dev/null; }

if [ -n "$pki" ]; then
  mkdir -p "$pki"
  chmod 700 "$pki"
  if [ ! -f "$pki/ca.key" ]; then
    keygen_quiet ca --out "$pki"
    echo "created CA in $pki (keep ca.key offline; it signs every node certificate)" >&2
  else
    echo "reusing CA in $pki" >&2
  fi
  ca_dir="$pki"
else
  ca_dir="$work/ca"
  keygen_quiet ca --out "$ca_dir"
fi

# secret_manifest NAME ROLE COUNT: one Secret holding ca.pem and ROLE-<i>.pem/.key for i < COUNT.
secret_manifest() {
  local name="$1" role="$2" count="$3" dir="$work/$2" i
  local -a files=(--from-file="ca.pem=$ca_dir/ca.pem")
  mkdir -p "$dir"
  for ((i = 0; i < count; i++)); do
    keygen_quiet node --ca "$ca_dir" --name "$role-$i" --out "$dir"
    files+=(--from-file="$role-$i.pem=$dir/$role-$i.pem" --from-file="$role-$i.key=$dir/$role-$i.key")
  done
  "$kubectl" create secret generic "$name" --namespace "$namespace" "${files[@]}" \
    --dry-run=client -o yaml >"$work/$name.yaml"
  # kubectl create --dry-run cannot set labels; add them so the Secrets match the other objects.
  "$kubectl" label --local -f "$work/$name.yaml" --dry-run=client -o yaml \
    "app.kubernetes.io/name=cohort-$( [ "$role" = shard ] && echo server || echo client )" \
    app.kubernetes.io/part-of=cohort >"$work/$name.labeled.yaml"
}

secret_manifest cohort-tls-shards shard "$shards"
secret_manifest cohort-tls-clients client "$clients"

# A Secret is limited to 1 MiB (about 400 clients with EC P-256 keys).
for name in cohort-tls-shards cohort-tls-clients; do
  size=$(wc -c <"$work/$name.labeled.yaml")
  [ "$size" -lt 1000000 ] || die "Secret $name would be $size bytes, over Kubernetes' 1 MiB limit; use fewer clients per Secret"
done

tmp_out="$(mktemp "$(dirname "$out")/.cohort-secrets.XXXXXX")"
{
  cat "$work/cohort-tls-shards.labeled.yaml"
  echo "---"
  cat "$work/cohort-tls-clients.labeled.yaml"
} >"$tmp_out"
chmod 600 "$tmp_out"
mv -f "$tmp_out" "$out"
tmp_out=""
echo "wrote $out (mode 0600): Secrets cohort-tls-shards (shard-0..$((shards - 1))) and cohort-tls-clients (client-0..$((clients - 1))) in namespace $namespace" >&2
echo "next: kubectl apply -f $out, then delete it or move it to a secret store" >&2
