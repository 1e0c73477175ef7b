#!/usr/bin/env bash
# The scaling benchmarks that two cores cannot settle (docs/benchmarks.md:
# issue 14's brokered cells, issue 15's recording, seed 004's fan-out),
# in one run on a machine with cores to spare, within a time budget.
#
# Usage: tools/device-bench.sh MILONGA_BINARY [OUT_DIR]
#   MILONGA_BINARY  a release build of milonga (`make device-binary` makes a
#                   stripped one at target/device/milonga, small enough to
#                   carry to a machine that cannot build)
#   OUT_DIR         where the outputs and run.txt go (default: $OUT, or
#                   ./device-bench)
# DEVICE_BENCH_SECONDS (default 420) bounds the whole run: each step gets
# what is left (at most its own bound) and a step cut short says so in
# run.txt. Steps run in order of what the issues still need measured.
set -uo pipefail
bin=${1:?usage: tools/device-bench.sh MILONGA_BINARY [OUT_DIR]}
out=${2:-${OUT:-device-bench}}
mkdir -p "$out"
bin=$(realpath "$bin")
budget=${DEVICE_BENCH_SECONDS:-420}
start=$(date +%s)
log="$out/run.txt"
{
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(uname -n), $(nproc) cores, $(awk '/MemTotal/ {print int($2/1048576) " GiB"}' /proc/meminfo)"
    echo "binary: $bin ($("$bin" --version 2>/dev/null || echo unknown version))"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "budget: ${budget} s"
} >"$log"

# step NAME MAX_SECONDS ARGS...: `milonga bench ARGS` into NAME.out.
step() {
    local name=$1 max=$2
    shift 2
    local left=$((budget - ($(date +%s) - start)))
    if ((left < 20)); then
        echo "$name: not run (the budget is spent)" >>"$log"
        return
    fi
    local t=$((max < left ? max : left))
    local t0
    t0=$(date +%s)
    echo "$name: milonga bench $* (at most ${t} s)" >>"$log"
    timeout --kill-after=10 "$t" "$bin" bench "$@" >"$out/$name.out" 2>"$out/$name.err"
    local rc=$?
    local took=$(($(date +%s) - t0))
    if ((rc == 124 || rc == 137)); then
        echo "$name: cut short after ${took} s (what it printed is kept)" >>"$log"
    else
        echo "$name: exit status $rc after ${took} s" >>"$log"
    fi
}

# MILONGA_RUNTIME_DIR keeps each run's nodes apart from anything else;
# the recordings go under the current directory, on the machine's disk
# (/tmp may be memory, which would make the disk comparison meaningless).
export MILONGA_RUNTIME_DIR
MILONGA_RUNTIME_DIR=$(mktemp -d)
files=$(mktemp -d -p . device-bench-files.XXXXXX)
trap 'rm -rf "$MILONGA_RUNTIME_DIR" "$files"' EXIT
echo "recordings in: $(realpath "$files") ($(df -T "$files" | awk 'NR == 2 {print $2}'))" >>"$log"

step rpc-via-broker 150 rpc --via-broker --clients 1,10,50 --sizes 1,4096 --format csv
step pubsub-via-broker 240 pubsub --via-broker --format csv
step latency-via-broker 90 latency --via-broker --format csv
step record 150 record --sizes 92,4096,1048576 --runs 3 --dir "$files"
step scale 240 scale --format csv
echo "total: $(($(date +%s) - start)) s" >>"$log"
