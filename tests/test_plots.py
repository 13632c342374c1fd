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
    sweep_plots(tmp)
    return 1 if failures else 0


def sweep_plots(tmp):
    """issue 11: plot_pareto.py (every metric and cost), plot_profile.py (a sweep and a run directory), the
    leaderboard, from a tiny sweep of the demo trace; a folder without a sweep gives one line, no traceback."""
    cfg = os.path.join(tmp, "tiny.toml")
    with open(cfg, "w") as f:
        f.write(f'[sweep]\ntraces = ["{os.path.join(ROOT, "datasets", "demo.h5")}"]\nk = [16, 64, 256]\nseeds = 2\n'
                '[protocol]\nstride = 64\nthreads = 1\n[methods.exact]\n[methods.random]\n[methods.quest]\npage = [8, 16]\n')
    sw = os.path.join(tmp, "sweep")
    rc, out, err = sh("python3", os.path.join(ROOT, "scripts", "sweep.py"), cfg, "--out", sw, "--kvbench", BIN)
    check(rc == 0, f"sweep.py: exit {rc}: {err[-400:]}")
    pngs = []
    for metric in ("recall", "mass", "output_error"):
        png = os.path.join(tmp, f"pareto-{metric}.png")
        rc, out, err = sh("python3", os.path.join(ROOT, "scripts", "plot_pareto.py"), sw, "--metric", metric, "--out", png)
        check(rc == 0 and "Traceback" not in err, f"plot_pareto.py --metric {metric}: exit {rc}: {err[-400:]}")
        pngs.append(png)
    png = os.path.join(tmp, "pareto-avg.png")
    rc, out, err = sh("python3", os.path.join(ROOT, "scripts", "plot_pareto.py"), sw, "--average", "--costs", "budget",
                      "--out", png)
    check(rc == 0, f"plot_pareto.py --average: exit {rc}: {err[-400:]}")
    pngs.append(png)
    for src in (sw, os.path.join(sw, "runs", sorted(os.listdir(os.path.join(sw, "runs")))[0])):
        png = os.path.join(tmp, f"profile-{len(pngs)}.png")
        rc, out, err = sh("python3", os.path.join(ROOT, "scripts", "plot_profile.py"), src, "--out", png)
        check(rc == 0 and "Traceback" not in err, f"plot_profile.py {src}: exit {rc}: {err[-400:]}")
        pngs.append(png)
    for png in pngs:
        ok = os.path.isfile(png) and os.path.getsize(png) > 10000
        if ok:
            with open(png, "rb") as f:
                head = f.read(24)
            w, h = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
            ok = head[:8] == b"\x89PNG\r\n\x1a\n" and w > 400 and h > 300
        check(ok, f"{png}: not a readable figure")
    rc, out, err = sh("python3", os.path.join(ROOT, "scripts", "leaderboard.py"), sw)
    check(rc == 0 and "| exact | 1.000 | 1.000 | 16 |" in out, f"leaderboard: exit {rc}: {out[-600:]} {err[-300:]}")
    empty = os.path.join(tmp, "not-a-sweep")
    os.makedirs(empty, exist_ok=True)
    for script in ("plot_pareto.py", "plot_profile.py", "leaderboard.py"):
        rc, out, err = sh("python3", os.path.join(ROOT, "scripts", script), empty)
        check(rc != 0 and "Traceback" not in err and "no such file" in err, f"{script} on a folder without a sweep: "
                                                                          f"exit {rc}: {err[-300:]}")


if __name__ == "__main__":
    sys.exit(main())
