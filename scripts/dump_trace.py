#!/usr/bin/env python3
"""Dump a kvtrace v1 file (see TRACE_FORMAT.md) from a real causal LM.

The model is run by transformers itself; the query, key and value of the
chosen layers are captured by a registered attention function that wraps the
stock one (sdpa or eager), so q and k are exactly what the attention kernel
receives: after any q/k norm and after RoPE.  Nothing of the model is
re-implemented here.

Model sources: a hub name, a local directory (safetensors / bin), or a local
GGUF file (dequantised by transformers on load; needs `gguf` and `accelerate`).

Examples:
  dump_trace.py --model ~/.cache/kvbench/models/qwen.gguf \\
      --prompt-file datasets/texts/us_constitution.txt --skip-comment-lines \\
      --question "Summarise this document." --max-new-tokens 256 \\
      --layers 3,12,20 --out /tmp/t.h5 --check
  dump_trace.py --model some/dir --question "What is 17*23?" --max-new-tokens 64 \\
      --layers 0 --out q.h5
"""

import argparse
import math
import os
import sys
import time

PROG = "dump_trace"
IDENTITY_FILE = "kvtrace_source.json"


def die(msg, code=2):
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    sys.exit(code)


def warn(msg):
    print(f"{PROG}: warning: {msg}", file=sys.stderr)


def log(msg):
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------
# arguments


def parse_layers(s):
    if s.strip().lower() == "all":
        return "all"
    out = []
    for part in s.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            if not (a.isdigit() and b.isdigit()) or int(a) > int(b):
                raise ValueError(f"bad layer range '{part}'")
            out.extend(range(int(a), int(b) + 1))
        elif part.isdigit() or (part[0] in "Ll" and part[1:].isdigit()):
            out.append(int(part.lstrip("Ll")))
        else:
            raise ValueError(f"bad layer index '{part}'")
    if not out:
        raise ValueError("no layers given")
    return sorted(set(out))


def build_parser():
    p = argparse.ArgumentParser(
        prog="dump_trace.py",
        description="Run a causal LM (transformers) on a prompt, generate, and write the q/k/v of "
        "chosen layers as a kvtrace v1 HDF5 file.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:" + __doc__.split("Examples:", 1)[1],
    )
    m = p.add_argument_group("model")
    m.add_argument("--model", required=True,
                   help="hub name, local model directory, or a local GGUF file")
    m.add_argument("--gguf-file", help="GGUF file name inside the --model directory")
    m.add_argument("--tokenizer", help="load the tokenizer from here instead of --model")
    m.add_argument("--model-name", help="value of the 'model' attribute (default: from GGUF metadata or path)")
    m.add_argument("--device", default="cpu", help="torch device: cpu (default), cuda, cuda:1, ...")
    m.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="compute dtype (auto: float32 on cpu, bfloat16 on cuda)")
    m.add_argument("--attn-base", default="auto", choices=["auto", "sdpa", "eager"],
                   help="attention function the recorder wraps (auto: sdpa, eager if the model uses logit softcapping)")
    m.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: all cores)")

    pr = p.add_argument_group("prompt")
    pr.add_argument("--prompt-file", help="text file; alone it is the raw prompt, with --question it is a "
                    "document placed before the question in a chat-templated user turn")
    pr.add_argument("--skip-comment-lines", action="store_true",
                    help="drop leading lines of --prompt-file that start with '#' (a source header)")
    pr.add_argument("--question", help="user message, formatted with the tokenizer's chat template")
    pr.add_argument("--system", help="system message for the chat template (default: the template's own)")
    pr.add_argument("--no-chat-template", action="store_true",
                    help="never use the chat template: the prompt is the plain text")
    pr.add_argument("--max-prompt-tokens", type=int, default=0,
                    help="truncate the document (or the raw prompt) so the prompt has at most this many tokens")

    g = p.add_argument_group("generation")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--ignore-eos", action="store_true",
                   help="ban end-of-sequence tokens from being sampled, so generation runs the full budget")
    g.add_argument("--temperature", type=float, default=0.0, help="0 (default) = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="divide positive / multiply negative logits of every token already in the sequence "
                   "(transformers' semantics; Qwen2.5's own default is 1.05); 1 = off")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--prefill-chunk", type=int, default=512,
                   help="prompt tokens per forward pass during prefill (bounds memory)")

    o = p.add_argument_group("output")
    o.add_argument("--layers", type=parse_layers,
                   help="comma-separated layer indices (e.g. 3,14,20), ranges (2-4) or 'all'")
    o.add_argument("--out", help="output .h5 file")
    o.add_argument("--save-converted", metavar="DIR",
                   help="instead of dumping: load --model (e.g. a GGUF file, whose parsing and dequantisation "
                   "take minutes on a small CPU), save it with its tokenizer as a float32 safetensors "
                   f"directory DIR (plus {IDENTITY_FILE}, the GGUF's identity for later descriptions) and exit")
    o.add_argument("--store-dtype", default="float16", choices=["float16", "float32"])
    o.add_argument("--no-values", action="store_true", help="do not store v")
    o.add_argument("--compression", default="gzip", choices=["gzip", "none"])
    o.add_argument("--description", default="", help="extra text appended to the description attribute")
    o.add_argument("--force", action="store_true", help="overwrite --out if it exists")

    c = p.add_argument_group("check")
    c.add_argument("--check", action="store_true",
                   help="recompute softmax(scale q k^T) v from the stored q/k/v at sampled positions and "
                   "compare with the model's own attention output; exit 3 if off")
    c.add_argument("--check-positions", type=int, default=32, help="positions sampled per layer")
    c.add_argument("--check-tol", type=float, default=None,
                   help="max relative error (default 1e-2 for float16 storage, 1e-4 for float32)")
    return p


