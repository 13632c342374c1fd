#!/usr/bin/env python3
"""test_slurm.py: scripts/sweep.py's Slurm backend on a real single-node Slurm cluster (issue 11).

The test brings its own cluster: a munge key, munged, slurmctld and slurmd, all as root in a temporary
directory with their own socket, ports (free ones on 127.0.0.1), spool and state directories, and a
slurm.conf for one node (this machine, CPUs = its cores, no cgroups: proctrack/linuxproc, task/none,
no accounting). It runs a two-task array through `sweep.py --backend slurm --chunks 2`, waits for it with
squeue, gathers with `--collect`, and checks the table equals the same sweep run locally, and that each
array task ran its own chunk. Then it stops the daemons it started (by pid).

Needs: root, and Debian's slurm-wlm + munge packages; when they are missing it installs them with apt-get
(bounded by a timeout) and skips, with the reason, where that is impossible (not root, no apt-get, no
network) or where a daemon does not start. Exit 0 pass, 1 fail, 77 skip (reason on stdout)."""
import csv
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KV = os.environ.get("KVBENCH_BIN", os.path.join(ROOT, "kvbench"))
DEMO = os.path.join(ROOT, "datasets", "demo.h5")
SWEEP = os.path.join(ROOT, "scripts", "sweep.py")
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo")


def skip(why):
    print(f"test_slurm: skipped: {why}")
    sys.exit(77)


def fail(why):
    print(f"test_slurm: FAIL: {why}")
    sys.exit(1)


def which_all():
    return {d: shutil.which(d) or (os.path.exists(f"/usr/sbin/{d}") and f"/usr/sbin/{d}") for d in DAEMONS}


def ensure_packages():
    have = which_all()
    if all(have.values()):
        return have
    if os.geteuid() != 0:
        skip(f"{', '.join(d for d, p in have.items() if not p)} not installed and not root (apt-get install slurm-wlm munge)")
    if not shutil.which("apt-get"):
        skip("slurm-wlm/munge not installed and no apt-get on this machine")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    print("test_slurm: installing slurm-wlm and munge with apt-get (a few minutes at most)", flush=True)
    try:
        r = subprocess.run(["apt-get", "install", "-y", "-qq", "slurm-wlm", "munge"], env=env, capture_output=True,
                           text=True, timeout=300)
        if r.returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=180)
            r = subprocess.run(["apt-get", "install", "-y", "-qq", "slurm-wlm", "munge"], env=env, capture_output=True,
                               text=True, timeout=300)
    except subprocess.TimeoutExpired:
        skip("apt-get install slurm-wlm munge did not finish within its time limit")
    have = which_all()
    if r.returncode != 0 or not all(have.values()):
        skip(f"apt-get install slurm-wlm munge failed: {(r.stderr or r.stdout).strip()[-300:]}")
    return have


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_for(cond, timeout, step=0.5):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if cond():
            return True
        time.sleep(step)
    return False


