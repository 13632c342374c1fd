#!/usr/bin/env python3
"""test_plots.py: the plot scripts (issue 16, point 2). Run by the test
runner (test plots_style_and_errors) from the repository root with
KVBENCH_BIN; exit 0 pass, 1 fail, 77 skip (no matplotlib anywhere).
Checks: every method has one fixed colour and marker (distinct colours for
the known names, including the planned ones), a name outside the table gets
the same style in another process (hash seed); plot_drift.py started with
an interpreter without matplotlib finds the project's .venv; a window's
point lies inside the decode positions of the trace; a run of a trace
without values, a directory that is not a run and a run without rows give
a figure or a one-line message, never a traceback."""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import kvstyle  # noqa: E402

BIN = os.environ.get("KVBENCH_BIN", os.path.join(ROOT, "kvbench"))
PLOT = os.path.join(ROOT, "scripts", "plot_drift.py")
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print(f"    test_plots.py: {msg}", file=sys.stderr)


def sh(*cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return p.returncode, p.stdout, p.stderr


def have_matplotlib():
    venv_py = os.path.join(ROOT, ".venv", "bin", "python")
    for py in (sys.executable, venv_py):
        if os.path.isfile(py) and sh(py, "-c", "import matplotlib")[0] == 0:
            return True
    return False


def main():
    # the style table
    names = ["exact", "random", "streaming", "pariskv", "pqcache", "quest", "magicpig", "faiss-flat", "faiss-ivf",
             "faiss-ivfpq", "faiss-hnsw", "csattention", "ctkvr", "freekv", "racc", "sink-nearest"]
    colours = [kvstyle.style(n)[0].lower() for n in names]
    check(all(n in kvstyle.METHOD_STYLE for n in names), "a known method has no fixed style")
    check(len(set(colours)) == len(colours), f"two known methods share a colour: {colours}")
    fb = kvstyle.style("my-new-method")
    code = "import sys; sys.path.insert(0, 'scripts'); import kvstyle; print(kvstyle.style('my-new-method'))"
    for seed in ("1", "2"):
        rc, out, _ = sh(sys.executable, "-c", code, env=dict(os.environ, PYTHONHASHSEED=seed))
        check(rc == 0 and out.strip() == str(fb), f"fallback style differs across processes: {out.strip()} vs {fb}")
    check(fb[0].lower() not in colours, "the fallback colour of a new name is one of the fixed colours")
    check(kvstyle.method_order(["zz", "streaming", "exact", "aa"]) == ["exact", "streaming", "aa", "zz"],
          "method_order")
    if not have_matplotlib():
        print("matplotlib not installed (make pydeps): plot checks skipped")
        return 77 if not failures else 1

    tmp = tempfile.mkdtemp(prefix="kvbench-plots-")
    a, b, nov = (os.path.join(tmp, x) for x in ("a", "b", "nov"))
    runs = [
        [BIN, "run", "--trace", "datasets/demo.h5", "--method", "exact,streaming,random", "--device", "cpu",
         "--stride", "8", "--window", "100", "--out", a, "--quiet"],
        [BIN, "run", "--trace", "datasets/demo.h5", "--method", "pariskv,streaming", "--device", "cpu",
         "--stride", "16", "--out", b, "--quiet"],
        [BIN, "synth", "--out", os.path.join(tmp, "nov.h5"), "--tokens", "500", "--prefill", "400", "--q-heads",
         "4", "--kv-heads", "2", "--dim", "32", "--no-values"],
        [BIN, "run", "--trace", os.path.join(tmp, "nov.h5"), "--method", "exact,streaming", "--device", "cpu",
         "--out", nov, "--quiet"],
    ]
    for cmd in runs:
        rc, _, err = sh(*cmd)
        if rc != 0:
            check(False, f"{' '.join(cmd)}: exit {rc}: {err}")
            return 1

    import plot_drift
    summary, series = plot_drift.load(a)
    P, T = summary["trace"]["prefill_len"], summary["trace"]["num_tokens"]
    xs = [x for s in series.values() for x in s["x"]]
    check(min(xs) >= P and max(xs) <= T - 1, f"window points outside the decode positions [{P}, {T}): "
          f"{min(xs)}..{max(xs)}")

    # system python3 first: without matplotlib it must re-run itself with .venv/bin/python
    out_png = os.path.join(tmp, "ab.png")
    rc, out, err = sh("python3", PLOT, a, b, nov, "-o", out_png, "--title", "T")
    check(rc == 0 and os.path.getsize(out_png) > 10000 and "Traceback" not in err,
          f"plot of three runs (one without values): exit {rc}: {err[-400:]}")
    empty = os.path.join(tmp, "empty")
    os.makedirs(empty)
    rc, out, err = sh(sys.executable, PLOT, empty, "-o", os.path.join(tmp, "x.png"))
    check(rc == 1 and err.startswith("plot_drift.py: ") and "Traceback" not in err,
          f"not a run directory: exit {rc}: {err[-300:]}")
    with open(os.path.join(a, "drift.csv")) as f:
        header = f.readline()
    with open(os.path.join(empty, "drift.csv"), "w") as f:
        f.write(header)
    os.link(os.path.join(a, "summary.json"), os.path.join(empty, "summary.json"))
    rc, out, err = sh(sys.executable, PLOT, empty, "-o", os.path.join(tmp, "x.png"))
    check(rc == 1 and "no rows" in err and "Traceback" not in err, f"run without rows: exit {rc}: {err[-300:]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