def validate(args):
    if args.save_converted:
        if os.path.exists(args.save_converted) and not args.force:
            die(f"--save-converted {args.save_converted} exists (use --force to overwrite)")
        parent = os.path.dirname(os.path.abspath(args.save_converted))
        if not os.path.isdir(parent):
            die(f"--save-converted {args.save_converted}: directory {parent} does not exist")
    else:
        if args.layers is None:
            die("--layers is required")
        if args.out is None:
            die("--out is required")
    validate_model(args)
    if args.save_converted:
        return
    if args.prompt_file is None and args.question is None:
        die("give --prompt-file and/or --question")
    if args.prompt_file is not None and not os.path.isfile(args.prompt_file):
        die(f"--prompt-file {args.prompt_file}: no such file")
    if args.question is not None and not args.question.strip():
        die("--question is empty")
    if args.max_new_tokens < 0:
        die("--max-new-tokens must be >= 0")
    if args.prefill_chunk < 1:
        die("--prefill-chunk must be >= 1")
    if args.max_prompt_tokens < 0:
        die("--max-prompt-tokens must be >= 0")
    if not (args.temperature >= 0 and math.isfinite(args.temperature)):
        die("--temperature must be >= 0")
    if not (0 < args.top_p <= 1):
        die("--top-p must be in (0, 1]")
    if args.top_k < 0:
        die("--top-k must be >= 0")
    if not (args.repetition_penalty > 0 and math.isfinite(args.repetition_penalty)):
        die("--repetition-penalty must be > 0")
    if args.check and args.no_values:
        die("--check needs values (drop --no-values)")
    if args.check_positions < 1:
        die("--check-positions must be >= 1")
    if args.threads < 0:
        die("--threads must be >= 0")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        die(f"--out {args.out}: directory {out_dir} does not exist")
    if os.path.exists(args.out) and not args.force:
        die(f"--out {args.out} exists (use --force to overwrite)")


def validate_model(args):
    if args.gguf_file and not os.path.isdir(args.model):
        die("--gguf-file needs --model to be a directory")
    if os.path.isfile(args.model):
        with open(args.model, "rb") as f:
            if f.read(4) != b"GGUF":
                die(f"--model {args.model}: a file, but not a GGUF file (pass a model directory instead)")
    elif not os.path.isdir(args.model) and (args.model.startswith((".", "/", "~")) or args.model.count("/") > 1):
        die(f"--model {args.model}: no such file or directory")
    if args.gguf_file and not os.path.isfile(os.path.join(args.model, args.gguf_file)):
        die(f"--gguf-file {args.gguf_file}: not found in {args.model}")


# ----------------------------------------------------------------------------
# GGUF metadata (identity and quantisation, for the description)


