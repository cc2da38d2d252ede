#!/usr/bin/env bash
# Installs the build into a temporary prefix and builds a consumer against it twice: through
# pkg-config and through the CMake package. Usage: install_check.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log"
lib=$(find "$tmp/prefix" -name 'libkvstash.so.*.*.*' | head -n 1)
[ -n "$lib" ] || { echo "no versioned libkvstash.so.X.Y.Z installed"; exit 1; }
libdir=$(dirname "$lib")
[ -L "$libdir/libkvstash.so" ] || { echo "libkvstash.so link missing"; exit 1; }
for h in kvstash.h client.h status.h version.h; do
    [ -f "$tmp/prefix/include/kvstash/$h" ] || { echo "header $h missing"; exit 1; }
done
# Internal headers never ship.
if find "$tmp/prefix" -name '*_int.h' | grep -q .; then echo "internal header installed"; exit 1; fi

echo "--- pkg-config"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror -o "$tmp/consumer-pc" "$src/tests/install/consumer.c" \
    $(pkg-config --cflags --libs kvstash)
LD_LIBRARY_PATH="$libdir" "$tmp/consumer-pc"

echo "--- CMake package"
cmake -S "$src/tests/install" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
    >"$tmp/consumer.log" 2>&1 || { cat "$tmp/consumer.log"; exit 1; }
cmake --build "$tmp/consumer" >>"$tmp/consumer.log" 2>&1 || { cat "$tmp/consumer.log"; exit 1; }
LD_LIBRARY_PATH="$libdir" "$tmp/consumer/consumer"
echo "install check passed"