def main():
    if not os.path.isfile(DEMO) or not os.access(KV, os.X_OK):
        skip(f"needs {DEMO} and the kvbench binary {KV}")
    if os.geteuid() != 0:
        skip("the local cluster's daemons run as root in this test (slurmd must start jobs)")
    bins = ensure_packages()
    procs = []
    tmp = tempfile.mkdtemp(prefix="kvb-slurm-")
    os.chmod(tmp, 0o755)
    try:
        return run_cluster(bins, tmp, procs)
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def run_cluster(bins, tmp, procs):
    d = lambda *x: os.path.join(tmp, *x)
    for sub in ("munge", "state", "spool", "log"):
        os.makedirs(d(sub), mode=0o700)
    with open(d("munge", "munge.key"), "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(d("munge", "munge.key"), 0o400)
    sock = d("munge", "munge.socket")
    procs.append(subprocess.Popen([bins["munged"], "-F", "--force", f"--socket={sock}",
                                   f"--key-file={d('munge', 'munge.key')}", f"--pid-file={d('munge', 'munged.pid')}",
                                   f"--seed-file={d('munge', 'seed')}", f"--log-file={d('log', 'munged.log')}"],
                                  stdout=subprocess.DEVNULL, stderr=open(d("log", "munged.err"), "w")))
    if not wait_for(lambda: os.path.exists(sock), 20, 0.2):
        skip(f"munged did not start: {open(d('log', 'munged.err')).read()[-300:]}")
    cores = os.cpu_count() or 1
    host = socket.gethostname()
    conf = d("slurm.conf")
    open(conf, "w").write(f"""ClusterName=kvbtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={d('state')}
SlurmdSpoolDir={d('spool')}
SlurmctldPidFile={d('slurmctld.pid')}
SlurmdPidFile={d('slurmd.pid')}
SlurmctldLogFile={d('log', 'slurmctld.log')}
SlurmdLogFile={d('log', 'slurmd.log')}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
MinJobAge=300
NodeName=kvbnode NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cores} State=UNKNOWN
PartitionName=kvbtest Nodes=kvbnode Default=YES MaxTime=INFINITE State=UP
""")
    env = dict(os.environ, SLURM_CONF=conf)
    os.environ["SLURM_CONF"] = conf
    procs.append(subprocess.Popen([bins["slurmctld"], "-D", "-i", "-f", conf], env=env, stdout=subprocess.DEVNULL,
                                  stderr=open(d("log", "slurmctld.err"), "w")))
    procs.append(subprocess.Popen([bins["slurmd"], "-D", "-N", "kvbnode", "-f", conf], env=env,
                                  stdout=subprocess.DEVNULL, stderr=open(d("log", "slurmd.err"), "w")))

    def node_idle():
        r = subprocess.run([bins["sinfo"], "-h", "-N", "-o", "%t"], env=env, capture_output=True, text=True)
        return r.returncode == 0 and r.stdout.strip() in ("idle", "mix", "alloc")
    if not wait_for(node_idle, 60):
        logs = "".join(open(d("log", f)).read()[-400:] for f in ("slurmctld.err", "slurmd.err") if os.path.exists(d("log", f)))
        for f in ("slurmctld.log", "slurmd.log"):
            if os.path.exists(d("log", f)):
                logs += open(d("log", f)).read()[-400:]
        skip(f"the single-node cluster did not come up within 60 s (sinfo): {logs.strip()}")
    print(f"test_slurm: cluster up: node kvbnode ({cores} CPUs), SLURM_CONF={conf}", flush=True)

    cfg = d("tiny.toml")
    open(cfg, "w").write(f"""[sweep]
traces = ["{DEMO}"]
k = [16, 64]
[protocol]
stride = 32
threads = 1
[methods.exact]
[methods.quest]
page = [8, 16]
""")
    out_local, out_slurm = d("local"), d("slurm-out")
    r = subprocess.run([sys.executable, SWEEP, cfg, "--out", out_local, "--kvbench", KV], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"local sweep failed: {r.stderr}")
    r = subprocess.run([sys.executable, SWEEP, cfg, "--out", out_slurm, "--kvbench", KV, "--backend", "slurm",
                        "--chunks", "2"], capture_output=True, text=True, env=env)
    if r.returncode != 0 or "submitted array job" not in r.stdout:
        fail(f"sweep --backend slurm: exit {r.returncode}: {r.stdout} {r.stderr}")
    job = r.stdout.split("submitted array job ")[1].split()[0]
    script = open(os.path.join(out_slurm, "slurm", "sweep.sbatch")).read()
    if "#SBATCH --array=0-1" not in script:
        fail(f"the sbatch script has no 2-task array: {script}")

    def finished():
        q = subprocess.run([bins["squeue"], "-h", "-j", job], env=env, capture_output=True, text=True)
        return q.returncode == 0 and not q.stdout.strip() or "Invalid job id" in q.stderr
    if not wait_for(finished, 240):
        fail(f"array job {job} still queued/running after 240 s: "
             f"{subprocess.run([bins['squeue']], env=env, capture_output=True, text=True).stdout}")
    outs = [os.path.join(out_slurm, "slurm", f"task-{i}.out") for i in (0, 1)]
    if not all(os.path.isfile(o) for o in outs):
        fail(f"array task outputs missing: {os.listdir(os.path.join(out_slurm, 'slurm'))}; "
             f"{open(d('log', 'slurmd.log')).read()[-600:]}")
    r = subprocess.run([sys.executable, SWEEP, cfg, "--out", out_slurm, "--kvbench", KV, "--collect"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"--collect: exit {r.returncode}: {r.stdout} {r.stderr}; task logs: "
             + " | ".join(open(o).read()[-300:] for o in outs))
    key = lambda x: (x["method"], x["params"], x["k"], x["seed"])
    a = sorted((key(x), x["recall"], x["mass"], x["output_error"]) for x in csv.DictReader(open(os.path.join(out_local, "results.csv"))))
    b = sorted((key(x), x["recall"], x["mass"], x["output_error"]) for x in csv.DictReader(open(os.path.join(out_slurm, "results.csv"))))
    if a != b or len(a) != 6:
        fail(f"Slurm results differ from local ones ({len(b)} vs {len(a)} rows): {b} vs {a}")
    jobs_per_task = [open(o).read().count("runs ") for o in outs]
    if min(jobs_per_task) < 1:
        fail(f"an array task ran nothing (progress lines per task {jobs_per_task}): "
             + " | ".join(open(o).read()[-300:] for o in outs))
    print(f"test_slurm: array job {job}: 2 tasks, {len(b)} rows equal to the local sweep")
    return 0


if __name__ == "__main__":
    sys.exit(main())
