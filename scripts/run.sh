#!/usr/bin/env bash
# The main job: builds kvstash, starts a store (an owner and its embedded master) on loopback,
# shows it working with the command line, runs the benchmarks, and stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build >/dev/null
if ! cmake --build build -j"$(nproc)" >build.log 2>&1; then
    cat build.log
    exit 1
fi
port=${KVS_PORT:-50051}
tmp=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$tmp"' EXIT
build/kvstash-server --segment-size 256MiB --port "$port" --port-file "$tmp/port" &
pid=$!
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.05; done
[ -s "$tmp/port" ] || { echo "server did not start"; exit 1; }
port=$(cat "$tmp/port")
echo "--- kvstash stat"
build/kvstash --master "127.0.0.1:$port" stat
echo "--- kvstash ls"
build/kvstash --master "127.0.0.1:$port" ls
echo "--- allocator benchmark (the master's per-segment allocator)"
build/kvstash bench allocator --ops 200000
echo "--- tcp transport benchmark (loopback, against plain sockets)"
build/kvstash bench transport --size 128MiB --reps 3
