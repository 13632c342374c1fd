#!/usr/bin/env bash
# Install the Python side of kvbench (trace dumper, its test, plots) into a
# virtual environment at .venv in the repository root (KVBENCH_VENV overrides).
#
#   scripts/pydeps.sh           create/update .venv; a fast no-op when it is up to date
#   scripts/pydeps.sh --check   only report whether .venv is complete (exit 0 yes, 1 no)
#   scripts/pydeps.sh --force   reinstall the requirements even if .venv looks up to date
#
# What gets installed is scripts/requirements.txt (pinned). torch comes from PyPI,
# which only has the CUDA build for Linux x86_64: it pulls ~3 GB of nvidia-* wheels
# (about 5.7 GB installed) but runs fine on a machine without a GPU. There is no
# CPU-only torch on PyPI, and `pip install --no-deps torch` does not import
# (libtorch_cuda.so needs libcufile.so.0 and friends), so this is the light option
# that works: about 3 minutes on a 2-core machine from an empty pip cache.
# Exit status: 0 ok, 1 something could not be installed or imported.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${KVBENCH_VENV:-$ROOT/.venv}
REQ=$ROOT/scripts/requirements.txt
PY=${PYTHON:-python3}
STAMP=$VENV/.kvbench-pydeps
MODULES=(torch transformers accelerate gguf h5py numpy matplotlib)

say() { echo "pydeps: $*"; }
fail() { echo "pydeps: ERROR: $*" >&2; exit 1; }

mode=install
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  --force) mode=force ;;
  -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) fail "unknown argument '$1' (use --check, --force or nothing)" ;;
esac

[ -f "$REQ" ] || fail "$REQ is missing"
want=$(sha256sum "$REQ" | cut -d' ' -f1)

# cheap completeness test: stamp matches the requirements and every module is findable
have_all() {
  [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] || return 1
  "$VENV/bin/python" - "${MODULES[@]}" <<'EOF' >/dev/null 2>&1
import importlib.util, sys
sys.exit(0 if all(importlib.util.find_spec(m) for m in sys.argv[1:]) else 1)
EOF
}

if [ "$mode" != force ] && have_all; then
  say "$VENV is up to date ($(sed -n 's/^\(torch\|transformers\)==/\1 /p' "$REQ" | paste -sd, -)); nothing to do"
  exit 0
fi
if [ "$mode" = check ]; then
  say "$VENV is missing or incomplete: run scripts/pydeps.sh"
  exit 1
fi

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  command -v "$PY" >/dev/null || fail "$PY not found (set PYTHON=/path/to/python3.10+)"
  "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
    || fail "$PY is $("$PY" -V 2>&1); transformers needs Python >= 3.10 (set PYTHON=...)"
  say "creating virtual environment $VENV with $("$PY" -V 2>&1)"
  "$PY" -m venv "$VENV" || fail "'$PY -m venv' failed (on Debian: apt-get install python3-venv)"
fi

say "installing $(grep -v '^#' "$REQ" | grep -c .) pinned requirements from $REQ (torch pulls its nvidia-* wheels: ~3 GB download)"
# pip runs with its output in the log; a line every 20 s says it is alive and how far it got
"$VENV/bin/python" -m pip install --no-input --progress-bar off -r "$REQ" >"$VENV/pydeps-install.log" 2>&1 &
pip_pid=$!
while kill -0 "$pip_pid" 2>/dev/null; do
  for _ in $(seq 20); do kill -0 "$pip_pid" 2>/dev/null && sleep 1; done
  kill -0 "$pip_pid" 2>/dev/null || break
  last=$(grep -aoE '^(Collecting|Downloading|Installing collected packages)[^ ]* ?[^ ]*' "$VENV/pydeps-install.log" | tail -n 1)
  say "  ... $(( $(date +%s) - start ))s, $(du -sm "$VENV" 2>/dev/null | cut -f1) MB in $VENV${last:+; pip: $last}"
done
if ! wait "$pip_pid"; then
  tail -n 25 "$VENV/pydeps-install.log" >&2
  fail "pip could not install the requirements (full log: $VENV/pydeps-install.log)"
fi
grep -aE '^Successfully installed' "$VENV/pydeps-install.log" | cut -c1-400 || say "(all requirements were already installed)"

# real import test, including one torch op on the CPU
if ! "$VENV/bin/python" - <<'EOF'
import importlib, importlib.metadata, sys
mods = ["torch", "transformers", "accelerate", "gguf", "h5py", "numpy", "matplotlib"]
bad = []
for m in mods:
    try:
        mod = importlib.import_module(m)
        print(f"pydeps:   {m} {importlib.metadata.version(m)}")
    except Exception as e:
        bad.append(f"{m}: {type(e).__name__}: {e}")
if bad:
    for b in bad:
        print("pydeps: ERROR: cannot import " + b, file=sys.stderr)
    sys.exit(1)
import torch
x = torch.ones(4, 4)
assert float((x @ x).sum()) == 64.0
print(f"pydeps:   torch runs on the CPU (cuda available: {torch.cuda.is_available()})")
EOF
then
  fail "the installed packages do not import (see above)"
fi
echo "$want" >"$STAMP"
say "done in $(( $(date +%s) - start ))s; use $VENV/bin/python (e.g. $VENV/bin/python scripts/dump_trace.py --help)"
