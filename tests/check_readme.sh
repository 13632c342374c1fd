#!/usr/bin/env bash
# check_readme.sh: numbers and names in README.md that the program
# determines, checked against the program (issue 16, point 5). Run by the
# test runner (test readme_agrees_with_program) from the repository root
# with KVBENCH_BIN and a scratch directory; prints each disagreement.
#   1. every "N tests" / "N GPU tests" whose sentence speaks of the GPU
#      equals the number of KV_NEEDS_GPU tests in tests/run_tests.c;
#   2. every key kvbench writes into summary.json (top level, "host",
#      "protocol", and a method's object) is named in the README.
# Exit 0 when they agree, 1 otherwise.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${KVBENCH_BIN:-$root/kvbench}
tmp=${1:-$(mktemp -d)}
readme=$root/README.md
[ -f "$readme" ] || { echo "check_readme.sh: $readme not found" >&2; exit 1; }
bad=0

ngpu=$(grep -cE '^\s*X\([a-z0-9_]+, *KV_NEEDS_GPU\)' "$root/tests/run_tests.c")
# The README as one line; each "N tests" / "N GPU tests" with the 160 characters before it.
while IFS=$'\t' read -r n ctx; do
  case "$ctx" in
    *GPU*) [ "$n" = "$ngpu" ] || { echo "README.md: \"$n tests\" about the GPU tests, but tests/run_tests.c has $ngpu: ...${ctx: -80}" >&2; bad=1; } ;;
  esac
done < <(tr '\n' ' ' <"$readme" | python3 -c '
import re, sys
t = sys.stdin.read()
for m in re.finditer(r"\b(\d+)\s+(?:GPU\s+)?tests\b", t):
    print(m.group(1) + "\t" + t[max(0, m.start() - 160):m.end()].replace("\t", " "))
')

mkdir -p "$tmp"
out=$tmp/readme-run
if ! "$bin" run --trace "$root/datasets/demo.h5" --method exact,pariskv --max-steps 2 --device cpu --out "$out" \
     --force --quiet 2>"$tmp/readme-run.err"; then
  cat "$tmp/readme-run.err" >&2; echo "check_readme.sh: kvbench run failed" >&2; exit 1
fi
missing=$(python3 - "$out/summary.json" "$readme" <<'PY'
import json, re, sys
s = json.load(open(sys.argv[1]))
text = open(sys.argv[2]).read()
keys = set(s) | set(s["protocol"]) | set(s.get("host", {})) | set(s["methods"][0])
print(" ".join(sorted(k for k in keys if not re.search(r"\b" + re.escape(k) + r"\b", text))))
PY
)
[ -z "$missing" ] || { echo "README.md: summary.json keys kvbench writes but the README never names: $missing" >&2; bad=1; }
exit $bad
