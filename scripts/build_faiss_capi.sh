#!/usr/bin/env bash
# build_faiss_capi.sh: builds Faiss's C API (libfaiss_c.a) from Debian's own
# faiss source package, for the faiss-* baselines (retrievers/faiss.c).
#
# Why: Debian's libfaiss-dev (bookworm: 1.7.3) ships libfaiss.a and the C API
# headers (/usr/include/faiss/c_api) but no C API library. Debian's build
# does compile it (debian/rules passes -DFAISS_ENABLE_C_API=ON), but
# upstream's c_api/CMakeLists.txt of 1.7.3 installs only the headers (no
# install(TARGETS faiss_c)), so libfaiss_c never reaches the package.
#
# What: installs libfaiss-dev (+ BLAS/LAPACK, OpenBLAS as the BLAS
# provider, g++, dpkg-dev) if missing; adds a deb-src entry of our own for
# the running suite if apt has none for faiss; `apt-get source` of exactly
# the installed faiss source version into a cache dir outside the repo;
# checks that the source's c_api headers are the installed ones; compiles
# c_api/*.cpp, c_api/impl/*.cpp, c_api/utils/*.cpp (upstream's FAISS_C_SRC
# list; not c_api/gpu) against the installed headers; archives them into
# $PREFIX/lib/libfaiss_c.a; links a smoke test. Idempotent: when the archive
# exists and its stamp names the installed version, it only says so.
#
# SIMD distances (issue 12, goal 5): Debian compiles libfaiss.a for the
# x86-64 baseline (no SSE3), so its fvec_inner_product/fvec_L2sqr are the
# scalar *_ref loops (17% of a CPU full decode of all methods was
# faiss::fvec_inner_product_ref). Where this CPU has AVX2+FMA+F16C, the same
# source file faiss/utils/distances_simd.cpp is compiled with them into
# $PREFIX/lib/kvbench/faiss_distances_simd.o; the Makefile links that object
# ahead of libfaiss.a, so its definitions (a superset of the archive
# member's) are the ones used and the archive's member is never pulled in.
# Faiss's own AVX2 code, as pip's faiss-cpu runs it on such a CPU; sums
# in another order than the scalar loop, so near-ties may rank differently.
#
# Environment: FAISS_C_PREFIX (default /usr/local), KVBENCH_CACHE (default
# /var/cache/kvbench as root, ~/.cache/kvbench otherwise), KVBENCH_FORCE=1
# rebuilds. Link line for users: $PREFIX/lib/libfaiss_c.a -lfaiss -llapack
# -lblas -lgomp -lstdc++ -lm.
set -euo pipefail
PREFIX=${FAISS_C_PREFIX:-/usr/local}
LIB=$PREFIX/lib/libfaiss_c.a
STAMP=$PREFIX/share/kvbench/libfaiss_c.stamp
SIMD_OBJ=$PREFIX/lib/kvbench/faiss_distances_simd.o
SIMD_FLAGS=""
grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && grep -qw f16c /proc/cpuinfo && SIMD_FLAGS="-mavx2 -mfma -mf16c"
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
if [ "$(id -u)" = 0 ]; then CACHE=${KVBENCH_CACHE:-/var/cache/kvbench}; else CACHE=${KVBENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvbench}; fi
export DEBIAN_FRONTEND=noninteractive
say() { echo "faiss-capi: $*"; }
die() { echo "faiss-capi: error: $*" >&2; exit 1; }

