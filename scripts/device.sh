#!/usr/bin/env bash
# GPU work on the device machine, one line per call: builds kvstash with CUDA in build-gpu/ and
# runs the named suites, writing logs, CSVs and tables under $OUT (default build-gpu/out).
# Usage: scripts/device.sh SUITE...
#   scatter        GPU scatter tests, the same under compute-sanitizer memcheck, `kvstash bench scatter`
#                  (the tests include the streamed kernel's abort and wait bound)
#   scatter-test   the tests and memcheck only (no benchmark)
#   scatter-abort  only the abort tests: a streamed kernel never given its units is aborted, or
#                  stops at its wait bound, and its stream recovers; a staged call whose scatter
#                  stalls returns at its deadline (the scatter cases also under memcheck)
#   scatter-bench  the benchmark only
#   gpu-direct     GPU destinations and sources over tcp and shm (tests), `kvstash bench gpu`
#   gpu-staging    staging with the CUDA backend (tests, and the same under memcheck)
#   torch          a PyTorch paged KV cache through the Python module, all four read modes;
#                  the tensor API (CPU and CUDA tensors) and its 1 GiB bf16 benchmark
#   gpu-tests      the GPU scatter, path and staging tests only (no memcheck, no benchmark)
#   mooncake       the Python module's Mooncake API and engine replay tests on this build
#   store          `kvstash bench store` (the store benchmark); $STORE_ARGS adds its options
#   contract       the correctness-contract tests on this machine's cores: test_stress and the
#                  restart, fencing, tombstone and lease cases of test_client
#   auth           test_auth and test_hostile, then `bench transport` and the store benchmark's tcp rows
#                  without a token, with one, and with one and TLS, in turn, twice: what
#                  authentication and TLS cost
#   ha             the GPU build without etcd's libraries (the machine has none): --etcd and
#                  etcd:// are refused with a message, the HA tests skip, the rest still builds
#   ops            the GPU build without libmicrohttpd (the machine has none): --metrics-port and
#                  client metrics are refused with a message; `pip install --no-build-isolation`
#                  into a venv picks the CUDA build, and a round trip runs from outside the tree
#   pages          the page-table form (issue 30): the page kernel's test and memcheck, `bench
#                  scatter` of equal pages (descriptors, page table, reference copy, contiguous),
#                  `bench store` with page-table staged reads, and bench/pages_torch.py (Python page-table
#                  read against batch_get_into + index_copy_) over shm and tcp
#   policy         bench/policy_matrix.py: the adaptive mode (MC_STORE_GPU_STAGING=auto) against
#                  direct, grouped and staged over page sizes x object sizes x shm and tcp
#   ttft           bench/ttft/ttft.py (issue 29): TTFT of Qwen3-30B-A3B's shapes (random weights) at 1K,
#                  8K and 24K input tokens, recompute / load direct / load staged, over shm and tcp,
#                  with the greedy-token check; $TTFT_ARGS adds options
#   interference   bench/interference.py: a bf16 GEMM loop beside staged reads, scatter grid sizes
#                  full/32/16/8 at normal and high stream priority; $INTERFERENCE_ARGS adds options
# $SCATTER_ARGS adds options to `kvstash bench scatter`.
# Every suite runs even when an earlier one failed; the exit status says whether all passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out=${OUT:-build-gpu/out}
mkdir -p "$out"
(($#)) || { sed -n '2,41p' "$0"; exit 2; }
{
    date -u +"%Y-%m-%dT%H:%M:%SZ"
    # (no commit line: the device machine's copy of .git may lag behind the tree it runs)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    nvcc --version | tail -n 1
} | tee "$out/machine.txt"
echo "=== build (CUDA, Release)"
if ! { cmake -S . -B build-gpu -DKVS_WERROR=ON -DCMAKE_BUILD_TYPE=Release &&
    cmake --build build-gpu -j"$(nproc)"; } >"$out/build.log" 2>&1; then
    tail -n 60 "$out/build.log"
    exit 1
fi
grep -q "kvstash: CUDA ON" "$out/build.log" || { echo "CUDA was not found"; exit 1; }
failed=()
step() { # name, command...: runs, logs to $out/name.log, records a failure
    local name=$1
    shift
    echo "=== $name: $*"
    if "$@" 2>&1 | tee "$out/$name.log"; then :; else failed+=("$name"); fi
}
for suite in "$@"; do
    case $suite in
    scatter-bench)
        # shellcheck disable=SC2086 # SCATTER_ARGS is a list of options
        step scatter_bench build-gpu/kvstash bench scatter --csv "$out/scatter.csv" ${SCATTER_ARGS:-}
        ;;
    scatter | scatter-test)
        step scatter_test build-gpu/tests/test_gpu_scatter
        if command -v compute-sanitizer >/dev/null; then
            KVS_TEST_NOFORK=1 step scatter_memcheck timeout 480 compute-sanitizer \
                --tool memcheck --error-exitcode 3 build-gpu/tests/test_gpu_scatter
        else
            echo "compute-sanitizer not found: memcheck skipped" | tee "$out/scatter_memcheck.log"
        fi
        # shellcheck disable=SC2086 # SCATTER_ARGS is a list of options
        [ "$suite" = scatter ] && step scatter_bench build-gpu/kvstash bench scatter \
            --csv "$out/scatter.csv" ${SCATTER_ARGS:-}
        ;;
    scatter-abort)
        abort_cases=(test_streamed_kernel_aborted_without_publication
            test_streamed_kernel_stops_at_its_wait_bound)
        step scatter_abort_test build-gpu/tests/test_gpu_scatter "${abort_cases[@]}"
        step staging_abort_test build-gpu/tests/test_gpu_staging \
            test_gpu_staging_stalled_scatter_is_aborted_at_the_deadline
        if command -v compute-sanitizer >/dev/null; then
            KVS_TEST_NOFORK=1 step scatter_abort_memcheck timeout 480 compute-sanitizer \
                --tool memcheck --error-exitcode 3 build-gpu/tests/test_gpu_scatter "${abort_cases[@]}"
        else
            echo "compute-sanitizer not found: memcheck skipped" | tee "$out/scatter_abort_memcheck.log"
        fi
        ;;
    gpu-direct)
        step gpu_paths_test build-gpu/tests/test_gpu_paths
        rm -f "$out/.port"
        build-gpu/kvstash-server --segment-size 2GiB --port 0 --port-file "$out/.port" \
            --log-level warn >"$out/gpu_server.log" 2>&1 &
        spid=$!
        for _ in $(seq 200); do [ -s "$out/.port" ] && break; sleep 0.05; done
        m="127.0.0.1:$(cat "$out/.port")"
        KVS_PROTOCOL=shm step gpu_bench_shm build-gpu/kvstash --master "$m" bench gpu
        KVS_PROTOCOL=tcp step gpu_bench_tcp build-gpu/kvstash --master "$m" bench gpu --reps 3
        kill "$spid"
        wait "$spid" 2>/dev/null
        rm -f "$out/.port"
        ;;
    gpu-staging)
        step gpu_staging_test build-gpu/tests/test_gpu_staging
        KVS_TEST_NOFORK=1 step gpu_staging_memcheck timeout 480 compute-sanitizer \
            --tool memcheck --error-exitcode 3 build-gpu/tests/test_gpu_staging
        ;;
    gpu-tests)
        step scatter_test build-gpu/tests/test_gpu_scatter
        step gpu_paths_test build-gpu/tests/test_gpu_paths
        step gpu_staging_test build-gpu/tests/test_gpu_staging
        ;;
    torch)
        PYTHONPATH=$PWD/build-gpu/python KVS_SERVER_PATH=$PWD/build-gpu/kvstash-server \
            step torch_test bash -c 'cd tests/python && python3 -m unittest -v test_torch_paged_kv'
        PYTHONPATH=$PWD/build-gpu/python step torch_example bash -c \
            'time python3 examples/paged_kv_cache.py --server build-gpu/kvstash-server'
        # The tensor API on the CPU and into CUDA tensors, then 1 GiB of 1 MiB bf16 tensors
        # against the pinned host-to-device copy.
        PYTHONPATH=$PWD/build-gpu/python KVS_SERVER_PATH=$PWD/build-gpu/kvstash-server \
            step tensor_test bash -c \
            'cd tests/python && python3 -m unittest -v test_tensor test_tensor_cuda'
        PYTHONPATH=$PWD/build-gpu/python step tensor_bench python3 bench/tensor_cuda.py \
            --server build-gpu/kvstash-server --total 1GiB --tensor 1MiB --reps 5
        ;;
    mooncake)
        PYTHONPATH=$PWD/build-gpu/python KVS_SERVER_PATH=$PWD/build-gpu/kvstash-server \
            step mooncake_test bash -c \
            'cd tests/python && python3 -m unittest -v test_mooncake_api test_engines'
        ;;
    pages)
        step pages_kernel_test build-gpu/tests/test_gpu_scatter test_page_table_kernel
        KVS_TEST_NOFORK=1 step pages_kernel_memcheck timeout 300 compute-sanitizer --tool memcheck \
            --error-exitcode 3 build-gpu/tests/test_gpu_scatter test_page_table_kernel
        step pages_staging_test build-gpu/tests/test_gpu_staging
        step pages_scatter_bench build-gpu/kvstash bench scatter --bytes 256MiB \
            --sets 4KiB,8KiB,16KiB,64KiB --methods kvstash,pages,reference,contiguous \
            --csv "$out/pages_scatter.csv"
        step pages_store_bench build-gpu/kvstash bench store --readers 1 --threads 0 \
            --rounds "${PAGES_ROUNDS:-3}" --csv "$out/pages_store.csv" \
            --table "$out/pages_store.md" --plot "$out/pages_store.png"
        for proto in shm tcp; do
            PYTHONPATH=$PWD/build-gpu/python step "pages_torch_$proto" python3 bench/pages_torch.py \
                --server build-gpu/kvstash-server --protocol "$proto" --markdown "$out/pages_torch.md"
        done
        ;;
    policy)
        # shellcheck disable=SC2086 # POLICY_ARGS is a list of options
        PYTHONPATH=$PWD/build-gpu/python step policy_matrix python3 bench/policy_matrix.py \
            --server build-gpu/kvstash-server --markdown "$out/policy.md" --csv "$out/policy.csv" \
            --plot "$out/policy.png" ${POLICY_ARGS:-}
        ;;
    ttft)
        # shellcheck disable=SC2086 # TTFT_ARGS is a list of options
        PYTHONPATH=$PWD/build-gpu/python step ttft python3 bench/ttft/ttft.py \
            --server build-gpu/kvstash-server --markdown "$out/ttft.md" --json "$out/ttft.json" \
            ${TTFT_ARGS:-}
        ;;
    interference)
        # shellcheck disable=SC2086 # INTERFERENCE_ARGS is a list of options
        PYTHONPATH=$PWD/build-gpu/python step interference python3 bench/interference.py \
            --server build-gpu/kvstash-server --markdown "$out/interference.md" \
            ${INTERFERENCE_ARGS:-}
        ;;
    store)
        # shellcheck disable=SC2086 # STORE_ARGS is a list of options
        step store_bench build-gpu/kvstash bench store --csv "$out/store.csv" \
            --table "$out/store.md" --plot "$out/store.png" ${STORE_ARGS:-}
        ;;
    contract)
        step contract_stress build-gpu/tests/test_stress
        step contract_client build-gpu/tests/test_client \
            test_restart_on_the_same_ports_under_a_shm_client test_forced_remove_during_a_read \
            test_stopped_owner_resumes_after_its_put_was_revoked \
            test_completed_reads_release_their_leases test_owner_killed_during_shm_reads
        ;;
    auth)
        step auth_test build-gpu/tests/test_auth
        step hostile_test build-gpu/tests/test_hostile
        token=$(mktemp)
        od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$token"
        chmod 600 "$token"
        for round in 1 2; do
            for mode in off on tls; do
                [ "$mode" = off ] || export KVS_AUTH_TOKEN_FILE=$token
                [ "$mode" = tls ] && export KVS_TLS=1
                flags=()
                [ "$mode" = off ] || flags+=(--auth-token-file "$token")
                [ "$mode" = tls ] && flags+=(--tls)
                step "auth_transport_${mode}_$round" build-gpu/kvstash bench transport \
                    --size 256MiB --reps 5 "${flags[@]}"
                step "auth_store_${mode}_$round" build-gpu/kvstash bench store --topology tcp \
                    --readers 1 --rounds 1 --threads 0 --csv "$out/auth-$mode-$round.csv" \
                    --table "$out/auth-$mode-$round.md"
                unset KVS_AUTH_TOKEN_FILE KVS_TLS
            done
        done
        rm -f "$token"
        ;;
    ha)
        step ha_version build-gpu/kvstash-server --version
        # Refused at once with the reason (exit 2), not a crash or a hang.
        step ha_refused bash -c 'out=$(build-gpu/kvstash-server --master-only --etcd 127.0.0.1:2379 2>&1); rc=$?; echo "$out"; [ $rc -eq 2 ] && grep -q "etcd support" <<<"$out"'
        step ha_client_refused bash -c 'out=$(KVS_MASTER=etcd://127.0.0.1:2379 build-gpu/kvstash stat 2>&1); rc=$?; echo "$out"; [ $rc -ne 0 ] && grep -q "etcd" <<<"$out"'
        step ha_test bash -c 'build-gpu/tests/test_ha; rc=$?; [ $rc -eq 77 ] || [ $rc -eq 0 ]'
        ;;
    ops)
        step ops_version build-gpu/kvstash-server --version
        step ops_refused bash -c 'out=$(build-gpu/kvstash-server --metrics-port 9003 2>&1); rc=$?; echo "$out"; [ $rc -eq 2 ] && grep -q "libmicrohttpd" <<<"$out"'
        PYTHONPATH=$PWD/build-gpu/python KVS_SERVER_PATH=$PWD/build-gpu/kvstash-server \
            step ops_client_refused bash -c 'cd tests/python && python3 -W error::RuntimeWarning - <<"PY" 2>&1 | tee /dev/stderr | grep -q libmicrohttpd
