#!/usr/bin/env python3
"""Print the text of a kvtrace file (its /tokens decoded) and a degeneration measure.

A dumped trace is only useful for retrieval while the model writes real text: once it loops, the
decode steps' queries repeat.  This prints the prompt's tail and the generated text, then, for every
window of --window generated tokens, the number of distinct tokens in it (the measure used in
scripts/TRACES.md: real text keeps ~70-130 distinct tokens per 256, a short loop falls to ~10-30), the
longest stretch repeating the one just before it (period <= 64 tokens) and the share of positions whose
next 16 tokens already occurred earlier in the generated text (copies and long-period loops, which keep
the distinct count high; quoting the prompt does not count).

  .venv/bin/python scripts/trace_text.py datasets/real/qwen2.5-1.5b-long-gen.h5 \\
      --tokenizer ~/.cache/kvbench/models/qwen2.5-coder-1.5b-instruct-q4_k_m-f32

--tokenizer defaults to the float32 conversion of make_traces.sh's model whose name matches the
trace's 'model' attribute.
"""

import argparse
import os
import sys

CACHE = os.environ.get("KVBENCH_CACHE", os.path.expanduser("~/.cache/kvbench/models"))
KNOWN = {  # trace 'model' attribute -> make_traces.sh's conversion directory
    "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M": "qwen2.5-coder-0.5b-instruct-q4_k_m-f32",
    "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M": "qwen2.5-coder-1.5b-instruct-q4_k_m-f32",
}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("--tokenizer", help="tokenizer directory (default: from the trace's model attribute)")
    p.add_argument("--window", type=int, default=256, help="generated tokens per window (default 256)")
    p.add_argument("--prompt-chars", type=int, default=300, help="characters of the prompt's end to show")
    p.add_argument("--no-text", action="store_true", help="only the per-window table")
    a = p.parse_args()
    import h5py
    import numpy as np
    with h5py.File(a.trace, "r") as f:
        if "tokens" not in f:
            sys.exit(f"trace_text: {a.trace}: no /tokens dataset")
        toks = f["tokens"][...].astype(np.int64)
        P = int(f.attrs["prefill_len"])
        model = f.attrs.get("model", b"")
        model = model.decode() if isinstance(model, bytes) else str(model)
    tdir = a.tokenizer or (os.path.join(CACHE, KNOWN[model]) if model in KNOWN else None)
    if not tdir or not os.path.isdir(tdir):
        sys.exit(f"trace_text: no tokenizer for model {model!r}: pass --tokenizer DIR")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tdir)
    gen = toks[P:]
    if not a.no_text:
        print(f"=== {a.trace}: model {model}, T={len(toks)} P={P}, {len(gen)} generated")
        print(f"=== prompt (last {a.prompt_chars} chars)")
        print(tok.decode(toks[:P])[-a.prompt_chars:])
        print("=== generated")
        print(tok.decode(gen))
        print("=== end")
    N = 16
    seen, rep16 = set(), np.zeros(len(gen), dtype=bool)
    for i in range(len(gen) - N + 1):
        key = gen[i:i + N].tobytes()
        rep16[i] = key in seen
        seen.add(key)
    first = int(np.argmax(rep16)) if rep16.any() else -1
    print(f"window  positions        distinct  longest_repeat  repeated_16gram_share")
    for w0 in range(0, len(gen), a.window):
        w = gen[w0:w0 + a.window]
        # longest stretch (in tokens) inside the window that equals the stretch just before it
        best = 0
        for period in range(1, 65):
            run = 0
            for i in range(max(period, w0), w0 + len(w)):
                run = run + 1 if gen[i] == gen[i - period] else 0
                best = max(best, run)
        share = rep16[w0:w0 + len(w)].mean()
        print(f"{w0 // a.window:6d}  {P + w0:6d}-{P + w0 + len(w) - 1:6d}  {len(set(w.tolist())):8d}  {best:14d}"
              f"  {share:21.2f}")
    if first >= 0:
        print(f"first repeated {N}-gram of generated text at position {P + first} (generated token {first})")
    else:
        print(f"no {N}-gram of the generated text repeats")
    return 0


if __name__ == "__main__":
    sys.exit(main())
