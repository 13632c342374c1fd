#!/usr/bin/env python3
"""test_sweep.py: scripts/sweep.py and `kvbench run` over several budgets, layers and seeds (issue 11).

1. multi: one `kvbench run` over every method, 3 layers of a synthetic trace, 3 budgets and 2 seeds equals,
   number for number, the single runs (one layer, one k, one seed) it replaces.
2. sweep: a tiny grid on the demo trace gives in results.csv the numbers of the individual `kvbench run`s it
   expands to; the seed summary's mean and standard deviation are those of the per-seed rows.
3. resume: a sweep killed after its first kvbench process finished re-runs only the missing processes.
4. validation: unknown key / method / parameter / bad value: exit 2 and the message names the config's line.
5. backends: --gpus 2 with CUDA_VISIBLE_DEVICES=0 (two workers sharing GPU 0; on a CPU machine kvbench falls
   back to the CPU) gives the same numbers as one worker.
Standard library only. Exit 0 pass, 1 fail."""
import csv
import glob
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KV = os.environ.get("KVBENCH_BIN", os.path.join(ROOT, "kvbench"))
DEMO = os.path.join(ROOT, "datasets", "demo.h5")
SWEEP = os.path.join(ROOT, "scripts", "sweep.py")
METRICS = ("recall", "recall_p10", "mass", "output_error", "candidate_recall", "mean_selected", "mean_extra",
           "recall_generated_keys", "recall_prefill_keys", "index_bytes")
fails = 0
PART = sys.argv[1] if len(sys.argv) > 1 else "all"  # multi | sweep | all


def check(cond, msg):
    global fails
    if not cond:
        fails += 1
        print(f"test_sweep: FAIL: {msg}")
    return cond