def gguf_identity(path):
    info = {}
    try:
        import gguf
        r = gguf.GGUFReader(path)

        def field(name):
            f = r.fields.get(name)
            if f is None:
                return None
            try:
                return f.contents()
            except Exception:
                return None

        for k in ("general.name", "general.architecture", "general.size_label", "general.basename",
                  "general.finetune"):
            v = field(k)
            if v is not None:
                info[k] = v
        ft = field("general.file_type")
        if ft is not None:
            try:
                info["file_type"] = gguf.LlamaFileType(int(ft)).name.replace("MOSTLY_", "")
            except Exception:
                info["file_type"] = f"file_type={ft}"
        counts = {}
        for t in r.tensors:
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        info["tensor_types"] = ", ".join(f"{k}x{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
        info["gguf_file"] = os.path.basename(path)
    except Exception as e:  # identity is informative only
        warn(f"could not read GGUF metadata of {path}: {e}")
    return info


def ascii_attr(s):
    """A string attribute as a fixed-length ASCII HDF5 string: C readers that read strings with
    a default (ASCII) memory type cannot convert h5py's default variable-length UTF-8 ones."""
    import numpy as np
    return np.bytes_(s.encode("ascii", "backslashreplace"))


# ----------------------------------------------------------------------------
# output writer: per-layer resizable HDF5 datasets, filled as the run goes


class TraceWriter:
    FLUSH_TOKENS = 256

    def __init__(self, path, store_dtype, compression, with_values):
        import h5py
        import numpy as np
        self.np = np
        self.path = path
        self.f = h5py.File(path, "w", rdcc_nbytes=32 << 20, rdcc_nslots=10007)
        self.dtype = np.float16 if store_dtype == "float16" else np.float32
        self.compression = None if compression == "none" else "gzip"
        self.with_values = with_values
        self.layers = {}     # layer -> dict(ds=..., buf=[...], n_written, n_buffered)
        self.fp16_clip = 0

    def _create(self, layer, hq, hkv, d):
        g = self.f.create_group(f"layers/L{layer}")
        g.attrs["layer_index"] = self.np.int32(layer)
        ct = 1024 if d <= 128 else 512
        ds = {}
        names = ("q", "k", "v") if self.with_values else ("q", "k")
        for name in names:
            h = hq if name == "q" else hkv
            ds[name] = g.create_dataset(
                name, shape=(h, 0, d), maxshape=(h, None, d), dtype=self.dtype, chunks=(1, ct, d),
                compression=self.compression, compression_opts=4 if self.compression else None)
        self.layers[layer] = {"ds": ds, "buf": {n: [] for n in names}, "written": 0, "buffered": 0}

    def append(self, layer, pos0, q, k, v):
        """q [Hq, n, D], k/v [Hkv, n, D] as float32 numpy, positions pos0..pos0+n-1."""
        st = self.layers.get(layer)
        if st is None:
            self._create(layer, q.shape[0], k.shape[0], q.shape[2])
            st = self.layers[layer]
        if pos0 != st["written"] + st["buffered"]:
            raise RuntimeError(f"layer {layer}: got position {pos0}, expected {st['written'] + st['buffered']}")
        arrs = {"q": q, "k": k}
        if self.with_values:
            arrs["v"] = v
        for name, a in arrs.items():
            if not self.np.isfinite(a).all():
                raise FloatingPointError(f"layer {layer} {name}: non-finite values at positions {pos0}..")
            if self.dtype == self.np.float16 and float(self.np.abs(a).max()) > 65000.0:
                raise OverflowError(f"layer {layer} {name}: |value| > 65000 does not fit float16; "
                                    "use --store-dtype float32")
            st["buf"][name].append(a.astype(self.dtype))
        st["buffered"] += q.shape[1]
        if st["buffered"] >= self.FLUSH_TOKENS:
            self._flush(layer)

    def _flush(self, layer):
        st = self.layers[layer]
        n = st["buffered"]
        if n == 0:
            return
        a0 = st["written"]
        for name, parts in st["buf"].items():
            block = parts[0] if len(parts) == 1 else self.np.concatenate(parts, axis=1)
            ds = st["ds"][name]
            ds.resize(a0 + n, axis=1)
            ds[:, a0:a0 + n, :] = block
            st["buf"][name] = []
        st["written"] += n
        st["buffered"] = 0

    def finish(self, attrs, tokens):
        for layer in self.layers:
            self._flush(layer)
        t = len(tokens)
        for layer, st in self.layers.items():
            if st["written"] != t:
                raise RuntimeError(f"layer {layer}: {st['written']} positions recorded, {t} tokens")
        self.f.create_dataset("tokens", data=self.np.asarray(tokens, dtype=self.np.int32))
        for k, v in attrs.items():
            self.f.attrs[k] = ascii_attr(v) if isinstance(v, str) else v
        self.f.close()

    def abort(self):
        try:
            self.f.close()
        except Exception:
            pass


# ----------------------------------------------------------------------------
# recorder: the attention function registered with transformers


class Recorder:
    def __init__(self, layers, base_fn, writer, num_kv_heads, check_set):
        self.layers = set(layers)
        self.base_fn = base_fn
        self.writer = writer
        self.num_kv_heads = num_kv_heads
        self.check_set = check_set      # positions whose attention output is kept for --check
        self.pos0 = 0                   # position of the first query of the current forward
        self.seen = {}                  # layer -> dict(scale, hq, hkv, d, sliding_window, softcap)
        self.outputs = {l: {} for l in layers}
        self.last_output = {}
        self.calls = 0

    def __call__(self, module, query, key, value, attention_mask, *args, **kwargs):
        out, weights = self.base_fn(module, query, key, value, attention_mask, *args, **kwargs)
        layer = getattr(module, "layer_idx", None)
        if layer in self.layers:
            self._record(layer, module, query, key, value, out, kwargs)
        return out, weights

    def _record(self, layer, module, query, key, value, out, kwargs):
        import torch
        self.calls += 1
        if query.shape[0] != 1:
            raise RuntimeError("batch size must be 1")
        n = query.shape[2]
        hq, d = query.shape[1], query.shape[3]
        k = key[0, :, -n:, :]
        v = value[0, :, -n:, :]
        hk = k.shape[0]
        want = self.num_kv_heads or hk
        if hk != want:
            # the attention function received k/v already repeated for GQA: keep one copy per kv head
            if hk % want or hq % want:
                raise RuntimeError(f"layer {layer}: {hk} key heads, expected {want}")
            grp = hk // want
            kk = k.reshape(want, grp, n, -1)
            if not torch.equal(kk, kk[:, :1].expand_as(kk)):
                raise RuntimeError(f"layer {layer}: {hk} key heads are not {want} repeated groups")
            k = kk[:, 0]
            v = v.reshape(want, grp, n, -1)[:, 0]
            hk = want
        if hq % hk:
            raise RuntimeError(f"layer {layer}: {hq} query heads is not a multiple of {hk} kv heads")
        scale = kwargs.get("scaling")
        if scale is None:
            scale = getattr(module, "scaling", None)
        if scale is None:
            scale = 1.0 / math.sqrt(d)
        sw = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
        softcap = kwargs.get("softcap", None)
        info = {"scale": float(scale), "hq": hq, "hkv": hk, "d": d, "sliding_window": sw, "softcap": softcap}
        prev = self.seen.get(layer)
        if prev is None:
            self.seen[layer] = info
        elif prev != info:
            raise RuntimeError(f"layer {layer}: attention parameters changed between calls: {prev} -> {info}")
        if sw is None and key.shape[2] != self.pos0 + n:
            raise RuntimeError(f"layer {layer}: key length {key.shape[2]}, expected {self.pos0 + n} "
                               "(cache and position bookkeeping disagree)")
        f32 = lambda t: t.detach().to(torch.float32).cpu().numpy()
        self.writer.append(layer, self.pos0, f32(query[0]), f32(k), f32(v))
        # attention functions return [B, q_len, H, D]
        if tuple(out.shape) != (1, n, hq, out.shape[-1]):
            raise RuntimeError(f"layer {layer}: unexpected attention output shape {tuple(out.shape)}")
        o = out[0]
        for i in range(n):
            t = self.pos0 + i
            if t in self.check_set:
                self.outputs[layer][t] = f32(o[i]).astype("float64")
        self.last_output[layer] = (self.pos0 + n - 1, f32(o[n - 1]).astype("float64"))


# ----------------------------------------------------------------------------
# check: recompute attention from the stored file


def run_check(path, recorder, tol):
    import h5py
    import numpy as np
    worst_all = 0.0
    ok = True
    with h5py.File(path, "r") as f:
        t_total = int(f.attrs["num_tokens"])
        for layer in sorted(recorder.layers):
            info = recorder.seen[layer]
            g = f[f"layers/L{layer}"]
            q = g["q"]
            k = g["k"][...].astype(np.float64)
            v = g["v"][...].astype(np.float64)
            hq, hkv = info["hq"], info["hkv"]
            grp = hq // hkv
            outs = dict(recorder.outputs[layer])
            lt, lo = recorder.last_output[layer]
            outs[lt] = lo
            errs = []
            for t in sorted(p for p in outs if p < t_total):
                qt = q[:, t, :].astype(np.float64)           # [Hq, D]
                lo_ = 0
                if info["sliding_window"]:
                    lo_ = max(0, t - int(info["sliding_window"]) + 1)
                ref = np.empty((hq, v.shape[2]))
                for h in range(hq):
                    kk = k[h // grp, lo_:t + 1]
                    s = info["scale"] * (kk @ qt[h])
                    if info["softcap"]:
                        s = info["softcap"] * np.tanh(s / info["softcap"])
                    s -= s.max()
                    p = np.exp(s)
                    p /= p.sum()
                    ref[h] = p @ v[h // grp, lo_:t + 1]
                model = outs[t]
                den = np.linalg.norm(model)
                err = np.linalg.norm(ref - model) / (den if den > 0 else 1.0)
                errs.append(err)
            worst = max(errs)
            worst_all = max(worst_all, worst)
            status = "ok" if worst <= tol else "FAIL"
            ok = ok and worst <= tol
            print(f"check L{layer}: {len(errs)} positions, relative error max {worst:.3e} "
                  f"mean {sum(errs) / len(errs):.3e} (tol {tol:g}) {status}")
    return ok, worst_all


# ----------------------------------------------------------------------------
# sampling


def pick_token(logits, args, gen, banned, seen=None):
    import torch
    logits = logits.to(torch.float32).cpu()
    if seen is not None and args.repetition_penalty != 1.0:
        n = min(seen.numel(), logits.numel())
        v = logits[:n]
        pen = torch.where(v > 0, v / args.repetition_penalty, v * args.repetition_penalty)
        logits[:n] = torch.where(seen[:n], pen, v)
    if banned:
        logits[banned] = float("-inf")
    if args.temperature <= 0:
        return int(torch.argmax(logits))
    logits = logits / args.temperature
    if args.top_k > 0 and args.top_k < logits.numel():
        kth = torch.topk(logits, args.top_k).values[-1]
        logits[logits < kth] = float("-inf")
    if args.top_p < 1.0:
        srt, idx = torch.sort(logits, descending=True)
        probs = torch.softmax(srt, dim=-1)
        cum = torch.cumsum(probs, dim=-1)
        drop = (cum - probs) > args.top_p
        drop[0] = False
        logits[idx[drop]] = float("-inf")
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen))


# ----------------------------------------------------------------------------
# prompt


def build_prompt(args, tok):
    """Returns (token ids, short description of the prompt)."""
    doc = None
    src = []
    if args.prompt_file:
        with open(args.prompt_file, encoding="utf-8", errors="replace") as f:
            doc = f.read()
        if args.skip_comment_lines:
            lines = doc.split("\n")
            while lines and lines[0].startswith("#"):
                lines.pop(0)
            doc = "\n".join(lines).lstrip("\n")
        if not doc.strip():
            die(f"--prompt-file {args.prompt_file} is empty")
        src.append(f"document {os.path.basename(args.prompt_file)}")
    use_chat = args.question is not None and not args.no_chat_template
    if use_chat and not getattr(tok, "chat_template", None):
        warn("the tokenizer has no chat template: using plain text")
        use_chat = False

    def encode(doc_text):
        if use_chat:
            content = args.question if doc_text is None else doc_text.rstrip() + "\n\n" + args.question
            msgs = []
            if args.system is not None:
                msgs.append({"role": "system", "content": args.system})
            msgs.append({"role": "user", "content": content})
            text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            return tok(text, add_special_tokens=False)["input_ids"]
        parts = [x for x in (args.system, doc_text, args.question) if x]
        return tok("\n\n".join(parts), add_special_tokens=True)["input_ids"]

    ids = encode(doc)
    budget = args.max_prompt_tokens
    if budget and len(ids) > budget:
        if doc is None:
            die(f"the prompt has {len(ids)} tokens, over --max-prompt-tokens {budget}, and there is no "
                "document to truncate")
        overhead = len(encode("")) if use_chat else len(encode(None))
        doc_ids = tok(doc, add_special_tokens=False)["input_ids"]
        keep = max(1, budget - overhead)
        while True:
            cut = tok.decode(doc_ids[:keep])
            ids = encode(cut)
            if len(ids) <= budget or keep <= 1:
                break
            keep -= max(1, len(ids) - budget)
        src.append(f"truncated to its first {keep} tokens")
    if args.question is not None:
        q = args.question if len(args.question) <= 200 else args.question[:200] + "..."
        src.append(f"question {q!r}" + (" (chat template)" if use_chat else " (plain text)"))
    src.append(system_desc(args, tok, use_chat))
    return list(ids), "; ".join(src)


def system_desc(args, tok, use_chat):
    """What the model saw as a system prompt: the one given, or the chat template's own default
    (quoted as the rendered text before the user turn, which is where templates put it)."""
    if args.system is not None:
        return f"system prompt {args.system!r} (--system, {'chat template' if use_chat else 'plain text before the prompt'})"
    if not use_chat:
        return "no system prompt"
    marker = "\u2063KVTRACE_USER\u2063"
    try:
        text = tok.apply_chat_template([{"role": "user", "content": marker}], tokenize=False,
                                       add_generation_prompt=False)
        prefix = text.split(marker, 1)[0] if marker in text else None
    except Exception:
        prefix = None
    if prefix is None:
        return "no --system given (the chat template's default, if any, applies)"
    if len(prefix) > 400:
        prefix = prefix[:400] + "..."
    return f"no --system given, so the chat template's default applies: template text before the user turn {prefix!r}"


# ----------------------------------------------------------------------------
# --save-converted


def save_converted(args, model, tok, gguf_path, t0):
    import json
    import shutil
    out = os.path.abspath(args.save_converted)
    tmp = f"{out}.tmp.{os.getpid()}"
    try:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        cfg = model.config
        if getattr(cfg, "quantization_config", None) is not None:
            # the weights are plain (dequantised) tensors now; do not save a GGUF quantisation config
            try:
                del cfg.quantization_config
            except AttributeError:
                cfg.quantization_config = None
        if hasattr(model, "hf_quantizer"):
            model.hf_quantizer = None
        if hasattr(model, "is_quantized"):
            try:
                model.is_quantized = False
            except Exception:
                pass
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        ident = gguf_identity(gguf_path) if gguf_path else {"source": args.model}
        with open(os.path.join(tmp, IDENTITY_FILE), "w") as f:
            json.dump(ident, f, indent=1)
        if os.path.exists(out):
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"saved {args.model} as {out} in {time.time() - t0:.1f}s")
    return 0


