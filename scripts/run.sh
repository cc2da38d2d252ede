#!/usr/bin/env bash
# The main job: builds kvstash, starts a store (an owner and its embedded master) on loopback,
# stores and fetches a file with the command line, runs a client workload against it (batch
# puts, multi-buffer gets with every byte checked, throughput), and stops it; then a short
# store benchmark (its own store and reader processes; GPU pages where a GPU is present, else
# host pages) of direct, grouped and staged reads beside the limit measured in the same run.
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
kvs() { build/kvstash --master "127.0.0.1:$port" "$@"; }
echo "--- kvstash put / get / rm: a file in and out, byte for byte"
head -c 3000000 /dev/urandom >"$tmp/in"
kvs put demo-file "$tmp/in"
kvs get demo-file "$tmp/out"
cmp "$tmp/in" "$tmp/out" && echo "demo-file: $(stat -c %s "$tmp/out") bytes came back identical"
echo "--- kvstash ls"
kvs ls
kvs rm demo-file --force
echo "--- client workload: batch puts, multi-buffer gets into scattered 64 KiB pages, checked"
kvs bench client --keys 32 --size 4MiB --page 64KiB --reps 5
echo "--- kvstash stat"
kvs stat
echo "--- Prometheus metrics of the master and the owner (http://127.0.0.1:9003/metrics)"
python3 - <<'PY' || echo "(no metrics endpoint: port 9003 taken, or built without libmicrohttpd)"
import urllib.request
text = urllib.request.urlopen("http://127.0.0.1:9003/metrics", timeout=5).read().decode()
keep = ("kvstash_master_objects ", "kvstash_master_puts_ended_total", "kvstash_master_used_bytes",
        "kvstash_owner_requests_total", "kvstash_owner_served_bytes_total")
print("\n".join(l for l in text.splitlines() if l.startswith(keep)))
PY
echo "--- store benchmark (short form; the full protocol: docs/store_bench.md)"
build/kvstash bench store --layout 32x4MiB,256x256KiB --fragment-size 16KiB --readers 1 \
    --rounds 1 --samples 3 --direct-samples 1 --threads 0