def kv(*args):
    r = subprocess.run([KV, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"test_sweep: kvbench {' '.join(args)} failed: {r.stderr}")
    return r


def sweep(cfg, out, *extra, env=None):
    return subprocess.run([sys.executable, SWEEP, cfg, "--out", out, "--kvbench", KV, *extra], capture_output=True,
                          text=True, env=env)


def close(a, b):
    if a in ("", None) or b in ("", None):
        return (a in ("", None)) == (b in ("", None))
    return float(a) == float(b) or abs(float(a) - float(b)) <= 1e-6 * max(1, abs(float(b)))


with tempfile.TemporaryDirectory() as tmp:
    # 1. several layers, budgets and seeds in one process == the single runs
    if PART in ("multi", "all"):
        syn = os.path.join(tmp, "syn.h5")
        kv("synth", "--out", syn, "--tokens", "900", "--prefill", "500", "--q-heads", "4", "--kv-heads", "2", "--dim", "32",
           "--layers", "3")
        allm = [l.split()[0] for l in kv("list").stdout.splitlines() if l and not l[0].isspace()]
        check(len(allm) >= 8, f"kvbench list: {allm}")
        multi = os.path.join(tmp, "multi")
        kv("run", "--trace", syn, "--layer", "all", "--method", ",".join(allm), "--k", "64,8,300", "--seeds", "2",
           "--stride", "16", "--out", multi, "--quiet")
        m = json.load(open(os.path.join(multi, "summary.json")))
        check(m["protocol"]["ks"] == [8, 64, 300], f"protocol.ks {m['protocol']['ks']}")
        compared = 0
        for layer in ("L0", "L2"):
            for k in (8, 300):
                for seed in (0, 1):
                    one = os.path.join(tmp, f"one-{layer}-{k}-{seed}")
                    kv("run", "--trace", syn, "--layer", layer, "--method", ",".join(allm), "--k", str(k), "--seed",
                       str(seed), "--stride", "16", "--out", one, "--quiet", "--no-profile")
                    for e in json.load(open(os.path.join(one, "summary.json")))["methods"]:
                        f = [x for x in m["methods"] if (x["method"], x["layer"], x["k"], x["seed"]) ==
                             (e["method"], layer, k, seed)]
                        if seed == 1 and not e["seeded"]:
                            check(not f, f"{e['method']} is not seeded but has a seed-1 entry")
                            continue
                        if not check(len(f) == 1, f"{e['method']} {layer} k={k} seed={seed}: {len(f)} entries"):
                            continue
                        for key in METRICS:
                            check(e[key] == f[0][key], f"{e['method']} {layer} k={k} seed {seed} {key}: single run "
                                                       f"{e[key]}, multi run {f[0][key]}")
                            compared += 1
        check(compared > 300, f"only {compared} numbers compared")
        drift = list(csv.DictReader(open(os.path.join(multi, "drift.csv"))))
        check({r["layer"] for r in drift} == {"L0", "L1", "L2"} and {r["k"] for r in drift} == {"8", "64", "300"},
              "drift.csv layer/k columns")
        prof = list(csv.DictReader(open(os.path.join(multi, "profile.csv"))))
        check({r["layer"] for r in prof} == {"L0", "L1", "L2"} and len(m["budget_profile"]) == 3, "profile per layer")
        for r in prof:  # tokens needed grow with p within a window
            pass
        info = kv("info", "--profile", syn, "--layer", "all", "--stride", "16").stdout
        for b in m["budget_profile"]:
            t = b["tokens_mean"]
            check(all(t[i] <= t[i + 1] for i in range(4)), f"profile {b['layer']} not monotone in p: {t}")
            part = info.split(f"layer {b['layer']}:")[1]
            row = [l for l in part.splitlines() if l.split()[:1] == ["all"]][0].split()
            got = [float(row[2 + 2 * j]) for j in range(5)]
            check(all(abs(g - x) <= 0.0501 for g, x in zip(got, t)), f"info --profile {b['layer']}: {got}, run's summary.json {t}")
        # --lag (issue 10) in the multi loop: equals the single lagged runs; method_metric stays the last column
        lagm, lagms = "exact,freekv,racc,ctkvr", ("recall", "mass", "output_error", "mean_selected", "method_metric")
        lagd = os.path.join(tmp, "lag-multi")
        kv("run", "--trace", syn, "--layer", "all", "--method", lagm, "--k", "8,64", "--lag", "3", "--stride", "16",
           "--out", lagd, "--quiet", "--no-profile")
        ml = json.load(open(os.path.join(lagd, "summary.json")))
        check(ml["protocol"]["lag"] == 3 and ml["protocol"]["ks"] == [8, 64], f"lag run protocol {ml['protocol']}")
        nolag = {(e["method"], e["layer"], e["k"]): e for e in m["methods"] if e["seed"] == 0}
        differs = 0
        for layer, k in (("L1", 8), ("L2", 64)):
            one = os.path.join(tmp, f"lag-one-{layer}-{k}")
            kv("run", "--trace", syn, "--layer", layer, "--method", lagm, "--k", str(k), "--lag", "3", "--stride", "16",
               "--out", one, "--quiet", "--no-profile")
            for e in json.load(open(os.path.join(one, "summary.json")))["methods"]:
                f = [x for x in ml["methods"] if (x["method"], x["layer"], x["k"]) == (e["method"], layer, k)]
                if not check(len(f) == 1, f"lag: {e['method']} {layer} k={k}: {len(f)} entries"):
                    continue
                for key in lagms:
                    check(e[key] == f[0][key], f"lag: {e['method']} {layer} k={k} {key}: single {e[key]}, multi {f[0][key]}")
                check(e["method_metric_name"] == f[0]["method_metric_name"], f"lag: {e['method']} metric name")
                differs += e["method"] == "exact" and e["recall"] != nolag[("exact", layer, k)]["recall"]
        check(differs == 2, "--lag 3 left exact's recall unchanged: the lagged query does not reach search")
        for name in ("drift.csv", "steps.csv"):
            rows = list(csv.reader(open(os.path.join(lagd, name))))
            check(rows[0][-1] == "method_metric" and rows[0][1:4] in (["params", "layer", "k"], ["layer", "k", "seed"]),
                  f"{name} header {rows[0]}")
            fk = [r for r in rows[1:] if r[0] == "freekv"]
            check(fk and all(r[-1] != "" for r in fk) and all(r[-1] == "" for r in rows[1:] if r[0] == "exact"),
                  f"{name}: method_metric filled for freekv, empty for exact")

    if PART in ("sweep", "all"):
        # 2. a tiny grid on the demo trace == the individual runs
        cfg = os.path.join(tmp, "tiny.toml")
        open(cfg, "w").write("\n".join([
            "# a tiny grid", "[sweep]", f'traces = ["{DEMO}"]', "k = [16, 64]", "seeds = 2", "", "[protocol]",
            "stride = 32", "threads = 1", "", "[methods.exact]", "[methods.quest]", "page = [8, 16]",
            "[methods.random]"]) + "\n")
        out = os.path.join(tmp, "sw")
        r = sweep(cfg, out)
        check(r.returncode == 0, f"sweep exit {r.returncode}: {r.stderr}")
        check("ETA" in r.stderr, f"no progress/ETA line: {r.stderr}")
        rows = list(csv.DictReader(open(os.path.join(out, "results.csv"))))
        # 2 budgets x (exact + quest page 8 + quest page 16 + random seeds 0,1) = 10
        check(len(rows) == 10, f"{len(rows)} result rows, want 10")
        seen = 0
        for page, methods in ((8, "exact,quest,random"), (16, "quest")):
            for k in (16, 64):
                for seed in (0, 1):
                    one = os.path.join(tmp, f"demo-{page}-{k}-{seed}")
                    kv("run", "--trace", DEMO, "--method", methods, "--param", f"quest.page={page}", "--k", str(k),
                       "--seed", str(seed), "--stride", "32", "--threads", "1", "--out", one, "--quiet")
                    for e in json.load(open(os.path.join(one, "summary.json")))["methods"]:
                        if seed == 1 and not e["seeded"]:
                            continue
                        f = [x for x in rows if x["method"] == e["method"] and x["params"] == e["params"] and
                             int(x["k"]) == k and int(x["seed"]) == seed]
                        if not check(len(f) == 1, f"sweep rows for {e['method']} {e['params']} k={k} seed={seed}: {len(f)}"):
                            continue
                        seen += 1
                        for key in ("recall", "mass", "output_error", "recall_p10", "mean_selected"):
                            check(close(f[0][key], e[key]), f"{e['method']} {e['params']} k={k} {key}: sweep {f[0][key]}, "
                                                            f"kvbench run {e[key]}")
        check(seen == 10, f"{seen} of 10 sweep rows matched to individual runs")
        summ = list(csv.DictReader(open(os.path.join(out, "summary.csv"))))
        for s in summ:
            g = [float(x["recall"]) for x in rows if (x["method"], x["params"], x["k"]) == (s["method"], s["params"], s["k"])]
            check(int(s["seeds"]) == len(g) and close(s["recall_mean"], statistics.mean(g)), f"summary mean {s}")
            if len(g) > 1:
                check(close(s["recall_std"], statistics.stdev(g)), f"summary std {s['recall_std']} vs {statistics.stdev(g)}")
        import sqlite3
        db = sqlite3.connect(os.path.join(out, "results.sqlite"))
        check(db.execute("select count(*) from results").fetchone()[0] == 10, "sqlite results rows")
        check(db.execute("select count(*) from profile").fetchone()[0] > 0, "sqlite profile rows")
        db.close()
        # a second call runs nothing
        r = sweep(cfg, out, "--dry-run")
        check("0 pending" in r.stdout, f"second call not fully cached: {r.stdout}")

        # 3. kill after the first process, resume runs only the missing ones (a grid of 4 processes)
        cfg4 = os.path.join(tmp, "four.toml")
        open(cfg4, "w").write(open(cfg).read().replace("page = [8, 16]", "page = [8, 16, 32, 64]"))
        r = sweep(cfg4, os.path.join(tmp, "sw4"))
        check(r.returncode == 0, f"4-process sweep exit {r.returncode}: {r.stderr}")
        rows = list(csv.DictReader(open(os.path.join(tmp, "sw4", "results.csv"))))
        out2 = os.path.join(tmp, "sw2")
        p = subprocess.Popen([sys.executable, SWEEP, cfg4, "--out", out2, "--kvbench", KV], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        t0 = time.time()
        runs = os.path.join(out2, "runs")
        while time.time() - t0 < 60:
            if os.path.isdir(runs) and any(os.path.isfile(os.path.join(runs, d, "summary.json")) and ".tmp." not in d
                                           for d in os.listdir(runs)):  # finished: renamed from DIR.tmp.<pid>
                break
            time.sleep(0.02)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        have = {d for d in os.listdir(runs) if os.path.isfile(os.path.join(runs, d, "summary.json")) and ".tmp." not in d}
        r = sweep(cfg4, out2, "--dry-run")
        pending = [l.split()[1] for l in r.stdout.splitlines() if l.startswith("pending")]
        check(1 <= len(have) < 4 and not (set(pending) & have) and len(have) + len(pending) == 4,
              f"after the kill: done {have}, pending {pending}")
        mt = {d: os.stat(os.path.join(runs, d, "summary.json")).st_mtime_ns for d in have}
        r = sweep(cfg4, out2)
        check(r.returncode == 0, f"resumed sweep exit {r.returncode}: {r.stderr}")
        check(all(os.stat(os.path.join(runs, d, "summary.json")).st_mtime_ns == mt[d] for d in have),
              "the resumed sweep re-ran a finished process")
        check(f"{len(have)} done, {4 - len(have)} to run" in r.stderr, f"resume plan: {r.stderr.splitlines()[:1]}")
        check(not any(".tmp." in d for d in os.listdir(runs)), f"a killed run's temporary directory is left: {os.listdir(runs)}")
        rows2 = list(csv.DictReader(open(os.path.join(out2, "results.csv"))))
        key = lambda x: (x["method"], x["params"], x["k"], x["seed"])
        check(sorted((key(x), x["recall"]) for x in rows2) == sorted((key(x), x["recall"]) for x in rows),
              "resumed sweep's table differs from the uninterrupted one")

        # 4. validation names the line
        bad = {
            "[sweep]\ntraces = [\"x\"]\nfrob = 1\n": (3, "[sweep] has no key 'frob'"),
            f"[sweep]\ntraces = [\"{DEMO}\"]\n\n[methods.nope]\n": (4, "unknown method 'nope'"),
            f"[sweep]\ntraces = [\"{DEMO}\"]\n[methods.quest]\npage = 8\npagee = 2\n": (5, "method quest has no parameter 'pagee'"),
            f"[sweep]\ntraces = [\"{DEMO}\"]\n[methods.quest]\npage = [8, 0]\n": (4, "expected an integer in [1, 65536]"),
            f"[sweep]\ntraces = [\"{DEMO}\"]\n[protocol]\nstrde = 2\n[methods.exact]\n": (4, "[protocol] has no key 'strde'"),
            f"[sweep]\ntraces = [\"{DEMO}\"]\n[methods.quest]\npool = \"avg\"\n": (4, "expected one of none|mean|max"),
            f"[sweep]\ntraces = [\"/nonexistent/*.h5\"]\n[methods.exact]\n": (2, "matches no file"),
        }
        for i, (text, (line, needle)) in enumerate(bad.items()):
            c = os.path.join(tmp, f"bad{i}.toml")
            open(c, "w").write(text)
            r = sweep(c, os.path.join(tmp, f"bad{i}"))
            check(r.returncode == 2 and f"bad{i}.toml:{line}:" in r.stderr and needle in r.stderr,
                  f"config {i}: exit {r.returncode}, want 2 with '{c}:{line}: ... {needle}': {r.stderr.strip()}")

        # layers = "all" resolves every layer of a multi-layer trace (kvbench info lists them space-separated)
        syn2 = os.path.join(tmp, "syn2.h5")
        kv("synth", "--out", syn2, "--tokens", "300", "--prefill", "200", "--q-heads", "2", "--kv-heads", "1", "--dim",
           "16", "--layers", "3")
        c3 = os.path.join(tmp, "layers.toml")
        open(c3, "w").write(f'[sweep]\ntraces = ["{syn2}"]\nlayers = "all"\nlayers_per_job = 2\n[methods.exact]\n')
        r = sweep(c3, os.path.join(tmp, "sw5"), "--dry-run")
        check(r.returncode == 0 and "--layer L0,L1 " in r.stdout and "--layer L2 " in r.stdout and
              "2 processes (3 runs)" in r.stdout, f"layers = all on a 3-layer trace, 2 per job: {r.stdout} {r.stderr}")

        # 5. two workers sharing one GPU (or the CPU) == one worker
        rows = list(csv.DictReader(open(os.path.join(out, "results.csv"))))
        out3 = os.path.join(tmp, "sw3")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="0")
        r = sweep(cfg, out3, "--gpus", "2", env=env)
        check(r.returncode == 0 and "workers share" in r.stderr, f"--gpus 2 on one GPU: exit {r.returncode}: {r.stderr}")
        rows3 = list(csv.DictReader(open(os.path.join(out3, "results.csv"))))
        check(sorted((key(x), x["recall"], x["mass"]) for x in rows3) == sorted((key(x), x["recall"], x["mass"]) for x in rows),
              "--gpus 2 (shared GPU) differs from one worker")
        # each run's log names its worker and GPU and ends with its exit and seconds; the workers' shares add up to
        # the processes run, and each worker's busy seconds are the sum of its runs' (to the printed 0.1 s)
        logs = sorted(glob.glob(os.path.join(out3, "logs", "*.log")))
        per = {}
        for f in logs:
            lines = open(f).read().splitlines()
            m0 = re.fullmatch(r"# worker (\d) on GPU 0", lines[0]) if lines else None
            m1 = re.fullmatch(r"# worker (\d) on GPU 0: exit 0 after ([0-9.]+) s", lines[-1]) if lines else None
            check(m0 and m1 and m0.group(1) == m1.group(1), f"{f}: first/last line {lines[:1]} {lines[-1:]}")
            if m0 and m1:
                per.setdefault(int(m0.group(1)), []).append(float(m1.group(2)))
        shares = {int(w): (int(n), float(s)) for w, n, s in
                  re.findall(r"sweep\.py: worker (\d) on GPU 0: (\d+) processes, ([0-9.]+) s busy", r.stderr)}
        agree = lambda w: (shares[w][0] == len(per.get(w, [])) and
                           abs(shares[w][1] - sum(per.get(w, []))) <= 0.05 * (1 + len(per.get(w, []))))
        check(sorted(shares) == [0, 1] and sum(n for n, _ in shares.values()) == len(logs) and all(map(agree, shares)),
              f"--gpus 2: worker shares {shares} against the logs {per}: {r.stderr}")

if PART in ("pareto", "all"):
    # 6. the Pareto front of a hand-made point set, and the leaderboard's interpolation
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import pareto
    pts = [(10, 0.5), (20, 0.4), (20, 0.7), (40, 0.7), (5, 0.1), (80, 0.95), (60, 0.9), (60, 0.6), (None, 1.0),
           (100, 0.95), (5, 0.2)]
    # by hand: (5,0.2) [(5,0.1) dominated by it], (10,0.5), (20,0.7) [(20,0.4) and (40,0.7) dominated],
    # (60,0.9) [(60,0.6) dominated], (80,0.95) [(100,0.95) dominated: same quality, more cost]
    check(pareto.pareto_front(pts, True) == [10, 0, 2, 6, 5], f"front {pareto.pareto_front(pts, True)}")
    # lower is better (an error): (5,0.1) then nothing cheaper-and-lower... every later point has a larger error
    check(pareto.pareto_front(pts, False) == [4], f"lower-better front {pareto.pareto_front(pts, False)}")
    err = [(8, 0.3), (16, 0.1), (32, 0.12), (64, 0.04), (128, 0.01)]
    check(pareto.pareto_front(err, False) == [0, 1, 3, 4], f"error front {pareto.pareto_front(err, False)}")
    curve = [(16, 0.5), (64, 0.9), (256, 1.0)]
    check(abs(pareto.interp_log(curve, 32) - 0.7) < 1e-12, "log interpolation at 32 between 16 and 64")
    check(abs(pareto.cost_to_reach(curve, 0.7) - 32) < 1e-9, f"cost to 0.7: {pareto.cost_to_reach(curve, 0.7)}")
    check(pareto.cost_to_reach(curve, 1.01) is None, "an unreachable target is None")
    check(abs(pareto.cost_to_reach([(8, 0.3), (16, 0.1), (64, 0.04)], 0.05, False) - 16 * 4 ** (5 / 6)) < 1e-9,
          "cost to error 0.05")
    # AUC over log budget [16, 256]: 0.5->0.9 linear on [16,64] (mean 0.7), 0.9->1.0 on [64,256] (mean 0.95)
    check(abs(pareto.auc_log(curve, 16, 256) - 0.825) < 1e-3, f"AUC {pareto.auc_log(curve, 16, 256)}")
    check(abs(pareto.auc_log([(64, 1.0)], 16, 256) - 0.5) < 1e-3, "AUC counts 0 below the smallest budget")

print("test_sweep: " + ("ok" if not fails else f"{fails} failures"))
sys.exit(1 if fails else 0)