# ---- packages ----
have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
need=()
# libopenblas0-openmp: Faiss's k-means and flat search call sgemm; with
# Debian's reference BLAS, IVF-PQ training is ~2x slower. The openmp flavour
# shares libgomp with kvbench and runs single-threaded inside its threads.
for p in libfaiss-dev libblas-dev liblapack-dev libopenblas0-openmp g++ dpkg-dev; do have "$p" || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
ver=$(dpkg-query -W -f='${source:Version}' libfaiss-dev)       # e.g. 1.7.3-2 (the binary is 1.7.3-2+b1)
upstream=${ver%-*}
upstream=${upstream#*:}

if [ -z "${KVBENCH_FORCE:-}" ] && [ -f "$LIB" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "faiss $ver simd ${SIMD_FLAGS:-none}" ]; then
  say "present ($LIB, from Debian faiss $ver)"
  exit 0
fi
t0=$(date +%s)

# ---- a deb-src entry for the running suite (only if apt has none for faiss) ----
srcver() { apt-cache showsrc faiss 2>/dev/null | awk '/^Version:/ {print $2}'; }
if ! srcver | grep -qx "$ver"; then
  # shellcheck source=/dev/null
  . /etc/os-release
  suite=${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}
  # the mirror apt already uses for this suite's binaries
  uri=$(apt-cache policy 2>/dev/null | awk -v s=" $suite/main " 'index($0, s) && /Packages/ {print $2; exit}')
  uri=${uri:-http://deb.debian.org/debian}
  keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  f=/etc/apt/sources.list.d/kvbench-deb-src.sources
  want=$(printf 'Types: deb-src\nURIs: %s\nSuites: %s\nComponents: main\n' "$uri" "$suite")
  [ -f "$keyring" ] && want=$(printf '%s\nSigned-By: %s\n' "$want" "$keyring")
  if [ ! -f "$f" ] || [ "$(cat "$f")" != "$want" ]; then
    say "adding $f (deb-src $uri $suite main)"
    echo "$want" | $SUDO tee "$f" >/dev/null
  fi
  # a full update: updating one list alone can drop the other suites' indexes
  say "apt-get update (source indexes)"
  $SUDO apt-get update -qq
fi
srcver | grep -qx "$ver" || die "apt has no source package faiss=$ver (source versions: $(srcver | tr '\n' ' '))"

# ---- source ----
src=$CACHE/faiss-src
dir=$src/faiss-$upstream
mkdir -p "$src"
if [ ! -f "$dir/c_api/faiss_c.h" ] || [ "$(cat "$src/.version" 2>/dev/null)" != "$ver" ]; then
  say "apt-get source faiss=$ver into $src"
  rm -rf "$dir"
  (cd "$src" && apt-get source -qq -o APT::Sandbox::User=root --only-source "faiss=$ver" >/dev/null)
  [ -f "$dir/c_api/faiss_c.h" ] || die "apt-get source unpacked no $dir/c_api"
  echo "$ver" > "$src/.version"
fi

# The archive is compiled against the installed headers: they must be the
# source's own, or the library would not match what kvbench includes.
for h in "$dir"/c_api/*.h "$dir"/c_api/impl/*.h "$dir"/c_api/utils/*.h; do
  rel=${h#"$dir"/c_api/}
  cmp -s "$h" "/usr/include/faiss/c_api/$rel" || die "/usr/include/faiss/c_api/$rel differs from faiss $ver's c_api/$rel"
done

# ---- compile (upstream's FAISS_C_SRC: c_api/*.cpp, impl/, utils/; not gpu/) ----
obj=$src/obj-$ver
rm -rf "$obj"
mkdir -p "$obj"
mapfile -t cpps < <(cd "$dir/c_api" && ls ./*.cpp impl/*.cpp utils/*.cpp)
say "compiling ${#cpps[@]} files of faiss $ver's c_api (g++ -O2, $(nproc) jobs)"
# -std=c++11 as upstream's CMake; no -Wall: upstream's code, not ours.
# shellcheck disable=SC2016 # $1, $2 are the inner sh's
printf '%s\n' "${cpps[@]}" | (cd "$dir/c_api" && xargs -P "$(nproc)" -I{} sh -c \
  'o="$1/$(echo "$2" | sed "s|^\./||; s|/|_|g; s|\.cpp$|.o|")"; g++ -std=c++11 -O2 -fPIC -fopenmp -DNDEBUG -c "$2" -o "$o" || exit 255' \
  _ "$obj" {}) || die "compiling faiss's c_api failed"
if [ -n "$SIMD_FLAGS" ]; then
  say "compiling faiss/utils/distances_simd.cpp with $SIMD_FLAGS"
  g++ -std=c++11 -O2 -fPIC -fopenmp -DNDEBUG $SIMD_FLAGS -I"$dir" -c "$dir/faiss/utils/distances_simd.cpp" \
    -o "$obj/faiss_distances_simd.o" || die "compiling faiss's distances_simd.cpp failed"
fi
rm -f "$obj/libfaiss_c.a"
ar rcs "$obj/libfaiss_c.a" "$obj"/*.o

# ---- smoke test: the C API links against libfaiss and answers a search ----
cat > "$obj/smoke.c" <<'EOF'
#include <faiss/c_api/IndexFlat_c.h>
#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/error_c.h>
#include <stdio.h>
int main(void) {
    float x[4 * 3] = {1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1}, q[3] = {0, 2, 1}, d[2];
    idx_t l[2];
    FaissIndexFlatIP *ix;
    if (faiss_IndexFlatIP_new_with(&ix, 3) || faiss_Index_add((FaissIndex *)ix, 4, x) ||
        faiss_Index_search((FaissIndex *)ix, 1, q, 2, d, l)) { fprintf(stderr, "%s\n", faiss_get_last_error()); return 1; }
    faiss_Index_free((FaissIndex *)ix);
    return !(l[0] == 3 && l[1] == 1 && d[0] == 3.0f);
}
EOF
gcc -std=c11 -o "$obj/smoke" "$obj/smoke.c" "$obj/libfaiss_c.a" ${SIMD_FLAGS:+"$obj/faiss_distances_simd.o"} -lfaiss -llapack -lblas -lgomp -lstdc++ -lm \
  || die "the smoke test does not link"
"$obj/smoke" || die "the smoke test ran but answered wrongly"

$SUDO install -D -m 644 "$obj/libfaiss_c.a" "$LIB"
$SUDO rm -f "$SIMD_OBJ"
[ -n "$SIMD_FLAGS" ] && $SUDO install -D -m 644 "$obj/faiss_distances_simd.o" "$SIMD_OBJ"
echo "faiss $ver simd ${SIMD_FLAGS:-none}" | $SUDO install -D -m 644 /dev/stdin "$STAMP"
rm -rf "$obj"
say "built $LIB from Debian faiss $ver in $(( $(date +%s) - t0 ))s (headers: /usr/include/faiss/c_api)"
