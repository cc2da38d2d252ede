#!/usr/bin/env bash
# Installs the build and test dependencies from Debian's packages when any is missing.
# cmake, a C compiler and make build kvstash; clang and libclang-rt-14-dev build and run the
# libFuzzer targets; pkgconf checks the installed pkg-config file; python3-dev builds the Python
# module; libssl-dev gives libcrypto's headers (HMAC-SHA256 for authentication); python3-torch
# runs the tensor API's tests; libcurl4-openssl-dev and libjson-c-dev give the etcd client its
# HTTP and JSON (high availability, docs/ha.md: optional at build time), etcd-server and
# etcd-client run its tests, and iproute2 builds the network namespaces of the multi-host test.
# libmicrohttpd-dev serves the Prometheus endpoints (docs/monitoring.md: optional at build time),
# prometheus (with promtool) scrapes them in the monitoring test, python3-build, python3-venv,
# python3-setuptools, python3-wheel and python3-pip build and install the wheel offline, and tmux
# drives the terminal checks of `kvstash top` and of progress output.
# CUDA (nvcc) is optional and never installed here.
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
# High availability: the etcd client's libraries, and a real etcd for its tests.
dpkg -s libcurl4-openssl-dev >/dev/null 2>&1 || need+=(libcurl4-openssl-dev)
dpkg -s libjson-c-dev >/dev/null 2>&1 || need+=(libjson-c-dev)
command -v etcd >/dev/null || need+=(etcd-server)
command -v etcdctl >/dev/null || need+=(etcd-client)
command -v ip >/dev/null || need+=(iproute2)
# Monitoring: the HTTP server library, and a real Prometheus for its test.
dpkg -s libmicrohttpd-dev >/dev/null 2>&1 || need+=(libmicrohttpd-dev)
command -v prometheus >/dev/null && command -v promtool >/dev/null || need+=(prometheus)
# Packaging: pip, build, venv and setuptools from Debian, used offline.
for p in python3-build python3-venv python3-setuptools python3-wheel python3-pip python3-dev; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
# Terminal checks of the live view and progress output.
command -v tmux >/dev/null || need+=(tmux)
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
