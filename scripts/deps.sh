#!/usr/bin/env bash
# Installs the system packages kvbench needs, only those missing
# (idempotent: a second run installs nothing). Debian/Ubuntu (apt-get).
set -euo pipefail
need=()
have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
# libdeflate0: the parallel loader's inflater when it loads (dlopen), faster than zlib, its fallback
for p in build-essential libhdf5-dev libaec-dev zlib1g-dev libdeflate0 valgrind python3 python3-venv; do
  have "$p" || need+=("$p")
done
if [ ${#need[@]} -eq 0 ]; then
  echo "deps: system packages present"
else
  echo "deps: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  echo "deps: done"
fi
# The Faiss C API for the faiss-* baselines (idempotent, fast when built).
# A failure leaves those methods out (their tests skip, saying why) unless
# KVBENCH_REQUIRE_FAISS=1.
if ! "$(dirname "$0")/build_faiss_capi.sh"; then
  echo "deps: the Faiss C API was not built: faiss-* methods will be left out" >&2
  [ "${KVBENCH_REQUIRE_FAISS:-}" != 1 ] || exit 1
fi
