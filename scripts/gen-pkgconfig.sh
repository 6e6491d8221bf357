#!/usr/bin/env bash
# Writes pkg-config files for the library cargo built in target/<profile>
# (default: release) into target/<profile>/pkgconfig/:
#   kvgate.pc         links libkvgate.so   (pkg-config --cflags --libs kvgate)
#   kvgate-static.pc  links libkvgate.a    (pkg-config --cflags --libs kvgate-static)
# Use them with PKG_CONFIG_PATH=target/<profile>/pkgconfig. They point into
# this checkout (prefix = the repository), so nothing needs installing.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-release}"
root="$(pwd)"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)"
out="target/$profile/pkgconfig"
mkdir -p "$out"
# What a Rust staticlib needs from the system on Linux/glibc
# (`cargo rustc --crate-type staticlib -- --print native-static-libs`).
native_libs="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"

common() {
    cat <<PC
prefix=$root
libdir=\${prefix}/target/$profile
includedir=\${prefix}/include

Name: $1
Description: Session-level admission gate protecting an LLM engine's prefix cache (C ABI)
Version: $version
Cflags: -I\${includedir}
PC
}

{ common kvgate; echo "Libs: -L\${libdir} -lkvgate"; echo "Libs.private: $native_libs"; } >"$out/kvgate.pc"
{ common kvgate-static; echo "Libs: \${libdir}/libkvgate.a $native_libs"; } >"$out/kvgate-static.pc"
echo "wrote $out/kvgate.pc and $out/kvgate-static.pc (kvgate $version, $profile)"
