#!/usr/bin/env python3
"""sweep.py: parameter sweeps of kvbench from one TOML file, resumable, on N local
workers, N GPUs or a Slurm job array (issue 11).

Why a script above the binary, not `kvbench sweep`: one kvbench process already
evaluates one trace at every layer, budget and seed while sharing the oracle
(`kvbench run --layer all --k 16,...,1024 --seeds N`); what is left (globs,
grids, skipping what exists, worker pools, sbatch, merging tables) is
orchestration, which the project keeps above the binary (ARCHITECTURE.md), and
Python's stdlib has a TOML parser (tomllib), subprocess pools, sqlite3 and csv.
It talks to kvbench only through its command line and result files.

The config (every key is checked; an unknown one is an error naming its line):

    [sweep]
    traces = ["datasets/demo.h5", "datasets/real/*.h5"]   # globs
    layers = "all"            # or ["L3", "L14"]; default: each trace's first layer
    k = [16, 32, 64, 128]     # budgets
    seeds = 1                 # seeded methods (those with a `seed` parameter) run seeds seed..seed+N-1
    seed = 0
    layers_per_job = 0        # 0: all layers of a trace in one kvbench process
    group = "point"           # "point": grid point j of every method in one process (one oracle for all);
                              # "method": one process per method and point (more parallel, oracle per process)
    [protocol]                # kvbench run options: sink, local, stride, max_steps, window, device, threads
    stride = 16
    [methods.quest]           # a method (kvbench list) and its parameters; a list is a grid axis
    page = [8, 16, 32]
    [methods.exact]

Expansion (group = "point", the default): per trace, method m's grid points (the cartesian product of its list
values) are numbered 0..n_m-1; kvbench process j runs every method that has a
point j, with that point's parameters, at every layer, budget and seed, so the
oracle is shared by all of them. A process is keyed by a hash of its full
configuration (trace path, size and mtime, layers, budgets, seeds, methods and
parameters, protocol options, the kvbench binary's sha256); its results live in
OUT/runs/<key>/ and a process whose summary.json exists is skipped, so a killed
sweep re-runs only what is missing. Each result row also carries a unit key
(the hash of trace, layer, method, parameters, k, seed, protocol, binary).

Results: OUT/results.csv (one row per trace, layer, method+params, k, seed),
OUT/summary.csv (mean and standard deviation over seeds), OUT/profile.csv (the
oracle budget profile per trace/layer/window) and the same three tables in
OUT/results.sqlite. CSV because every tool reads it; SQLite (stdlib sqlite3,
`pandas.read_sql`, R's RSQLite, the sqlite3 shell) because it needs no extra
package, unlike Parquet (pyarrow), and queries across sweeps join easily.

usage: scripts/sweep.py CONFIG [--out DIR] [--jobs N | --gpus N] [--kvbench PATH]
       scripts/sweep.py CONFIG --backend slurm [--chunks N] [--partition P] [--time T]
                        [--sbatch-arg ARG]... [--no-submit]
       scripts/sweep.py CONFIG --collect     (gather the tables from what exists)
       scripts/sweep.py CONFIG --dry-run     (list the processes and what is done)
"""
import argparse
import csv
import glob
import hashlib
import itertools
import json
import math
import os
import re
import shlex
import sqlite3
import subprocess
import sys
import time
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP_KEYS = {"traces", "layers", "k", "seeds", "seed", "layers_per_job", "out", "group"}
PROTOCOL_KEYS = {"sink": int, "local": int, "stride": int, "max_steps": int, "window": int, "device": str,
                 "threads": int, "lag": int}
RESULT_COLUMNS = ["trace", "layer", "method", "params", "k", "k_effective", "seed", "seeded", "recall", "recall_p10",
                  "recall_selected", "candidate_recall", "recall_prefill_keys", "recall_generated_keys", "mass",
                  "mass_p10", "output_error", "output_error_p90", "mean_selected", "mean_extra", "budget_effective",
                  "index_bytes_per_token", "build_seconds", "search_us_median", "search_us_p90", "device", "sink",
                  "local", "stride", "max_steps", "lag", "steps_evaluated", "method_metric_name", "method_metric",
                  "unit_key", "job_key", "run_dir"]
MEAN_METRICS = ["recall", "recall_p10", "candidate_recall", "recall_prefill_keys", "recall_generated_keys", "mass",
                "output_error", "mean_selected", "budget_effective", "index_bytes_per_token", "search_us_median",
                "build_seconds"]
