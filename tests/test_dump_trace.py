#!/usr/bin/env python3
"""End-to-end test of scripts/dump_trace.py on tiny random models.

For each supported family (Llama, Qwen2, Qwen3, Mistral, Gemma, Gemma2, Gemma3)
a randomly initialised 2-layer GQA model (4 query heads, 2 kv heads, head_dim 16)
and a small byte-level BPE tokenizer are built and saved locally (nothing is
downloaded); dump_trace.py runs on it in a subprocess with --check, and the
file is then checked against the kvtrace v1 spec with h5py and against the
model's own KV cache (recomputed here in-process).  One more Qwen2 case has the
head shape of Qwen2.5-1.5B (12 query heads, 2 kv heads, head_dim 128, RoPE base
1e6).  If KVBENCH_BIN names the kvbench binary, `$KVBENCH_BIN info FILE` must
exit 0 and report the heads and head_dim, and for the 128-dim case a short
`$KVBENCH_BIN run` (exact, pariskv) must evaluate every query head.  KVBENCH_TEST_DEVICE=cuda
runs the dumper on that device (in float32, so the same tolerances hold).

Run:  python3 tests/test_dump_trace.py   (re-executes itself with .venv/bin/python
      when the current interpreter lacks torch and scripts/pydeps.sh made .venv)
Exit: 0 all passed, 1 a failure, 77 skipped (torch/transformers not importable).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DUMPER = os.path.join(ROOT, "scripts", "dump_trace.py")
TEXT = os.path.join(ROOT, "datasets", "texts", "us_constitution.txt")
SKIP = 77


def need_imports():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import h5py  # noqa: F401
        import numpy  # noqa: F401
        return None
    except Exception as e:  # ImportError, or a broken install raising OSError
        return f"{type(e).__name__}: {e}"


why = need_imports()
if why:
    venv_py = os.path.join(ROOT, ".venv", "bin", "python")
    if os.path.exists(venv_py) and os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(ROOT, ".venv")) \
            and not os.environ.get("KVBENCH_TEST_REEXEC"):
        os.environ["KVBENCH_TEST_REEXEC"] = "1"
        os.execv(venv_py, [venv_py] + sys.argv)
    print(f"SKIP test_dump_trace: cannot import torch/transformers/h5py/numpy ({why}); run scripts/pydeps.sh")
    sys.exit(SKIP)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
import h5py  # noqa: E402

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

HQ, HKV, D, HIDDEN = 4, 2, 16, 64
D128 = (12, 2, 128)      # (query heads, kv heads, head_dim) of the qwen2-d128 case, as Qwen2.5-1.5B
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def make_tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    with open(TEXT, encoding="utf-8") as f:
        text = f.read()
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(text.split("\n\n"), trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)
    return tok


def configs(vocab, bos, eos, pad):
    from transformers import (Gemma2Config, Gemma3TextConfig, GemmaConfig, LlamaConfig, MistralConfig,
                              Qwen2Config, Qwen3Config)
    common = dict(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=HQ, num_key_value_heads=HKV, head_dim=D, max_position_embeddings=512,
                  bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, tie_word_embeddings=False)
    return [
        # name, config, dumper args, expected softmax scale, sliding window of layer 0
        ("llama", LlamaConfig(**common), ["--prompt-file", TEXT, "--skip-comment-lines",
                                          "--max-prompt-tokens", "40", "--prefill-chunk", "16"], D ** -0.5, None),
        ("qwen2", Qwen2Config(**common), ["--question", "What is seventeen times twenty three?",
                                          "--temperature", "0.8", "--top-p", "0.9", "--top-k", "50",
                                          "--seed", "7", "--prefill-chunk", "5"], D ** -0.5, None),
        ("qwen3", Qwen3Config(**common), ["--prompt-file", TEXT, "--skip-comment-lines", "--question",
                                          "Summarise.", "--max-prompt-tokens", "48", "--prefill-chunk", "7",
                                          "--temperature", "1.0", "--seed", "1", "--repetition-penalty", "1.2"],
         D ** -0.5, None),
        ("mistral", MistralConfig(**common, sliding_window=None),
         ["--question", "Name the three branches of government.", "--prefill-chunk", "4"], D ** -0.5, None),
        ("gemma", GemmaConfig(**common), ["--question", "Who may declare war?", "--prefill-chunk", "8"],
         D ** -0.5, None),
        # gemma2 soft-caps attention logits: the dumper wraps eager attention and --check applies the cap
        ("gemma2", Gemma2Config(**common, query_pre_attn_scalar=24, sliding_window=16,
                                layer_types=["sliding_attention", "full_attention"]),
         ["--question", "How is the President elected?", "--prefill-chunk", "6"], 24 ** -0.5, 16),
        # gemma3: q/k norm, query_pre_attn_scalar != head_dim, a sliding-window layer shorter than the trace
        ("gemma3", Gemma3TextConfig(**common, query_pre_attn_scalar=24, sliding_window=16,
                                    layer_types=["sliding_attention", "full_attention"]),
         ["--question", "What does the First Amendment protect?", "--prefill-chunk", "9"], 24 ** -0.5, 16),
        # Qwen2.5-1.5B's attention shape: 128-dim heads, GQA group 6, RoPE base 1e6 (hidden kept small)
        ("qwen2-d128", Qwen2Config(**dict(common, num_attention_heads=D128[0], num_key_value_heads=D128[1],
                                          head_dim=D128[2]), rope_parameters={"rope_type": "default",
                                                                              "rope_theta": 1e6}),
         ["--prompt-file", TEXT, "--skip-comment-lines", "--question", "Who may be elected President?",
          "--max-prompt-tokens", "96", "--prefill-chunk", "32", "--temperature", "0.7", "--seed", "3"],
         D128[2] ** -0.5, None),
    ]


class Fail(Exception):
    pass


def expect(cond, msg):
    if not cond:
        raise Fail(msg)


def check_spec(path, n_new, scale, dims=(D, HQ, HKV)):
    with h5py.File(path, "r") as f:
        a = f.attrs
        for k in ("kvtrace_version", "model", "description", "head_dim", "num_q_heads", "num_kv_heads",
                  "num_tokens", "prefill_len", "rope", "softmax_scale"):
            expect(k in a, f"root attribute {k} missing")
        expect(int(a["kvtrace_version"]) == 1, "kvtrace_version != 1")
        for k in ("model", "description", "rope"):
            tid = a.get_id(k).get_type()
            expect(isinstance(tid, h5py.h5t.TypeStringID) and not tid.is_variable_str()
                   and tid.get_cset() == h5py.h5t.CSET_ASCII, f"attribute {k} is not a fixed-length ASCII string")
            expect(isinstance(a[k], bytes) and a[k], f"attribute {k} is not a non-empty string")
        expect(a["rope"] == b"applied", f"rope is {a['rope']!r}")
        d, hq, hkv = int(a["head_dim"]), int(a["num_q_heads"]), int(a["num_kv_heads"])
        t, p = int(a["num_tokens"]), int(a["prefill_len"])
        expect((d, hq, hkv) == dims, f"head_dim/num_q_heads/num_kv_heads = {(d, hq, hkv)}, expected {dims}")
        expect(1 <= p <= t and t == p + n_new, f"num_tokens {t}, prefill_len {p}, expected {n_new} generated")
        expect(abs(float(a["softmax_scale"]) - scale) < 1e-9, f"softmax_scale {a['softmax_scale']} != {scale}")
        expect(set(f.keys()) == {"tokens", "layers"}, f"unexpected root members {sorted(f.keys())}")
        tok = f["tokens"]
        expect(tok.dtype == np.int32 and tok.shape == (t,), f"/tokens {tok.dtype} {tok.shape}")
        expect(set(f["layers"].keys()) == {"L0", "L1"}, f"layers {sorted(f['layers'].keys())}")
        for i in (0, 1):
            g = f[f"layers/L{i}"]
            expect(int(g.attrs["layer_index"]) == i, f"L{i} layer_index {g.attrs.get('layer_index')}")
            for name, h in (("q", hq), ("k", hkv), ("v", hkv)):
                ds = g[name]
                expect(ds.dtype == np.float16, f"L{i}/{name} dtype {ds.dtype}")
                expect(ds.shape == (h, t, d), f"L{i}/{name} shape {ds.shape}, expected {(h, t, d)}")
                x = ds[...]
                expect(np.isfinite(x).all(), f"L{i}/{name} has non-finite values")
                expect(float(np.abs(x).max()) > 0, f"L{i}/{name} is all zeros")
        return t, p, f["tokens"][...], {i: (f[f"layers/L{i}/k"][...], f[f"layers/L{i}/v"][...]) for i in (0, 1)}


def check_against_cache(model_dir, tokens, kv, window):
    """Independent check: the model's own KV cache after a plain forward over all tokens."""
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    m.eval()
    with torch.inference_mode():
        out = m(input_ids=torch.from_numpy(tokens.astype(np.int64))[None], use_cache=True)
    cache = out.past_key_values
    for i in (0, 1):
        layer = cache.layers[i]
        ck, cv = layer.keys[0].numpy(), layer.values[0].numpy()  # [Hkv, n, D]
        n = ck.shape[1]
        expect(n <= len(tokens), f"L{i}: cache has {n} positions")
        if i == 0 and window is None:
            expect(n == len(tokens), f"L{i}: cache has {n} positions, trace {len(tokens)}")
        fk, fv = kv[i][0][:, -n:].astype(np.float32), kv[i][1][:, -n:].astype(np.float32)
        for name, a, b in (("k", fk, ck), ("v", fv, cv)):
            err = np.abs(a - b).max() / max(1e-6, np.abs(b).max())
            expect(err < 2e-3, f"L{i}/{name} differs from the model's cache (rel {err:.2e})")


