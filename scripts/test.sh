#!/usr/bin/env bash
# Runs every test: the default build (with CUDA parts when nvcc is present) under CTest, the
# same suite under AddressSanitizer+UndefinedBehaviorSanitizer and under ThreadSanitizer, and
# each libFuzzer target for KVS_FUZZ_SECONDS (default 20). Builds from scratch in build-*/, every
# stage with the test-only fault knobs compiled in (-DKVS_TEST_HOOKS=ON).
# Usage: scripts/test.sh [default|asan|tsan|fuzz ...]   (no argument: all of them)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs=$(nproc)
fuzz_seconds=${KVS_FUZZ_SECONDS:-20}
stages=("$@")
((${#stages[@]})) || stages=(default asan tsan fuzz)
start=$(date +%s)
failed=()

# Builds quietly: the log is shown only on failure (progress lines are dropped).
build_quiet() { # build dir
    local log="$1.build.log"
    if cmake --build "$1" -j"$jobs" >"$log" 2>&1; then
        grep -Ev '^\[ *[0-9]+%\]' "$log" || true
        return 0
    fi
    cat "$log"
    return 1
}

run_suite() { # name, build dir, cmake args...
    local name=$1 dir=$2
    shift 2
    echo "=== $name: configure and build in $dir"
    rm -rf "$dir"
    cmake -S . -B "$dir" -DKVS_WERROR=ON -DKVS_TEST_HOOKS=ON "$@" >"$dir.configure.log" 2>&1 ||
        { cat "$dir.configure.log"; return 1; }
    build_quiet "$dir" || return 1
    echo "=== $name: ctest"
    (cd "$dir" && ctest --output-on-failure -j"$jobs")
}

for stage in "${stages[@]}"; do
    case $stage in
    default) run_suite default build-test || failed+=(default) ;;
    asan)
        ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
            run_suite asan build-asan -DKVS_CUDA=OFF -DKVS_SANITIZE=address,undefined \
            -DCMAKE_BUILD_TYPE=Debug || failed+=(asan)
        ;;
    tsan)
        TSAN_OPTIONS=halt_on_error=1 \
            run_suite tsan build-tsan -DKVS_CUDA=OFF -DKVS_SANITIZE=thread \
            -DCMAKE_BUILD_TYPE=Debug || failed+=(tsan)
        ;;
    fuzz)
        echo "=== fuzz: build with clang"
        rm -rf build-fuzz
        if CC=clang cmake -S . -B build-fuzz -DKVS_CUDA=OFF -DKVS_FUZZ=ON -DKVS_WERROR=ON \
            -DKVS_TEST_HOOKS=ON \
            -DCMAKE_BUILD_TYPE=RelWithDebInfo >build-fuzz.configure.log 2>&1 &&
            build_quiet build-fuzz; then
            for f in build-fuzz/tests/fuzz/fuzz_*; do
                [ -x "$f" ] || continue
                name=$(basename "$f")
                mkdir -p "build-fuzz/corpus/$name"
                echo "=== fuzz: $name for ${fuzz_seconds}s"
                if "$f" -max_total_time="$fuzz_seconds" -print_final_stats=0 \
                    "build-fuzz/corpus/$name" >"build-fuzz/$name.log" 2>&1; then
                    tail -n 1 "build-fuzz/$name.log"
                else
                    tail -n 40 "build-fuzz/$name.log"
                    failed+=("$name")
                fi
            done
        else
            cat build-fuzz.configure.log
            failed+=(fuzz-build)
        fi
        ;;
    *) echo "unknown stage '$stage' (default|asan|tsan|fuzz)"; exit 2 ;;
    esac
done

elapsed=$(($(date +%s) - start))
echo "=== all stages took ${elapsed}s"
if ((${#failed[@]})); then
    echo "FAILED: ${failed[*]}"
    exit 1
fi
echo "all stages passed: ${stages[*]}"
