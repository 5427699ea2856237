#!/bin/sh
# The container image's entry point: runs the Chorus program its first
# argument names, with the remaining arguments.
set -eu

usage() {
  cat <<'USAGE'
Usage: chorus PROGRAM [FLAGS...]
PROGRAM is one of:
  coordinator   chorus-coordinator (one per cluster)
  worker        chorus-worker (one per host or device set)
  chorusctl     the command-line client
Each prints its flags with --help.
USAGE
}

if [ $# -eq 0 ]; then
  usage >&2
  exit 2
fi
program=$1
shift
case "$program" in
  coordinator | chorus-coordinator) exec chorus-coordinator "$@" ;;
  worker | chorus-worker) exec chorus-worker "$@" ;;
  chorusctl) exec chorusctl "$@" ;;
  help | -h | --help) usage ;;
  *)
    echo "chorus: unknown program '$program'" >&2
    usage >&2
    exit 2
    ;;
esac
