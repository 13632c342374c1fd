#!/usr/bin/env python3
"""golden_run.py: the in-run selections and metrics of `kvbench run` on a
fixed slice of the demo trace, bit for bit (issue 12, goal 6: the speed work
of the run loop must not change a number).

  golden_run.py make  BIN DIR [--device cpu|gpu] [--threads N]
      runs BIN on the fixed configuration and writes DIR/steps.csv.gz,
      DIR/drift.csv and DIR/summary.json (the summary without timings,
      host, command or version: every accuracy number and count it holds)
  golden_run.py check BIN DIR [--device cpu|gpu] [--threads N]
      runs BIN the same way and compares with DIR byte for byte; exit 1
      naming the first differing line of each differing file.

The committed reference tests/golden/run-cpu was made by the CPU binary
of main at 21e04c7 with the method-side commits 9d51ffe, aadf90a and 61341f7
merged (all in main's history) (ParisKV's bf16 RSQ weights, which change
ParisKV's numbers on purpose; RACC's index parameters, which change its
parameter string; the CSAttention/CTKVR GPU kernels) and none of the
run-loop or loader work, so the check compares that work with an
independent earlier implementation, not with itself. Against main at
21e04c7's own output only ParisKV's rows differ.
The GPU reference tests/golden/run-gpu was made on the lent H100 by the
same tree plus d6f6319 (the CTKVR kernel's shared-memory launch fix,
without which that tree's GPU CTKVR cannot start; it changes no number),
built there from a source tarball (scripts/dev/s4-loop.sh with BASE_BIN),
and 3d3fd0e matched it bit for bit in the same call.
The configuration covers all twelve demo methods, 26 steps spread over
the whole decode (stride 40), and two budgets (the multi-budget path). """
import gzip, json, os, subprocess, sys, tempfile

METHODS = "exact,pariskv,csattention,ctkvr,freekv,racc,pqcache,quest,magicpig,streaming,random,sampled"
TIMING = {"build_seconds", "append_seconds_total", "search_us_median", "search_us_p90", "search_seconds_total",
          "diagnostics_seconds_total", "search_timer"}
DROP_TOP = {"kvbench_version", "git_sha", "command", "started", "wall_seconds", "host", "phase_seconds", "device"}


def run(binary, device, threads, trace):
    out = tempfile.mkdtemp(prefix="kvgolden.")
    cmd = [binary, "run", "--trace", trace, "--method", METHODS, "--k", "32,100", "--stride", "40",
           "--max-steps", "26", "--device", device, "--out", os.path.join(out, "r"), "--quiet"]
    if threads: cmd += ["--threads", str(threads)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("golden_run.py: %s failed (exit %d):\n%s" % (" ".join(cmd), p.returncode, p.stderr))
    r = os.path.join(out, "r")
    steps = open(os.path.join(r, "steps.csv"), "rb").read()
    drift = open(os.path.join(r, "drift.csv"), "rb").read()
    s = json.load(open(os.path.join(r, "summary.json")))
    for k in DROP_TOP: s.pop(k, None)
    s.get("trace", {}).pop("path", None)
    for m in s["methods"]:
        for k in TIMING: m.pop(k, None)
    summ = (json.dumps(s, indent=1, sort_keys=True) + "\n").encode()
    subprocess.run(["rm", "-rf", out])
    return {"steps.csv": steps, "drift.csv": drift, "summary.json": summ}


def main():
    a = sys.argv[1:]
    if len(a) < 3 or a[0] not in ("make", "check"):
        sys.exit(__doc__)
    mode, binary, d = a[0], a[1], a[2]
    device, threads = "cpu", 0
    rest = a[3:]
    while rest:
        if rest[0] == "--device": device = rest[1]; rest = rest[2:]
        elif rest[0] == "--threads": threads = int(rest[1]); rest = rest[2:]
        else: sys.exit("golden_run.py: unknown argument %r" % rest[0])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    got = run(binary, device, threads, os.path.join(root, "datasets", "demo.h5"))
    if mode == "make":
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "steps.csv.gz"), "wb") as f:
            f.write(gzip.compress(got["steps.csv"], mtime=0))
        for n in ("drift.csv", "summary.json"):
            open(os.path.join(d, n), "wb").write(got[n])
        print("golden_run.py: wrote %s (%d step rows)" % (d, got["steps.csv"].count(b"\n") - 1))
        return
    want = {"steps.csv": gzip.decompress(open(os.path.join(d, "steps.csv.gz"), "rb").read()),
            "drift.csv": open(os.path.join(d, "drift.csv"), "rb").read(),
            "summary.json": open(os.path.join(d, "summary.json"), "rb").read()}
    bad = 0
    for n in ("steps.csv", "drift.csv", "summary.json"):
        if got[n] == want[n]:
            continue
        bad = 1
        gl, wl = got[n].split(b"\n"), want[n].split(b"\n")
        i = next((i for i in range(min(len(gl), len(wl))) if gl[i] != wl[i]), min(len(gl), len(wl)))
        print("golden_run.py: %s differs from %s/%s at line %d (%d vs %d lines):\n  got  %s\n  want %s" % (
            n, d, n, i + 1, len(gl), len(wl), gl[i].decode() if i < len(gl) else "<end>",
            wl[i].decode() if i < len(wl) else "<end>"))
    if bad:
        sys.exit(1)
    print("golden_run.py: %s matches %s bit for bit (%d step rows)" % (binary, d, got["steps.csv"].count(b"\n") - 1))


if __name__ == "__main__":
    main()
