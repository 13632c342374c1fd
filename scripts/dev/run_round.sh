#!/usr/bin/env bash
# run_round.sh: one device call for several branches' checks (the device's wall limit and its few returned
# files make one call of everything the cheap way): builds, runs the named scripts/dev/*.sh in order under one
# deadline (NAME:SECONDS gives one its own limit, LIM the default), then with what is left the whole GPU suite
# (SUITE=0 skips it); everything under $OUT goes back as one tarball, round.tgz. A base-golden-src.tgz in the
# repository root (a `git archive` of an earlier tree) is built in the background and handed to the scripts as
# BASE_BIN, for scripts/golden_run.py's GPU reference. REBUILD=0 reuses a warm machine's ./kvbench.
#   scripts/dev/run_round.sh 400 s4-ct s4-fk s4-loop:120   (on the device; the lead's calls of 2026-11-23)
set -u -o pipefail
cd "$(dirname "$0")/../.."
DL=$1; shift
T0=$SECONDS; left() { echo $((DL - (SECONDS - T0))); }
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $R/device.txt
if [ -f base-golden-src.tgz ] && [ ! -x /tmp/base/kvbench ]; then
  mkdir -p /tmp/base && tar xzf base-golden-src.tgz -C /tmp/base && (cd /tmp/base && nohup make -j6 kvbench >/tmp/base/build.log 2>&1 &)
fi
if [ ! -x ./kvbench ] || [ "${REBUILD:-1}" = 1 ]; then
  make -j16 kvbench tests/run_tests >$R/build.log 2>&1 || { tail -40 $R/build.log; tar -C $OUT -czf $OUT/round.tgz r; rm -rf $R; exit 1; }
fi
echo "[$((SECONDS - T0))s] built"
for a in "$@"; do
  s=${a%%:*}; lim=${LIM:-80}; [ "$a" != "$s" ] && lim=${a#*:}
  l=$(left); [ "$l" -lt 30 ] && { echo "SKIPPED $s (time)"; continue; }
  [ "$lim" -gt "$l" ] && lim=$l
  [ -f /tmp/base/kvbench ] && export BASE_BIN=/tmp/base/kvbench
  OUT=$R timeout $lim bash scripts/dev/$s.sh >$R/$s.console 2>&1; rc=$?
  echo "===== $s rc $rc [$((SECONDS - T0))s]"; tail -n ${TAILN:-22} $R/$s.console | cut -c1-200
done
l=$(left)
if [ "${SUITE:-1}" = 1 ] && [ "$l" -gt 60 ]; then
  KVBENCH_REQUIRE_GPU=1 KVBENCH_BIN=$PWD/kvbench timeout $((l - 10)) ./tests/run_tests --gpu >$R/suite.log 2>&1
  echo "===== GPU suite [$((SECONDS - T0))s]: $(tail -1 $R/suite.log)"; grep -E "FAIL|failed" $R/suite.log | head -8
fi
tar -C $OUT -czf $OUT/round.tgz r && rm -rf $R
