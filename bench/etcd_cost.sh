#!/usr/bin/env bash
# What running on etcd (--etcd, a leader elected there that writes
# membership changes) costs a collective, measured in one invocation:
# chorus-bench's all_reduce f32 sum of 8 B at --ranks ranks (inline plan,
# mean us per call) against a coordinator with --etcd and one without,
# alternating A B A B ... so that the machine's drift hits both alike; prints
# each pair's ratio (etcd / alone) and their median. Starts its own etcd
# (Debian's etcd-server) on free loopback ports.
# Usage: bench/etcd_cost.sh [--rounds=5] [--ranks=2]
# CHORUS_BUILD_DIR picks the build (default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${CHORUS_BUILD_DIR:-build}"
rounds=5 ranks=2
for arg in "$@"; do
  case "$arg" in
    --rounds=*) rounds=${arg#*=} ;;
    --ranks=*) ranks=${arg#*=} ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done
command -v etcd >/dev/null || { echo "etcd is not installed" >&2; exit 2; }

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
scratch=$(mktemp -d)
client=$(free_port) peer=$(free_port)
etcd --name=bench --data-dir="$scratch/etcd" \
  --listen-client-urls="http://127.0.0.1:$client" \
  --advertise-client-urls="http://127.0.0.1:$client" \
  --listen-peer-urls="http://127.0.0.1:$peer" \
  --initial-advertise-peer-urls="http://127.0.0.1:$peer" \
  --initial-cluster="bench=http://127.0.0.1:$peer" >"$scratch/etcd.log" 2>&1 &
etcd_pid=$!
trap 'kill $etcd_pid 2>/dev/null; wait $etcd_pid 2>/dev/null; rm -rf "$scratch"' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$client/health" >/dev/null && break
  sleep 0.1
done

# Mean us per call of one chorus-bench run (8 B all-reduce).
bench_us() {
  "$build/bench/chorus-bench" --collective=all_reduce --ranks="$ranks" \
    --min_bytes=8 --max_bytes=8 --time_per_size=3s --max_iters=1000000 \
    --warmup=200 --format=csv "$@" 2>/dev/null |
    awk -F, '$1 == "8" { print $5 }'
}

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

ratios=()
printf 'all_reduce 8 B, %s ranks (us per call)\n  %-6s %12s %12s %8s\n' \
  "$ranks" round etcd alone etcd/alone
for ((r = 1; r <= rounds; r++)); do
  on=$(bench_us --coordinator_args="--etcd=http://127.0.0.1:$client --etcd_prefix=/bench/$r")
  off=$(bench_us)
  if [ -z "$on" ] || [ -z "$off" ]; then
    echo "  round $r: a run failed" >&2
    exit 1
  fi
  ratio=$(awk -v a="$on" -v b="$off" 'BEGIN { printf "%.3f", a / b }')
  ratios+=("$ratio")
  printf '  %-6s %12s %12s %8s\n' "$r" "$on" "$off" "$ratio"
done
printf '  median etcd/alone: %s (above 1: slower on etcd)\n' \
  "$(printf '%s\n' "${ratios[@]}" | median)"