import kvstash
from kvs_harness import Server
srv = Server()
s = kvstash.MooncakeDistributedStore()
try:
    s.setup("localhost", "", 0, "16MB", "tcp", "", srv.master, enable_client_http_server=True)
except RuntimeWarning as w:
    print("refused as expected:", w)
finally:
    srv.stop()
PY'
        step ops_pip bash -c 'set -e; v=$(mktemp -d)/venv; python3 -m venv --system-site-packages "$v"
            "$v/bin/python" -c "import setuptools, wheel" || { echo "no setuptools/wheel for $(python3 --version)"; exit 1; }
            "$v/bin/pip" install --no-build-isolation --no-index . 2>&1 | tail -n 5
            so=$("$v/bin/python" -c "import kvstash._kvstash as m; print(m.__file__)")
            echo "installed: $so"; ldd "$so" | grep -q libcudart && echo "CUDA build: links libcudart"
            cd /tmp && KVS_SERVER_PATH=$OLDPWD/build-gpu/kvstash-server PYTHONPATH=$OLDPWD/tests/python \
                "$v/bin/python" -c "
import os, kvstash
from kvs_harness import Server
srv = Server(); s = kvstash.MooncakeDistributedStore()
assert s.setup(\"localhost\", \"\", 0, \"16MB\", \"tcp\", \"\", srv.master) == 0
d = os.urandom(8 << 20); assert s.put(\"k\", d) == 0 and s.get(\"k\") == d
print(\"round trip from\", kvstash.__file__); s.close(); srv.stop()"'
        ;;
    *) echo "unknown suite '$suite'"; failed+=("$suite") ;;
    esac
done
if ((${#failed[@]})); then
    echo "FAILED: ${failed[*]}"
    exit 1
fi
echo "all suites passed: $*"