SUMMARY_COLUMNS = ["trace", "layer", "method", "params", "k", "k_effective", "seeds", "device"] + \
    [f"{m}_{s}" for m in MEAN_METRICS for s in ("mean", "std")]
PROFILE_COLUMNS = ["trace", "layer", "window", "step_start", "step_end", "p", "tokens_mean", "tokens_p10",
                   "tokens_median", "tokens_p90", "region_mean", "n"]


class ConfigError(Exception):
    pass


def pid_alive(pid):
    """A running process: /proc/PID exists and is not a zombie (a killed kvbench whose parent died stays one
    until something reaps it, e.g. in a container without an init)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def die(msg, code=2):
    print(f"{os.path.basename(sys.argv[0])}: {msg}", file=sys.stderr)  # sweep.py, or the script importing it
    sys.exit(code)


# ---- the config ---------------------------------------------------------------------------------------------

def line_of(text, table, key=None):
    """1-based line of `key = ` inside [table] (or of the [table] header), 0 if not found."""
    cur = None
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        m = re.match(r"^\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$", s)
        if m:
            cur = re.sub(r"\s*\.\s*", ".", m.group(1)).replace('"', "")
            if key is None and cur == table:
                return n
            continue
        if key is not None and cur == table and re.match(rf'^"?{re.escape(key)}"?\s*=', s):
            return n
    return 0


def method_specs(kvbench):
    """{method: {param: (type, lo, hi | choices, default)}} parsed from `kvbench list`."""
    r = subprocess.run([kvbench, "list"], capture_output=True, text=True)
    if r.returncode != 0:
        die(f"{kvbench} list failed: {r.stderr.strip()}")
    specs, cur = {}, None
    for line in r.stdout.splitlines():
        m = re.match(r"^([a-z][\w-]*)\s", line)
        if m:
            cur = m.group(1)
            specs[cur] = {}
            continue
        m = re.match(r"^\s+--param (\w+)=(\S*)\s+(int|float) \[(\S+), (\S+)\]", line)
        if m and cur:
            specs[cur][m.group(1)] = (m.group(3), float(m.group(4)), float(m.group(5)), m.group(2))
            continue
        m = re.match(r"^\s+--param (\w+)=(\S*)\s+(\S+\|\S+)", line)
        if m and cur:
            specs[cur][m.group(1)] = ("enum", m.group(3).split("|"), None, m.group(2))
    if not specs:
        die(f"{kvbench} list printed no methods")
    return specs


def check_value(path, text, method, name, v, spec):
    where = f"{path}:{line_of(text, 'methods.' + method, name)}"
    kind = spec[0]
    ok = False
    if kind == "enum":
        ok = isinstance(v, str) and v in spec[1]
        want = "one of " + "|".join(spec[1])
    else:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (kind == "float" or float(v) == int(v)) \
            and spec[1] <= v <= spec[2]
        want = f"{'an integer' if kind == 'int' else 'a number'} in [{spec[1]:g}, {spec[2]:g}]"
    if not ok:
        raise ConfigError(f"{where}: methods.{method}.{name}: expected {want}, found {v!r}")


def load_config(path, kvbench):
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}")
    try:
        cfg = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}")
    for key in cfg:
        if key not in ("sweep", "protocol", "methods"):
            n = line_of(text, key) or line_of(text, None, key)
            raise ConfigError(f"{path}:{n}: unknown key or table '{key}' (expected [sweep], [protocol], [methods.NAME])")
    sw, proto, methods = cfg.get("sweep", {}), cfg.get("protocol", {}), cfg.get("methods", {})
    for key in sw:
        if key not in SWEEP_KEYS:
            raise ConfigError(f"{path}:{line_of(text, 'sweep', key)}: [sweep] has no key '{key}' "
                              f"(keys: {', '.join(sorted(SWEEP_KEYS))})")
    for key, v in proto.items():
        if key not in PROTOCOL_KEYS:
            raise ConfigError(f"{path}:{line_of(text, 'protocol', key)}: [protocol] has no key '{key}' "
                              f"(keys: {', '.join(sorted(PROTOCOL_KEYS))})")
        if not isinstance(v, PROTOCOL_KEYS[key]) or isinstance(v, bool):
            raise ConfigError(f"{path}:{line_of(text, 'protocol', key)}: protocol.{key}: expected "
                              f"{PROTOCOL_KEYS[key].__name__}, found {v!r}")
    traces = sw.get("traces")
    if isinstance(traces, str):
        traces = [traces]
    if not traces or not all(isinstance(t, str) for t in traces):
        raise ConfigError(f"{path}:{line_of(text, 'sweep', 'traces') or line_of(text, 'sweep')}: "
                          "[sweep] traces: expected a list of paths or globs")
    ks = sw.get("k", [100])
    ks = [ks] if isinstance(ks, int) else ks
    if not isinstance(ks, list) or not ks or not all(isinstance(k, int) and k >= 1 for k in ks) or \
            len(set(ks)) != len(ks):
        raise ConfigError(f"{path}:{line_of(text, 'sweep', 'k')}: [sweep] k: expected distinct integers >= 1, found {ks!r}")
    layers = sw.get("layers")
    if layers is not None and layers != "all" and not (isinstance(layers, list) and layers and
                                                       all(isinstance(x, str) for x in layers)):
        raise ConfigError(f"{path}:{line_of(text, 'sweep', 'layers')}: [sweep] layers: expected \"all\" or a list "
                          f"of names, found {layers!r}")
    for key in ("seeds", "seed", "layers_per_job"):
        v = sw.get(key, 1 if key == "seeds" else 0)
        if not isinstance(v, int) or isinstance(v, bool) or v < (1 if key == "seeds" else 0):
            raise ConfigError(f"{path}:{line_of(text, 'sweep', key)}: [sweep] {key}: expected an integer >= "
                              f"{1 if key == 'seeds' else 0}, found {v!r}")
    if sw.get("group", "point") not in ("point", "method"):
        raise ConfigError(f"{path}:{line_of(text, 'sweep', 'group')}: [sweep] group: expected \"point\" or "
                          f"\"method\", found {sw['group']!r}")
    if not methods:
        raise ConfigError(f"{path}: no [methods.NAME] table: nothing to run")
    specs = method_specs(kvbench)
    _SPECS.update(specs)
    grids = {}
    for name, params in methods.items():
        if name not in specs:
            raise ConfigError(f"{path}:{line_of(text, 'methods.' + name)}: unknown method '{name}' "
                              f"(kvbench list: {', '.join(specs)})")
        if not isinstance(params, dict):
            raise ConfigError(f"{path}:{line_of(text, 'methods', name)}: methods.{name}: expected a table")
        axes = []
        for p, v in params.items():
            if p not in specs[name]:
                raise ConfigError(f"{path}:{line_of(text, 'methods.' + name, p)}: method {name} has no parameter "
                                  f"'{p}' (its parameters: {', '.join(specs[name]) or 'none'})")
            vals = v if isinstance(v, list) else [v]
            if not vals:
                raise ConfigError(f"{path}:{line_of(text, 'methods.' + name, p)}: methods.{name}.{p}: an empty list")
            for x in vals:
                check_value(path, text, name, p, x, specs[name][p])
            axes.append([(p, x) for x in vals])
        grids[name] = [dict(c) for c in itertools.product(*axes)] if axes else [{}]
    files = []
    for t in traces:
        hits = sorted(glob.glob(t if os.path.isabs(t) else os.path.join(os.path.dirname(os.path.abspath(path)), t))) \
            or sorted(glob.glob(t))
        if not hits:
            raise ConfigError(f"{path}:{line_of(text, 'sweep', 'traces')}: [sweep] traces: '{t}' matches no file")
        files += [h for h in hits if h not in files]
    return {"path": path, "traces": files, "layers": layers, "k": sorted(ks), "seeds": sw.get("seeds", 1),
            "seed": sw.get("seed", 0), "layers_per_job": sw.get("layers_per_job", 0), "protocol": proto,
            "grids": grids, "out": sw.get("out"), "group": sw.get("group", "point")}


# ---- expansion into kvbench processes ----------------------------------------------------------------------

def trace_layers(kvbench, trace):
    """The layer names of a trace, from `kvbench info` (also scripts/ablate.py's)."""
    r = subprocess.run([kvbench, "info", trace], capture_output=True, text=True)
    if r.returncode != 0:
        die(f"{trace}: kvbench info failed: {r.stderr.strip()}")
    m = re.search(r"^layers\s+\d+:\s*(.*)$", r.stdout, re.M)
    if not m:
        die(f"{trace}: kvbench info printed no layers line")
    return re.findall(r"([^\s(]+)\(", m.group(1))  # "L6(float16) L14(float16, no v)" -> L6, L14


def sha256_file(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def fmt_value(v):
    return repr(v) if isinstance(v, float) else str(v)


def expand(cfg, kvbench):
    """The kvbench processes of the sweep: dicts with key, trace, layers, methods, params, argv."""
    binsha = sha256_file(kvbench)
    jobs = []
    for trace in cfg["traces"]:
        have = trace_layers(kvbench, trace)
        if cfg["layers"] == "all":
            layers = have
        elif cfg["layers"]:
            bad = [x for x in cfg["layers"] if x not in have and f"L{x}" not in have]
            if bad:
                die(f"{cfg['path']}: [sweep] layers {bad}: not in {trace} (it has {', '.join(have)})")
            layers = [x if x in have else f"L{x}" for x in cfg["layers"]]
        else:
            layers = have[:1]
        per = cfg["layers_per_job"] or len(layers)
        chunks = [layers[i:i + per] for i in range(0, len(layers), per)]
        st = os.stat(trace)
        if cfg["group"] == "method":  # one process per (method, point): most parallel, the oracle per process
            groups = [[(m, p)] for m, g in cfg["grids"].items() for p in g]
        else:  # point j of every method in one process: the oracle shared by all of them
            n_slots = max(len(g) for g in cfg["grids"].values())
            groups = [[(m, g[j]) for m, g in cfg["grids"].items() if j < len(g)] for j in range(n_slots)]
        for methods in groups:
            for chunk in chunks:
                ident = {"trace": os.path.abspath(trace), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                         "layers": chunk, "k": cfg["k"], "seeds": cfg["seeds"], "seed": cfg["seed"],
                         "methods": [[m, sorted(p.items())] for m, p in methods], "protocol": cfg["protocol"],
                         "kvbench_sha256": binsha}
                key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
                argv = ["run", "--trace", os.path.abspath(trace), "--layer", ",".join(chunk), "--method",
                        ",".join(m for m, _ in methods), "--k", ",".join(map(str, cfg["k"])), "--seed",
                        str(cfg["seed"]), "--seeds", str(cfg["seeds"]), "--quiet"]
                for m, p in methods:
                    for n, v in p.items():
                        argv += ["--param", f"{m}.{n}={fmt_value(v)}"]
                for n, v in cfg["protocol"].items():
                    argv += [f"--{n.replace('_', '-')}", str(v)]
                units = len(chunk) * len(cfg["k"]) * sum(cfg["seeds"] if "seed" in specs_of(m) else 1
                                                         for m, _ in methods)
                jobs.append({"key": key, "ident": ident, "trace": trace, "layers": chunk, "methods": methods,
                             "argv": argv, "units": units, "steps_hint": 1})
    return jobs


_SPECS = {}


def specs_of(method):
    return _SPECS.get(method, {})


def run_dir(out, job):
    return os.path.join(out, "runs", job["key"])


def done(out, job):
    return os.path.isfile(os.path.join(run_dir(out, job), "summary.json"))


# ---- execution ---------------------------------------------------------------------------------------------

class Progress:
    """A bar over the sweep's units (method x layer x k x seed), with the ETA from the rate so far."""

    def __init__(self, total, already):
        self.total, self.done, self.start_done, self.t0 = total, already, already, time.time()
        self.tty = sys.stderr.isatty()

    def update(self, units, label):
        self.done += units
        el = time.time() - self.t0
        rate = (self.done - self.start_done) / el if el > 0 else 0
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        width = 30
        fill = int(width * self.done / self.total) if self.total else width
        bar = "#" * fill + "." * (width - fill)
        msg = (f"[{bar}] {self.done}/{self.total} runs  {fmt_time(el)} elapsed  "
               f"ETA {fmt_time(eta) if eta == eta else '?'}  {label}")
        if self.tty:
            print("\r" + msg[:160].ljust(160), end="" if self.done < self.total else "\n", file=sys.stderr, flush=True)
        else:
            print(msg, file=sys.stderr, flush=True)


def fmt_time(s):
    if s != s:
        return "?"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def gpu_list():
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return [x for x in vis.split(",") if x.strip()]
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        n = len([x for x in r.stdout.splitlines() if x.startswith("GPU ")])
    except (OSError, subprocess.TimeoutExpired):
        n = 0
    return [str(i) for i in range(n)]


def run_local(out, jobs, kvbench, workers, gpus, progress):
    """Runs jobs on `workers` processes at a time; with gpus, worker w sees GPU gpus[w % len(gpus)]. Each run's
    log starts with its worker and GPU and ends with its exit status and seconds; with several workers, each
    worker's processes and busy seconds are printed at the end (the balance between GPUs)."""
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    pending, running, failed = list(jobs), {}, []
    free_slots = list(range(workers))
    busy, count = [0.0] * workers, [0] * workers
    where = lambda slot: f"worker {slot}" + (f" on GPU {gpus[slot % len(gpus)]}" if gpus else "")
    while pending or running:
        while pending and free_slots:
            job = pending.pop(0)
            slot = free_slots.pop(0)
            env = dict(os.environ)
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = gpus[slot % len(gpus)]
            rdir = run_dir(out, job)
            cmd = [kvbench] + job["argv"] + ["--out", rdir]
            log = open(os.path.join(out, "logs", job["key"] + ".log"), "w")
            log.write(f"# {where(slot)}\n" + " ".join(shlex.quote(c) for c in cmd) + "\n")
            log.flush()
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            running[p.pid] = (p, job, slot, log, time.time())
        pid, status = os.wait()
        if pid not in running:
            continue
        p, job, slot, log, t0 = running.pop(pid)
        rc = os.waitstatus_to_exitcode(status)
        dt = time.time() - t0
        busy[slot] += dt
        count[slot] += 1
        log.write(f"# {where(slot)}: exit {rc} after {dt:.1f} s\n")
        log.close()
        free_slots.append(slot)
        label = f"{os.path.basename(job['trace'])} {','.join(m for m, _ in job['methods'])}"
        if rc != 0:
            failed.append((job, rc))
            label += f": FAILED (exit {rc}, log {os.path.join(out, 'logs', job['key'] + '.log')})"
        progress.update(job["units"], label)
    if workers > 1:
        for w in range(workers):
            print(f"sweep.py: {where(w)}: {count[w]} processes, {busy[w]:.1f} s busy", file=sys.stderr)
    return failed


def write_slurm(out, cfg_path, jobs, a):
    sdir = os.path.join(out, "slurm")
    os.makedirs(sdir, exist_ok=True)
    chunks = min(a.chunks or len(jobs), len(jobs))
    with open(os.path.join(sdir, "jobs.json"), "w") as f:
        json.dump([j["key"] for j in jobs], f)
    me = os.path.abspath(__file__)
    lines = ["#!/bin/bash", f"#SBATCH --job-name=kvbench-sweep", f"#SBATCH --array=0-{chunks - 1}",
             f"#SBATCH --output={os.path.abspath(sdir)}/task-%a.out", "#SBATCH --ntasks=1"]
    if a.partition:
        lines.append(f"#SBATCH --partition={a.partition}")
    if a.time:
        lines.append(f"#SBATCH --time={a.time}")
    for x in a.sbatch_arg:
        lines.append(f"#SBATCH {x}")
    lines += ["set -euo pipefail",
              f"cd {shlex.quote(os.getcwd())}",
              f"exec {shlex.quote(sys.executable)} {shlex.quote(me)} {shlex.quote(os.path.abspath(cfg_path))} "
              f"--out {shlex.quote(os.path.abspath(out))} --kvbench {shlex.quote(os.path.abspath(a.kvbench))} "
              f"--task \"$SLURM_ARRAY_TASK_ID\" --chunks {chunks} --jobs 1"]
    script = os.path.join(sdir, "sweep.sbatch")
    with open(script, "w") as f:
        f.write("\n".join(lines) + "\n")
    return script, chunks


# ---- collection --------------------------------------------------------------------------------------------

def unit_key(job, layer, method, params, k, seed):
    ident = {"trace": job["ident"]["trace"], "size": job["ident"]["size"], "mtime_ns": job["ident"]["mtime_ns"],
             "layer": layer, "method": method, "params": params, "k": k, "seed": seed,
             "protocol": job["ident"]["protocol"], "kvbench_sha256": job["ident"]["kvbench_sha256"]}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def collect(out, jobs):
    rows, prof, missing = [], [], 0
    for job in jobs:
        rdir = run_dir(out, job)
        if not done(out, job):
            missing += 1
            continue
        s = json.load(open(os.path.join(rdir, "summary.json")))
        tname = os.path.basename(job["trace"]).removesuffix(".h5")
        pr = s["protocol"]
        for e in s["methods"]:
            r = {c: e.get(c, "") for c in RESULT_COLUMNS}
            sel, ext = e.get("mean_selected"), e.get("mean_extra")
            r.update(trace=tname, seeded=int(bool(e.get("seeded"))), budget_effective=(sel or 0) + (ext or 0) if sel is not None else "",
                     sink=pr["sink"], local=pr["local"], stride=pr["stride"], max_steps=pr["max_steps"], lag=pr.get("lag", 0),
                     steps_evaluated=pr["steps_evaluated"], job_key=job["key"], run_dir=rdir,
                     unit_key=unit_key(job, e["layer"], e["method"], e["params"], e["k"], e["seed"]))
            rows.append(r)
        pf = os.path.join(rdir, "profile.csv")
        if os.path.isfile(pf) and not any(p["trace"] == tname and p["layer"] in job["layers"] for p in prof):
            for p in csv.DictReader(open(pf)):
                prof.append({"trace": tname, **p})
    # mean and standard deviation over seeds (one row per trace, layer, method+params, k)
    groups = {}
    for r in rows:
        groups.setdefault((r["trace"], r["layer"], r["method"], r["params"], r["k"]), []).append(r)
    summ = []
    for (t, layer, m, p, k), g in groups.items():
        o = {"trace": t, "layer": layer, "method": m, "params": p, "k": k, "k_effective": g[0]["k_effective"],
             "seeds": len(g), "device": g[0]["device"]}
        for met in MEAN_METRICS:
            xs = [float(r[met]) for r in g if r[met] not in ("", None)]
            mu = sum(xs) / len(xs) if xs else None
            sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else None
            o[f"{met}_mean"], o[f"{met}_std"] = mu, sd
        summ.append(o)
    for name, cols, data in (("results", RESULT_COLUMNS, rows), ("summary", SUMMARY_COLUMNS, summ),
                             ("profile", PROFILE_COLUMNS, prof)):
        tmp = os.path.join(out, f".{name}.csv.tmp")
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
            w.writeheader()
            w.writerows(data)
        os.replace(tmp, os.path.join(out, f"{name}.csv"))
    dbt = os.path.join(out, ".results.sqlite.tmp")
    if os.path.exists(dbt):
        os.remove(dbt)
    db = sqlite3.connect(dbt)
    for name, cols, data in (("results", RESULT_COLUMNS, rows), ("summary", SUMMARY_COLUMNS, summ),
                             ("profile", PROFILE_COLUMNS, prof)):
        db.execute(f"CREATE TABLE {name} ({', '.join(cols)})")
        db.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(cols))})",
                       [[d.get(c) for c in cols] for d in data])
    db.commit()
    db.close()
    os.replace(dbt, os.path.join(out, "results.sqlite"))
    return len(rows), len(summ), missing