# ----------------------------------------------------------------------------
# main


def main(argv=None):
    args = build_parser().parse_args(argv)
    validate(args)

    def on_term(signum, frame):
        raise KeyboardInterrupt
    import signal
    signal.signal(signal.SIGTERM, on_term)

    is_local = os.path.exists(args.model)
    if is_local:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        import numpy as np
        import torch
        import transformers
        import h5py  # noqa: F401
    except ImportError as e:
        die(f"missing Python package ({e}); run scripts/pydeps.sh and use .venv/bin/python", code=4)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    transformers.logging.set_verbosity_error()
    try:
        transformers.utils.logging.disable_progress_bar()
    except Exception:
        pass

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        die(f"--device {args.device}: CUDA is not available here")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(
        args.dtype, torch.float32 if device.type == "cpu" else torch.bfloat16)

    # --- load
    src, gguf_file, gguf_path = args.model, args.gguf_file, None
    if os.path.isfile(args.model):
        src, gguf_file = os.path.split(os.path.abspath(args.model))
    if gguf_file:
        gguf_path = os.path.join(src, gguf_file)
    kw = {"gguf_file": gguf_file} if gguf_file else {}
    t0 = time.time()
    log(f"loading tokenizer from {args.tokenizer or args.model}")
    try:
        tok = AutoTokenizer.from_pretrained(args.tokenizer or src, **({} if args.tokenizer else kw))
    except Exception as e:
        die(f"cannot load the tokenizer from {args.tokenizer or args.model}: {type(e).__name__}: {e}", code=4)
    log(f"loading model from {args.model} ({'GGUF, dequantised' if gguf_file else 'checkpoint'}, "
        f"{str(dtype).replace('torch.', '')} on {device})")
    dkw = {"dtype": dtype}
    try:
        try:
            model = AutoModelForCausalLM.from_pretrained(src, **kw, **dkw)
        except TypeError:
            model = AutoModelForCausalLM.from_pretrained(src, **kw, torch_dtype=dtype)
    except Exception as e:
        die(f"cannot load the model from {args.model}: {type(e).__name__}: {e}", code=4)
    if args.save_converted:
        return save_converted(args, model, tok, gguf_path, t0)
    model.to(device)
    model.eval()
    t_load = time.time() - t0
    cfg = model.config
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    n_layers = int(text_cfg.num_hidden_layers)
    n_kv = int(getattr(text_cfg, "num_key_value_heads", None) or text_cfg.num_attention_heads)
    layers = list(range(n_layers)) if args.layers == "all" else args.layers
    bad = [l for l in layers if l >= n_layers]
    if bad:
        die(f"--layers {bad}: the model has {n_layers} layers (0..{n_layers - 1})")
    n_params = sum(p.numel() for p in model.parameters())
    log(f"loaded {type(model).__name__} in {t_load:.1f}s: {n_params / 1e6:.0f}M parameters, {n_layers} layers")

    # --- attention function
    from transformers import AttentionInterface
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    except ImportError:
        ALL_MASK_ATTENTION_FUNCTIONS = AttentionMaskInterface = None
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    softcap_cfg = getattr(text_cfg, "attn_logit_softcapping", None)
    base = args.attn_base
    if base == "auto":
        base = "eager" if softcap_cfg else "sdpa"
    if softcap_cfg:
        warn(f"the model caps attention logits (softcap {softcap_cfg}): scores are not plain scale*q.k")
    if base == "sdpa":
        base_fn = ALL_ATTENTION_FUNCTIONS["sdpa"]
    else:
        layer_mod = next((mod for mod in model.modules() if type(mod).__name__.endswith("Attention")
                          and getattr(mod, "layer_idx", None) is not None), None)
        base_fn = getattr(sys.modules[type(layer_mod).__module__], "eager_attention_forward", None) \
            if layer_mod is not None else None
        if base_fn is None:
            die("--attn-base eager: this model's module has no eager_attention_forward", code=4)

    prompt_ids, prompt_desc = build_prompt(args, tok)
    P = len(prompt_ids)
    if P < 1:
        die("the prompt is empty after tokenisation")
    t_max = P + args.max_new_tokens
    ctx = getattr(text_cfg, "max_position_embeddings", None)
    if ctx and t_max > ctx:
        warn(f"prompt ({P}) + new tokens ({args.max_new_tokens}) exceeds the model's context {ctx}")
    npos = min(args.check_positions, t_max)
    check_set = {round(i * (t_max - 1) / max(1, npos - 1)) for i in range(npos)} | {0, P - 1, min(P, t_max - 1)}

    tmp = f"{args.out}.tmp.{os.getpid()}"
    writer = TraceWriter(tmp, args.store_dtype, args.compression, not args.no_values)
    rec = Recorder(layers, base_fn, writer, n_kv, check_set)
    AttentionInterface.register("kvtrace", rec)
    if AttentionMaskInterface is not None:
        AttentionMaskInterface.register("kvtrace", ALL_MASK_ATTENTION_FUNCTIONS[base])
    try:
        model.set_attn_implementation("kvtrace")
    except Exception:
        pass
    if getattr(model.config, "_attn_implementation", None) != "kvtrace":
        model.config._attn_implementation = "kvtrace"
        for m in model.modules():
            c = getattr(m, "config", None)
            if c is not None and hasattr(c, "_attn_implementation"):
                c._attn_implementation = "kvtrace"

    # stop tokens
    eos = set()
    for x in (getattr(model.generation_config, "eos_token_id", None), tok.eos_token_id):
        if x is None:
            continue
        eos.update(x if isinstance(x, (list, tuple)) else [x])
    eos = sorted(int(x) for x in eos)

    gen = torch.Generator().manual_seed(args.seed)
    tokens = list(prompt_ids)
    vocab = int(getattr(text_cfg, "vocab_size", 0) or 0) or (max(prompt_ids) + 1)
    seen = torch.zeros(max(vocab, max(prompt_ids) + 1), dtype=torch.bool)
    seen[torch.tensor(prompt_ids, dtype=torch.long)] = True
    past = None
    stopped = "budget"

    def forward(ids, pos0, past):
        """Runs tokens ids at positions pos0.. on the cache; the last position's logits and the cache."""
        out = model(input_ids=torch.tensor([ids], dtype=torch.long, device=device),
                    position_ids=torch.arange(pos0, pos0 + len(ids), device=device)[None], past_key_values=past,
                    use_cache=True, logits_to_keep=1)
        return out.logits[0, -1], out.past_key_values
    log(f"prompt {P} tokens ({prompt_desc}); generating up to {args.max_new_tokens} "
        f"({'greedy' if args.temperature <= 0 else 'sampled'}); recording layers {layers}")
    try:
        with torch.inference_mode():
            # --- prefill
            t1 = time.time()
            last_report = t1
            logits = None
            for a in range(0, P, args.prefill_chunk):
                chunk = prompt_ids[a:a + args.prefill_chunk]
                rec.pos0 = a
                logits, past = forward(chunk, a, past)
                if time.time() - last_report > 10:
                    last_report = time.time()
                    log(f"prefill {a + len(chunk)}/{P} ({(a + len(chunk)) / (last_report - t1):.0f} tok/s)")
            t_prefill = time.time() - t1
            log(f"prefill {P} tokens in {t_prefill:.1f}s")
            # --- decode
            t2 = time.time()
            last_report = t2
            for i in range(args.max_new_tokens):
                nxt = pick_token(logits, args, gen, eos if args.ignore_eos else None, seen)
                if not args.ignore_eos and nxt in eos:
                    stopped = "eos"
                    break
                tokens.append(nxt)
                if nxt < seen.numel():
                    seen[nxt] = True
                rec.pos0 = len(tokens) - 1
                logits, past = forward([nxt], rec.pos0, past)
                if time.time() - last_report > 15:
                    last_report = time.time()
                    log(f"decode {i + 1}/{args.max_new_tokens} ({(i + 1) / (last_report - t2):.1f} tok/s)")
            t_decode = time.time() - t2
        n_gen = len(tokens) - P
        log(f"generated {n_gen} tokens in {t_decode:.1f}s ({n_gen / max(t_decode, 1e-9):.1f} tok/s), stop: {stopped}")
        if set(rec.seen) != set(layers):
            raise RuntimeError(f"the attention function was not called for layers "
                               f"{sorted(set(layers) - set(rec.seen))}: this model does not dispatch through "
                               "transformers' AttentionInterface")

        infos = [rec.seen[l] for l in layers]
        i0 = infos[0]
        for l, inf in zip(layers, infos):
            for key in ("hq", "hkv", "d"):
                if inf[key] != i0[key]:
                    raise RuntimeError(f"layer {l}: {key}={inf[key]} differs from layer {layers[0]} ({i0[key]})")
            if abs(inf["scale"] - i0["scale"]) > 1e-12 * i0["scale"]:
                raise RuntimeError(f"layer {l}: softmax scale {inf['scale']} differs from {i0['scale']}")

        # --- description
        sidecar = {}
        sc_path = os.path.join(args.model, IDENTITY_FILE) if os.path.isdir(args.model) else None
        if not gguf_path and sc_path and os.path.isfile(sc_path):
            import json
            with open(sc_path) as f:
                sidecar = json.load(f)
        if gguf_path or "gguf_file" in sidecar:
            if gguf_path:
                gi, how = gguf_identity(gguf_path), "dequantised by transformers"
            else:
                gi, how = sidecar, "dequantised by transformers, loaded from its float32 conversion"
            name = args.model_name or gi.get("general.name") or gi.get("gguf_file", "?")
            ident = (f"GGUF {gi.get('gguf_file', '?')} (general.name {gi.get('general.name', '?')!r}, "
                     f"{gi.get('general.architecture', '?')}, "
                     f"{gi.get('general.size_label', '?')}, quantisation {gi.get('file_type', '?')}: "
                     f"{gi.get('tensor_types', '?')}; {how})")
        else:
            name = args.model_name or os.path.basename(os.path.normpath(args.model))
            ident = f"checkpoint {args.model} ({getattr(cfg, 'model_type', '?')})"
        if args.temperature <= 0:
            sampling = "greedy"
        else:
            sampling = (f"sampled: temperature {args.temperature:g}, top-p {args.top_p:g}, top-k {args.top_k}, "
                        f"seed {args.seed}")
        if args.repetition_penalty != 1.0:
            sampling += f", repetition penalty {args.repetition_penalty:g}"
        sw_layers = [l for l in layers if rec.seen[l]["sliding_window"]]
        rope = "applied"
        if not (hasattr(text_cfg, "rope_parameters") or hasattr(text_cfg, "rope_theta")
                or hasattr(text_cfg, "rope_scaling")):
            rope = "none"
        settings = (f"Generation settings: max new tokens {args.max_new_tokens}, "
                    f"{'greedy (temperature 0)' if args.temperature <= 0 else f'temperature {args.temperature:g}'}, "
                    f"top-p {args.top_p:g}, top-k {args.top_k}, repetition penalty {args.repetition_penalty:g}, "
                    f"seed {args.seed}, ignore-eos {'yes' if args.ignore_eos else 'no'} (EOS ids {eos}), "
                    f"prefill chunk {args.prefill_chunk}, prompt {P} tokens "
                    f"(max prompt tokens {args.max_prompt_tokens or 'unlimited'}), "
                    f"chat template {'no' if args.no_chat_template else 'if the tokenizer has one and --question is given'}, "
                    f"compute dtype {str(dtype).replace('torch.', '')}, attention base {base}, threads "
                    f"{args.threads or 'all'}.")
        desc = (f"{name}: {ident}; {type(model).__name__}, {n_params / 1e6:.0f}M parameters, {n_layers} layers, "
                f"{i0['hq']} query heads, {i0['hkv']} kv heads, head_dim {i0['d']}. "
                f"Prompt: {prompt_desc} ({P} tokens). Generation: {n_gen} tokens, {sampling}, "
                f"{'EOS banned (--ignore-eos)' if args.ignore_eos else 'stop at EOS'}, stopped by {stopped}. "
                f"q/k captured at the attention function (after q/k norm and RoPE); computed in "
                f"{str(dtype).replace('torch.', '')} on {device.type}, stored as {args.store_dtype}; "
                f"torch {torch.__version__}, transformers {transformers.__version__}. {settings}")
        if sw_layers:
            desc += (f" Layers {sw_layers} use sliding-window attention (window "
                     f"{rec.seen[sw_layers[0]]['sliding_window']}) in the model.")
        if softcap_cfg:
            desc += f" The model soft-caps attention logits at {softcap_cfg}."
        if args.description:
            desc += " " + args.description
        attrs = {
            "kvtrace_version": np.int32(1),
            "model": name,
            "description": desc,
            "head_dim": np.int32(i0["d"]),
            "num_q_heads": np.int32(i0["hq"]),
            "num_kv_heads": np.int32(i0["hkv"]),
            "num_tokens": np.int32(len(tokens)),
            "prefill_len": np.int32(P),
            "rope": rope,
            "softmax_scale": np.float64(i0["scale"]),
        }
        writer.finish(attrs, tokens)
        check_ok, check_worst, tol = True, 0.0, None
        if args.check:
            # on the temporary file, so a trace that fails the check never appears under --out
            tol = args.check_tol if args.check_tol is not None else (1e-2 if args.store_dtype == "float16" else 1e-4)
            check_ok, check_worst = run_check(tmp, rec, tol)
    except BaseException as e:
        writer.abort()
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, KeyboardInterrupt):
            die("interrupted", code=130)
        if isinstance(e, (RuntimeError, FloatingPointError, OverflowError)):
            die(str(e), code=3)
        raise
    if not check_ok:
        bad = args.out + ".check-failed"
        os.replace(tmp, bad)
        print(f"check FAILED: max relative error {check_worst:.3e} > {tol:g}; the trace is left in {bad}, "
              f"not in {args.out}")
        return 3
    os.replace(tmp, args.out)
    size = os.path.getsize(args.out)
    print(f"wrote {args.out}: {len(tokens)} tokens ({P} prompt + {n_gen} generated), layers "
          f"{','.join('L%d' % l for l in layers)}, Hq {i0['hq']} Hkv {i0['hkv']} D {i0['d']}, "
          f"scale {i0['scale']:.6g}, {size / 1e6:.1f} MB")
    print(f"timing: load {t_load:.1f}s, prefill {t_prefill:.1f}s ({P / max(t_prefill, 1e-9):.0f} tok/s), "
          f"decode {t_decode:.1f}s ({n_gen / max(t_decode, 1e-9):.1f} tok/s)")
    if sw_layers:
        warn(f"layers {sw_layers} are sliding-window layers (window {rec.seen[sw_layers[0]]['sliding_window']}); "
             "kvtrace assumes full causal attention")
    if args.check:
        print(f"check passed: max relative error {check_worst:.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
