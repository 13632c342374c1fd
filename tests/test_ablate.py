#!/usr/bin/env python3
"""test_ablate.py: scripts/ablate.py against kvbench runs made directly.

On the bundled demo trace (every 16th step), a two-variant ablation must give
the numbers `kvbench run` gives for the same parameters; a second call must
reuse every run (no kvbench process) and give the same table; a table with an
unknown key, and an unknown variant, must be refused with exit 2. Standard
library only. Exit 0 pass, 1 fail."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KV = os.environ.get("KVBENCH_BIN", os.path.join(ROOT, "kvbench"))
TRACE = os.path.join(ROOT, "datasets", "demo.h5")
OPTS = ["--stride", "16"]
fails = 0


def check(cond, msg):
    global fails
    if not cond:
        fails += 1
        print(f"test_ablate: FAIL: {msg}")


def ablate(out, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "ablate.py"), "--kvbench", KV, "--out", out,
                           *args], capture_output=True, text=True)


with tempfile.TemporaryDirectory() as tmp:
    names = ["learned centroids (prior work)", "ParisKV, tiers=binary"]
    sel = ["--variant", names[0], "--variant", names[1]]
    r = ablate(os.path.join(tmp, "a"), "pariskv", "--traces", TRACE, *sel, "--", *OPTS)
    check(r.returncode == 0, f"ablate exit {r.returncode}: {r.stderr}")
    rows = {}
    import csv
    with open(os.path.join(tmp, "a", "ablation.csv")) as f:
        for row in csv.DictReader(f):
            rows[row["variant"]] = row
    check(sorted(rows) == sorted(names), f"rows {sorted(rows)}")
    direct = {"learned centroids (prior work)": "centroids=kmeans,rotation=none,normalize=0,rerank=exact,update=1",
              "ParisKV, tiers=binary": "tiers=binary,update=1"}
    for name, ps in direct.items():
        d = os.path.join(tmp, "direct-" + str(len(ps)))
        cmd = [KV, "run", "--trace", TRACE, "--method", "pariskv", "--out", d, "--quiet", *OPTS]
        for p in ps.split(","):
            cmd += ["--param", "pariskv." + p]
        subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
        m = json.load(open(os.path.join(d, "summary.json")))["methods"][0]
        for key in ("recall", "candidate_recall", "recall_generated_keys", "mass", "output_error"):
            check(abs(float(rows[name][key]) - m[key]) <= 1e-6 * max(1.0, abs(m[key])),
                  f"{name}: {key} {rows[name][key]} vs direct run {m[key]}")
    table = open(os.path.join(tmp, "a", "table.md")).read()
    r2 = ablate(os.path.join(tmp, "a"), "pariskv", "--traces", TRACE, *sel, "--", *OPTS)
    check(r2.returncode == 0 and r2.stderr.count("cached") == 2 and "running" not in r2.stderr,
          f"second call did not reuse both runs: {r2.stderr}")
    check(open(os.path.join(tmp, "a", "table.md")).read() == table, "second call changed table.md")
    r3 = ablate(os.path.join(tmp, "a"), "pariskv", "--traces", TRACE, *sel, "--", "--stride", "32")
    check(r3.returncode == 0 and r3.stderr.count("running") == 2, f"a changed option reused a run: {r3.stderr}")
    bad = os.path.join(tmp, "bad.toml")
    open(bad, "w").write('method = "pariskv"\nbeta = 1\n[[variant]]\nname = "x"\nparams = ""\n')
    r4 = ablate(os.path.join(tmp, "b"), bad, "--traces", TRACE)
    check(r4.returncode == 2 and "unknown keys: ['beta']" in r4.stderr, f"bad table: exit {r4.returncode} {r4.stderr}")
    r5 = ablate(os.path.join(tmp, "b"), "pariskv", "--traces", TRACE, "--variant", "nope")
    check(r5.returncode == 2 and "nope" in r5.stderr, f"unknown variant: exit {r5.returncode} {r5.stderr}")
    # every layer of a multi-layer trace (kvbench info lists them space-separated: "L0(float16) L1(float16) ...")
    syn = os.path.join(tmp, "syn3.h5")
    subprocess.run([KV, "synth", "--out", syn, "--tokens", "600", "--prefill", "400", "--q-heads", "4", "--kv-heads",
                    "2", "--dim", "32", "--layers", "3"], check=True, capture_output=True)
    r6 = ablate(os.path.join(tmp, "c"), "pariskv", "--traces", syn, "--variant", names[1], "--", "--stride", "32")
    check(r6.returncode == 0, f"ablate on a 3-layer trace: exit {r6.returncode} {r6.stderr}")
    if r6.returncode == 0:
        with open(os.path.join(tmp, "c", "ablation.csv")) as f:
            layers = [row["layer"] for row in csv.DictReader(f)]
        check(layers == ["L0", "L1", "L2"], f"3-layer trace: ablation.csv layers {layers}, want L0 L1 L2")
print(f"test_ablate: {'ok' if not fails else str(fails) + ' failed'}")
sys.exit(1 if fails else 0)