# ---- main --------------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(prog="sweep.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--out", help="sweep folder (default: [sweep] out, else results/sweep-<config name>)")
    ap.add_argument("--kvbench", default=os.path.join(ROOT, "kvbench"))
    ap.add_argument("--backend", choices=["local", "slurm"], default="local")
    ap.add_argument("--jobs", type=int, default=1, help="local: kvbench processes at a time (CPU workers)")
    ap.add_argument("--gpus", type=int, default=0,
                    help="local: N workers, worker w on GPU w mod (visible GPUs), so 2 on one GPU share it")
    ap.add_argument("--collect", action="store_true", help="only gather the tables from the runs that exist")
    ap.add_argument("--dry-run", action="store_true", help="list the processes and whether each is done")
    ap.add_argument("--chunks", type=int, default=0, help="slurm: array tasks (default: one per pending process)")
    ap.add_argument("--partition", default="")
    ap.add_argument("--time", default="", help="slurm: --time of each task")
    ap.add_argument("--sbatch-arg", action="append", default=[], help="slurm: an extra #SBATCH line, repeatable")
    ap.add_argument("--no-submit", action="store_true", help="slurm: write the script, do not submit it")
    ap.add_argument("--task", type=int, default=None, help=argparse.SUPPRESS)  # a Slurm array task
    a = ap.parse_args()
    if a.jobs < 1 or a.gpus < 0:
        die("--jobs must be >= 1 and --gpus >= 0")
    if not os.access(a.kvbench, os.X_OK):
        die(f"{a.kvbench}: not an executable (run make first, or pass --kvbench)")
    try:
        cfg = load_config(a.config, a.kvbench)
    except ConfigError as e:
        die(str(e))
    out = a.out or cfg["out"] or os.path.join("results", "sweep-" + os.path.basename(a.config).rsplit(".", 1)[0])
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    jobs = expand(cfg, a.kvbench)
    for d in glob.glob(os.path.join(out, "runs", "*.tmp.*")):  # a kvbench killed by SIGKILL leaves DIR.tmp.<pid>
        pid = d.rsplit(".", 1)[-1]
        if pid.isdigit() and not pid_alive(int(pid)):
            subprocess.run(["rm", "-rf", "--", d])
    if a.collect:
        n, ns, missing = collect(out, jobs)
        print(f"sweep.py: {n} rows ({ns} after averaging seeds) in {out}/results.csv, summary.csv, results.sqlite"
              + (f"; {missing} of {len(jobs)} processes have no results yet" if missing else ""))
        return 0 if not missing else 1
    if a.task is not None:  # one Slurm array task: its share of the frozen list
        keys = json.load(open(os.path.join(out, "slurm", "jobs.json")))
        mine = set(keys[a.task::a.chunks])
        todo = [j for j in jobs if j["key"] in mine and not done(out, j)]
        prog = Progress(sum(j["units"] for j in todo), 0)
        failed = run_local(out, todo, a.kvbench, 1, [], prog)
        return 1 if failed else 0
    todo = [j for j in jobs if not done(out, j)]
    total = sum(j["units"] for j in jobs)
    if a.dry_run:
        for j in jobs:
            print(f"{'done   ' if j not in todo else 'pending'} {j['key']} {j['units']:5d} runs  kvbench "
                  + " ".join(shlex.quote(x) for x in j["argv"]))
        print(f"{len(jobs)} processes ({total} runs), {len(todo)} pending")
        return 0
    print(f"sweep.py: {len(jobs)} kvbench processes ({total} runs: trace x layer x method point x k x seed), "
          f"{len(jobs) - len(todo)} done, {len(todo)} to run; results in {out}", file=sys.stderr)
    if a.backend == "slurm":
        if not todo:
            n, ns, _ = collect(out, jobs)
            print(f"sweep.py: nothing to submit; {n} rows in {out}/results.csv")
            return 0
        script, chunks = write_slurm(out, a.config, todo, a)
        if a.no_submit:
            print(f"sweep.py: wrote {script} ({chunks} array tasks); submit with: sbatch {script}")
            return 0
        r = subprocess.run(["sbatch", "--parsable", script], capture_output=True, text=True)
        if r.returncode != 0:
            die(f"sbatch {script} failed: {r.stderr.strip()}", 1)
        print(f"sweep.py: submitted array job {r.stdout.strip()} ({chunks} tasks, {script}); when it is done: "
              f"scripts/sweep.py {a.config} --out {out} --collect")
        return 0
    gpus = []
    if a.gpus:
        gpus = gpu_list()
        if not gpus:
            die("--gpus: no GPU visible (CUDA_VISIBLE_DEVICES empty and nvidia-smi lists none)")
        if a.gpus > len(gpus):
            print(f"sweep.py: --gpus {a.gpus} on {len(gpus)} visible GPU(s): workers share them "
                  f"(worker w on GPU {', '.join(gpus)}[w mod {len(gpus)}])", file=sys.stderr)
    workers = a.gpus or a.jobs
    prog = Progress(total, total - sum(j["units"] for j in todo))
    failed = run_local(out, todo, a.kvbench, workers, gpus, prog)
    n, ns, missing = collect(out, jobs)
    print(f"sweep.py: {n} rows ({ns} after averaging seeds) in {out}/results.csv, summary.csv, profile.csv, "
          f"results.sqlite")
    for job, rc in failed:
        print(f"sweep.py: FAILED (exit {rc}): kvbench {' '.join(job['argv'])}; log "
              f"{os.path.join(out, 'logs', job['key'] + '.log')}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
