#!/usr/bin/env bash
# Installs the build and test dependencies from Debian's packages when any is missing.
# cmake, a C compiler and make build kvstash; clang and libclang-rt-14-dev build and run the
# libFuzzer targets; pkgconf checks the installed pkg-config file; python3-dev builds the Python
# module; libssl-dev gives libcrypto's headers (HMAC-SHA256 for authentication); python3-torch
# runs the tensor API's tests. CUDA (nvcc) is optional and never installed here.
set -euo pipefail
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v cc >/dev/null || need+=(gcc)
command -v make >/dev/null || need+=(make)
command -v clang >/dev/null || need+=(clang)
dpkg -s libclang-rt-14-dev >/dev/null 2>&1 || need+=(libclang-rt-14-dev)
command -v python3 >/dev/null || need+=(python3)
command -v pkg-config >/dev/null || need+=(pkgconf)
dpkg -s libssl-dev >/dev/null 2>&1 || need+=(libssl-dev)
# PyTorch on the CPU for the tensor API's tests (Debian's, for /usr/bin/python3).
dpkg -s python3-torch >/dev/null 2>&1 || need+=(python3-torch)
# Python.h for the extension module, wherever this python3 looks for it.
inc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null || true)
[ -n "$inc" ] && [ -f "$inc/Python.h" ] || need+=(python3-dev)
if ((${#need[@]})); then
    echo "deps: installing ${need[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
fi
