#!/usr/bin/env bash
# Starts a demo Chorus cluster on 127.0.0.1 (a coordinator and two workers)
# with mutual TLS (certificates from scripts/dev_certs.sh), shows the
# workers registered with their devices, runs collectives across them
# through their local API on each worker's Unix socket, shows what a
# certificate may not do, then stops everything cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/build.sh
bin="${CHORUS_BUILD_DIR:-build}"
coordinator_bin="$bin/server/coordinator/chorus-coordinator"
worker_bin="$bin/server/worker/chorus-worker"
chorusctl="$bin/client/chorusctl"

run_dir=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$run_dir"
}
trap cleanup EXIT

# Waits up to 30 s for a daemon to write its port file.
wait_port() {
  local file=$1 pid=$2
  for _ in $(seq 300); do
    [ -s "$file" ] && { cat "$file"; return 0; }
    kill -0 "$pid" 2>/dev/null || { echo "daemon exited; log:" >&2; cat "$run_dir"/*.log >&2; return 1; }
    sleep 0.1
  done
  echo "timed out waiting for $file" >&2
  return 1
}

echo "\$ scripts/dev_certs.sh --out=CERTS --workers=demo-worker-0,demo-worker-1 --admins=admin"
certs="$run_dir/certs"
scripts/dev_certs.sh --out="$certs" --workers=demo-worker-0,demo-worker-1 \
  --admins=admin >/dev/null

"$coordinator_bin" --listen=127.0.0.1:0 --port_file="$run_dir/coordinator.port" \
  --tls_dir="$certs/coordinator" 2>"$run_dir/coordinator.log" &
pids+=($!)
port=$(wait_port "$run_dir/coordinator.port" "${pids[0]}")
coordinator="127.0.0.1:$port"
echo "coordinator listening on $coordinator (mutual TLS)"

for name in demo-worker-0 demo-worker-1; do
  "$worker_bin" --coordinator="$coordinator" --listen=127.0.0.1:0 \
    --tls_dir="$certs/worker-$name" --local_socket="$run_dir/$name.sock" \
    --port_file="$run_dir/$name.port" 2>"$run_dir/$name.log" &
  pids+=($!)
  wait_port "$run_dir/$name.port" "${pids[-1]}" >/dev/null
done

echo
echo "\$ chorusctl --coordinator=$coordinator --tls_dir=CERTS/admin-admin workers"
"$chorusctl" --coordinator="$coordinator" --tls_dir="$certs/admin-admin" workers
ctl() {
  "$chorusctl" --coordinator="$coordinator" --tls_dir="$certs/admin-admin" \
    --timeout=30s "$@"
}

# Runs one command per rank concurrently (rank r through demo-worker-r) and
# prints each rank's output.
run_ranks() {
  local label=$1; shift
  echo
  echo "\$ chorusctl --worker=unix:<demo-worker-R's socket> --group=demo-$label --world=2 --rank=R $*"
  local outs=()
  for rank in 0 1; do
    local values_var="values_$rank"
    # shellcheck disable=SC2086
    ctl --worker="unix:$run_dir/demo-worker-$rank.sock" --group="demo-$label" \
      --world=2 --rank=$rank "$@" ${!values_var} >"$run_dir/out.$rank" 2>"$run_dir/err.$rank" &
    outs+=($!)
  done
  local status=0
  for pid in "${outs[@]}"; do wait "$pid" || status=1; done
  for rank in 0 1; do
    echo "  rank $rank: $(cat "$run_dir/out.$rank")$(grep -h '^chorusctl:' "$run_dir/err.$rank" | sed 's/^chorusctl: /  # /')"
  done
  return $status
}

values_0="1 2 3 4"; values_1="10 20 30 40"
run_ranks sum --dtype=f32 --op=sum allreduce
run_ranks ring --dtype=i64 --op=max --algorithm=ring allreduce
values_0="1 2"; values_1="3 4"
run_ranks gather --dtype=i32 allgather
echo
echo "Ranks that disagree get one verdict on every rank:"
values_0="1 2 3"; values_1="1 2"
run_ranks mismatch --dtype=f32 --op=sum allreduce || true

echo
echo "\$ chorusctl groups"
ctl groups

echo
echo "The coordinator's flight recorder names who was at fault:"
echo "\$ chorusctl --group=demo-mismatch trace"
ctl --group=demo-mismatch trace

echo
echo "A certificate names who may do what: demo-worker-0's may not list the workers,"
echo "and a worker will not start under a name other than its certificate's:"
echo "\$ chorusctl --tls_dir=CERTS/worker-demo-worker-0 workers"
"$chorusctl" --coordinator="$coordinator" --tls_dir="$certs/worker-demo-worker-0" \
  --timeout=10s workers 2>&1 | sed 's/^/  /' || true
echo "\$ chorus-worker --tls_dir=CERTS/worker-demo-worker-0 --name=demo-worker-1"
"$worker_bin" --coordinator="$coordinator" --listen=127.0.0.1:0 --local_socket= \
  --tls_dir="$certs/worker-demo-worker-0" --name=demo-worker-1 2>&1 |
  grep '^chorus-worker:' | sed 's/^/  /' || true

echo
echo "A worker asking for a device without distributed support is refused:"
echo "\$ chorus-worker --coordinator=$coordinator --devices=cpu,vulkan:0"
status=0
"$worker_bin" --coordinator="$coordinator" --listen=127.0.0.1:0 --local_socket= \
  --tls_dir="$certs/worker-demo-worker-1" --name=demo-worker-1 \
  --devices=cpu,vulkan:0 2>"$run_dir/refused.log" || status=$?
grep '^chorus-worker:' "$run_dir/refused.log" || true
echo "(exit code $status)"