def run_case(name, cfg, extra, scale, window, work, tok):
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    mdir = os.path.join(work, name)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(mdir)
    tok.save_pretrained(mdir)
    out = os.path.join(work, f"{name}.h5")
    n_new = 12
    cmd = [sys.executable, DUMPER, "--model", mdir, "--layers", "0,1", "--out", out, "--max-new-tokens",
           str(n_new), "--ignore-eos", "--check", "--check-positions", "12"] + extra
    dev = os.environ.get("KVBENCH_TEST_DEVICE")
    if dev:
        cmd += ["--device", dev, "--dtype", "float32"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise Fail(f"dump_trace exit {r.returncode}: {(r.stderr + r.stdout).strip()[-1500:]}")
    expect("check passed" in r.stdout, f"no 'check passed' in output: {r.stdout[-500:]}")
    worst = [ln for ln in r.stdout.splitlines() if ln.startswith("check passed")][0].split()[-1]
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    if name == "qwen2-d128":
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta")
        expect((hq, hkv, d) == D128 and theta == 1e6, f"{name}: config has {(hq, hkv, d)}, rope_theta {theta}")
    t, p, tokens, kv = check_spec(out, n_new, scale, (d, hq, hkv))
    check_against_cache(mdir, tokens, kv, window)
    with h5py.File(out, "r") as f:
        desc = f.attrs["description"].decode()
    for want in (f"{hq} query heads, {hkv} kv heads, head_dim {d}", "Generation settings: max new tokens 12",
                 f"prompt {p} tokens", "ignore-eos yes", "prefill chunk ",
                 "system prompt" if "--system" in extra else "no --system given" if "--question" in extra
                 else "no system prompt"):
        expect(want in desc, f"description lacks {want!r}: {desc[-600:]!r}")
    bin_ = os.environ.get("KVBENCH_BIN")
    note = ""
    if bin_:
        r2 = subprocess.run([bin_, "info", out], capture_output=True, text=True, timeout=60)
        expect(r2.returncode == 0, f"{bin_} info exit {r2.returncode}: {(r2.stderr + r2.stdout).strip()[-800:]}")
        heads = f"{hq} query, {hkv} kv (group {hq // hkv})"
        expect(heads in r2.stdout and f"head_dim (D)  {d}" in r2.stdout,
               f"{bin_} info does not report '{heads}' and head_dim {d}:\n{r2.stdout}")
        note = ", kvbench info ok"
        if d == 128:
            note += run_kvbench(bin_, out, work, name, hq, t - p)
    return f"T={t} P={p}, check max rel err {worst}{note}"


def run_kvbench(bin_, trace, work, name, hq, n_dec):
    """A short `kvbench run` on the trace: exact must find all of its own top-k (recall 1) and both
    methods must have evaluated every query head at every decode step (rows = steps * Hq)."""
    import json
    rdir = os.path.join(work, f"{name}-run")
    cmd = [bin_, "run", "--trace", trace, "--layer", "L1", "--method", "exact,pariskv", "--k", "8",
           "--sink", "2", "--local", "8", "--device", "cpu", "--out", rdir, "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    expect(r.returncode == 0, f"{' '.join(cmd)} exit {r.returncode}: {(r.stderr + r.stdout).strip()[-800:]}")
    with open(os.path.join(rdir, "summary.json")) as f:
        ms = {m["method"]: m for m in json.load(f)["methods"]}
    expect(set(ms) == {"exact", "pariskv"}, f"summary.json methods {sorted(ms)}")
    expect(ms["exact"]["recall"] == 1, f"exact recall {ms['exact']['recall']} != 1")
    for m in ms.values():
        expect(m["rows"] == n_dec * hq, f"{m['method']}: {m['rows']} rows, expected {n_dec} steps x {hq} heads")
        expect(0 <= m["recall"] <= 1, f"{m['method']}: recall {m['recall']}")
    return f", kvbench run exact+pariskv ok (pariskv recall {ms['pariskv']['recall']:.3f})"


def run_errors(work, tok):
    """Bad arguments must fail with a message on stderr and a non-zero exit."""
    mdir = os.path.join(work, "llama")
    cases = [
        ("no prompt", ["--model", mdir, "--layers", "0", "--out", os.path.join(work, "e1.h5")]),
        ("bad layers", ["--model", mdir, "--layers", "0,x", "--question", "hi", "--out", os.path.join(work, "e2.h5")]),
        ("layer out of range", ["--model", mdir, "--layers", "5", "--question", "hi",
                                "--out", os.path.join(work, "e3.h5")]),
        ("missing model", ["--model", os.path.join(work, "nope"), "--layers", "0", "--question", "hi",
                           "--out", os.path.join(work, "e4.h5")]),
        ("top-p out of range", ["--model", mdir, "--layers", "0", "--question", "hi", "--top-p", "1.5",
                                "--out", os.path.join(work, "e5.h5")]),
        ("bad repetition penalty", ["--model", mdir, "--layers", "0", "--question", "hi",
                                    "--repetition-penalty", "0", "--out", os.path.join(work, "e6.h5")]),
    ]
    for what, args in cases:
        r = subprocess.run([sys.executable, DUMPER] + args, capture_output=True, text=True, timeout=300)
        expect(r.returncode != 0, f"{what}: exit 0")
        expect("error" in r.stderr, f"{what}: no error message on stderr ({r.stderr[-300:]!r})")
        expect(not any(fn.startswith("e") and fn.endswith(".h5") for fn in os.listdir(work)),
               f"{what}: an output file was left behind")
    # a failing --check (tolerance below float16 rounding) must leave nothing under --out: make_traces.sh
    # takes an existing output as finished
    bad = os.path.join(work, "checkfail.h5")
    r = subprocess.run([sys.executable, DUMPER, "--model", mdir, "--layers", "0", "--question", "hi",
                        "--max-new-tokens", "3", "--check", "--check-tol", "1e-12", "--out", bad],
                       capture_output=True, text=True, timeout=300)
    expect(r.returncode == 3, f"--check-tol 1e-12: exit {r.returncode}, expected 3 ({r.stderr[-300:]!r})")
    expect(not os.path.exists(bad), "a trace that failed --check was left under --out")
    expect(os.path.exists(bad + ".check-failed"), "the trace that failed --check was not kept as .check-failed")
    expect(not any(".tmp." in fn for fn in os.listdir(work)), "a temporary file was left behind")
    # --save-converted: a loadable float32 copy with the identity sidecar
    conv = os.path.join(work, "converted")
    r = subprocess.run([sys.executable, DUMPER, "--model", mdir, "--save-converted", conv],
                       capture_output=True, text=True, timeout=300)
    expect(r.returncode == 0, f"--save-converted exit {r.returncode}: {r.stderr[-800:]}")
    for fn in ("config.json", "kvtrace_source.json", "tokenizer.json"):
        expect(os.path.isfile(os.path.join(conv, fn)), f"--save-converted wrote no {fn}")
    r = subprocess.run([sys.executable, DUMPER, "--model", mdir, "--save-converted", conv],
                       capture_output=True, text=True, timeout=300)
    expect(r.returncode != 0 and "exists" in r.stderr, "--save-converted overwrote without --force")
    return f"{len(cases)} bad invocations rejected, failed --check leaves no output, --save-converted ok"


def main():
    t0 = time.time()
    work = tempfile.mkdtemp(prefix="kvbench-dumptest-")
    passed = failed = 0
    try:
        tok = make_tokenizer(os.path.join(work, "tok"))
        vocab = len(tok)
        cases = configs(vocab, tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
        only = set(sys.argv[1:])
        for name, cfg, extra, scale, window in cases:
            if only and name not in only:
                continue
            t1 = time.time()
            try:
                msg = run_case(name, cfg, extra, scale, window, work, tok)
                print(f"ok   {name}: {msg} ({time.time() - t1:.1f}s)", flush=True)
                passed += 1
            except Fail as e:
                print(f"FAIL {name}: {e}", flush=True)
                failed += 1
            except Exception:
                print(f"FAIL {name}: {traceback.format_exc()}", flush=True)
                failed += 1
        if not only or "errors" in only:
            t1 = time.time()
            try:
                if not os.path.isdir(os.path.join(work, "llama")):
                    run_case(*cases[0], work, tok)
                    os.remove(os.path.join(work, "llama.h5"))
                for fn in os.listdir(work):
                    if fn.endswith(".h5"):
                        os.rename(os.path.join(work, fn), os.path.join(work, "out_" + fn))
                print(f"ok   errors: {run_errors(work, tok)} ({time.time() - t1:.1f}s)", flush=True)
                passed += 1
            except Fail as e:
                print(f"FAIL errors: {e}", flush=True)
                failed += 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"test_dump_trace: total {time.time() - t0:.0f}s")
    print(f"test_dump_trace: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
