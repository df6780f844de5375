#!/bin/bash
# Profile of memring under memtier W1 (bench/results/hotkeys-profile.md).
# Usage: hotkeys-profile.sh "<extra memring settings>"; writes perf.data in /tmp/prof.
set -u
mkdir -p /tmp/prof
REPO=$(cd "$(dirname "$0")/../.." && pwd)
MT=${MEMTIER:-$REPO/../shared/tools/memtier/memtier_benchmark}
BIN=$REPO/target/release/memring
cd /tmp/prof
pids=()
trap 'kill ${pids[@]} 2>/dev/null' EXIT
for i in 1 2 3 4; do memcached -u root -l 127.0.0.1 -p $((34100+i)) -t 1 -m 1024 -c 4096 & pids+=($!); done
printf 'listen = "127.0.0.1:34100"\n%s\n' "$1" > m.toml
for i in 1 2 3 4; do printf '[[servers]]\naddr = "127.0.0.1:%d"\n' $((34100+i)) >> m.toml; done
sleep 0.5
$BIN --config m.toml 2>/dev/null & mp=$!; pids+=($mp)
for t in $(seq 50); do (echo > /dev/tcp/127.0.0.1/34100) 2>/dev/null && break; sleep 0.1; done
$MT -s 127.0.0.1 -p 34100 --protocol=memcache_text -t 1 -c 10 --pipeline=16 --ratio=1:0 --key-pattern=P:P --requests=allkeys -d 32 --key-minimum=1 --key-maximum=100000 --hide-histogram >/dev/null 2>&1
$MT -s 127.0.0.1 -p 34100 --protocol=memcache_text -t 1 -c 50 --pipeline=1 --ratio=1:10 -d 32 --key-pattern=R:R --key-minimum=1 --key-maximum=100000 --test-time=14 --hide-histogram > mt.out 2>&1 & lp=$!
sleep 3
perf record -F 2000 -g -p $mp -o perf.data -- sleep 8 >/dev/null 2>&1
wait $lp
grep -E "^Totals" mt.out
kill ${pids[@]}; wait 2>/dev/null
