"""The measurements of issue 32 on one GPU, one step per call (bench/gpu/run_all.sh runs them all; docs/gpu.md).

    python bench/gpu/gpu_bench.py STEP --json OUT.json [--dry] [--budget SECONDS]

STEP is one of:

- ``packing``: fractional packing, 1, 2, 4, 8 client workers per GPU (``engine.worker_num_gpus`` 1, 0.5, 0.25,
  0.125) on the FedRCL-shaped workload (``resnet18_gn``, 3x32x32 images, 100 clients, 10 per round, 5 local epochs
  of batch 50) and on the W1 CNN (``fedavg_cnn``, 1x28x28, 100 Dirichlet-0.3 clients, 10 per round, 1 epoch of
  batch 10): client updates/s over rounds 2..R, GPU utilisation and the GPU memory of every process on the GPU,
  against a plain-PyTorch GPU loop of the same workload in this process;
- ``multiclient``: ``engine.multi_client`` 1 against 5 and 10 on one worker holding the whole GPU, small model
  (the W1 CNN) and large (``resnet18_gn``, one local epoch);
- ``determinism``: the W1 CNN with ``engine.deterministic: true``: final weights hash with 1, 2 and 4 Ray workers,
  in-process, after a driver crash and resume; the rounds' cost against ``deterministic: false``; the same config
  on the CPU (bits and the largest weight difference); one round of ``resnet18_gn`` under the flag (an op without
  a deterministic CUDA kernel stops it, naming the op);
- ``oom``: workers whose GPU share is too small for ``resnet18_gn`` at batch 50 (``engine.worker_num_gpus`` 0.002):
  the run must fail naming ``engine.worker_num_gpus`` (or finish, if the share held), never hang;
- ``split``: SCALA (``alexnet_split``) with the coordinator's server-side model on the GPU and the client parts on
  GPU workers: seconds per local iteration against a one-process GPU loop (bench/bench_split.py's, on the GPU).

Data: the seeded images of bench/gpu/gpu_plugin.py (no mlxtend, no network there). ``--dry``: ``engine.device: cpu``,
tiny sizes and a Ray with a fake GPU, so that every step runs end to end on a CPU machine (run_all.sh --cpu).
Every figure goes into ``--json`` as it is measured (the file is rewritten after each run), so a step cut by its
time limit leaves what it measured; a run that raises is recorded with its error and the step goes on.
``--budget``: no new run starts after that many seconds of the step (the caller's ``timeout`` is the hard limit).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ["FEDRAY_NO_WARM"] = "1"

PLUGIN = str(ROOT / "bench" / "gpu" / "gpu_plugin.py")
T0 = time.monotonic()


# ------------------------------------------------------------------------------------------------ sizes
class Sizes:
    """The workloads' sizes: the issue's on the GPU, tiny ones for the CPU dry run."""

    def __init__(self, dry: bool):
        self.dry = dry
        self.device = "cpu" if dry else "auto"
        self.worker_cpus = 0.5 if dry else 1.0
        # FedRCL-shaped: CIFAR-10's 50,000 3x32x32 images on 100 iid clients (500 each), 5 epochs of batch 50
        self.fedrcl = dict(n_train=2000 if dry else 50000, n_test=200 if dry else 1000, epochs=1 if dry else 5,
                           batch=10 if dry else 50, width=8 if dry else 64, rounds=2 if dry else 3)
        self.w1_rounds = 2 if dry else 4
        self.mc_rounds = 2 if dry else 3
        self.det_rounds = 2 if dry else 3
        self.split = dict(rounds=2 if dry else 4, channels=[8, 8, 8, 16, 16] if dry else [32, 64, 128, 256, 256],
                          fc=[32, 16] if dry else [1024, 512], batch=64 if dry else 320, iters=2 if dry else 5)
        # the dry run packs 1 and 4 workers (each actor's start costs seconds of a shared 2-core machine)
        self.shares = [1.0, 0.25] if dry else [1.0, 0.5, 0.25, 0.125]


def base_config(sz: Sizes, workload: str, out: Path, **engine) -> dict:
    """One run of ``workload`` (fedrcl | w1 | scala) under ``out``; ``engine`` sets engine fields."""
    if workload == "fedrcl":
        f = sz.fedrcl
        data = {"source": "gpu-images", "normalize": False,
                "params": {"n_train": f["n_train"], "n_test": f["n_test"], "channels": 3, "size": 32},
                "partition": {"name": "iid", "num_clients": 100, "params": {}}}
        model = {"name": "resnet18_gn", "params": {"width": f["width"]}}
        train = {"rounds": f["rounds"], "clients_per_round": 10, "local_epochs": f["epochs"], "batch_size": f["batch"],
                 "lr": 0.01}
        algorithm = {"name": "fedavg"}
    elif workload == "w1":
        data = {"source": "gpu-images", "normalize": False,
                "params": {"n_train": 4000, "n_test": 1000, "channels": 1, "size": 28},
                "partition": {"name": "dirichlet", "num_clients": 100, "params": {"alpha": 0.3}}}
        model = {"name": "fedavg_cnn", "params": {}}
        train = {"rounds": sz.w1_rounds, "clients_per_round": 10, "batch_size": 10, "lr": 0.05}
        algorithm = {"name": "fedavg"}
    elif workload == "scala":
        s = sz.split
        data = {"source": "gpu-images", "normalize": True,
                "params": {"n_train": 4000, "n_test": 1000, "channels": 1, "size": 28},
                "partition": {"name": "classes_per_client", "num_clients": 100, "params": {"classes": 2}}}
        model = {"name": "alexnet_split", "params": {"channels": s["channels"], "fc": s["fc"]}}
        train = {"rounds": s["rounds"], "clients_per_round": 10, "lr": 0.01}
        algorithm = {"name": "scala", "params": {"batch_size": s["batch"], "local_iters": s["iters"], "prior": "local",
                                                 "zero_mode": "clamp"}}
    else:
        raise ValueError(workload)
    eng = {"backend": "ray", "device": sz.device, "worker_num_cpus": sz.worker_cpus, "torch_threads": 1}
    eng.update(engine)
    # one partition cache for the step's runs (out is work/<run>): a workload's partition is built once
    return {"seed": 0, "plugins": [PLUGIN], "data": {**data, "cache_dir": str(out.parent / "partitions")},
            "model": model, "algorithm": algorithm, "train": train, "eval": {"every": 10 ** 6},
            "engine": eng,
            "output": {"root": str(out / "runs"), "checkpoint_every": 0, "tensorboard": False, "progress": False}}


# ------------------------------------------------------------------------------------------------ records
class Record:
    """The step's JSON file: rewritten (atomically) after every change."""

    def __init__(self, path: str, step: str, sz: Sizes):
        self.path = path
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.data = {"step": step, "dry_run": sz.dry, "status": "running", "started": time.strftime("%H:%M:%S"),
                     "env": environment(), "runs": [], "errors": []}
        self.save()

    def add(self, entry: dict) -> dict:
        self.data["runs"].append(entry)
        self.save()
        return entry

    def error(self, what: str, err: BaseException) -> None:
        text = "".join(traceback.format_exception_only(type(err), err)).strip()
        self.data["errors"].append({"what": what, "error": text[-3000:]})
        self.save()
        print(f"[gpu_bench] {what}: {text[-500:]}", flush=True)

    def save(self) -> None:
        self.data["elapsed_s"] = round(time.monotonic() - T0, 2)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, default=str)
        os.replace(tmp, self.path)


def environment() -> dict:
    import torch

    env = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.cuda.is_available(),
           "cpus": os.cpu_count()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, gpu_mem_gib=round(p.total_memory / 2 ** 30, 1), cuda_version=torch.version.cuda)
    try:
        import ray

        env["ray"] = ray.__version__
    except ImportError:
        env["ray"] = None
    return env


def over_budget(args, fraction: float = 1.0) -> bool:
    """True once the step has spent ``fraction`` of its ``--budget``."""
    return args.budget is not None and time.monotonic() - T0 > fraction * args.budget


# ------------------------------------------------------------------------------------------------ GPU sampling
class GpuSampler:
    """GPU utilisation and each process's GPU memory, sampled every ``interval`` s in a thread (NVML through
    pynvml, else ``nvidia-smi``); :meth:`window` summarises the samples between two times. Without a GPU (the dry
    run) it samples nothing and says so."""

    def __init__(self, interval: float = 0.25):
        self.interval = interval
        self.samples: list[tuple[float, float, dict]] = []  # (time, util %, {pid: MiB})
        self.how = None
        self._stop = threading.Event()
        self._nvml = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
            self.how = "nvml"
        except Exception:  # noqa: BLE001 - no NVML: nvidia-smi, or nothing
            if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0:
                self.how = "nvidia-smi"
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        if self.how:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _read(self) -> tuple[float, dict]:
        if self.how == "nvml":
            nv, h = self._nvml
            util = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
            procs = {int(p.pid): (p.usedGpuMemory or 0) / 2 ** 20 for p in nv.nvmlDeviceGetComputeRunningProcesses(h)}
            return util, procs
        q = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=5).stdout.split()
        a = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=5).stdout.strip().splitlines()
        procs = {}
        for line in a:
            pid, mem = (x.strip() for x in line.split(","))
            procs[int(pid)] = float(mem)
        return float(q[0]) if q else float("nan"), procs

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                util, procs = self._read()
                self.samples.append((time.monotonic(), util, procs))
            except Exception:  # noqa: BLE001 - a failed read is a missing sample
                pass
            self._stop.wait(self.interval)

    def window(self, t_from: float | None, t_to: float | None) -> dict:
        if not self.how:
            return {"sampled": False, "why": "no GPU (dry run)"}
        rows = [s for s in self.samples if (t_from is None or s[0] >= t_from) and (t_to is None or s[0] <= t_to)]
        if not rows:
            return {"sampled": True, "samples": 0}
        utils = [u for _, u, _ in rows]
        me = os.getpid()  # this process (its CUDA context, a plain loop's leftovers) is reported apart
        peak: dict[int, float] = {}
        for _, _, procs in rows:
            for pid, mb in procs.items():
                peak[pid] = max(peak.get(pid, 0.0), mb)
        total = [sum(mb for pid, mb in p.items() if pid != me) for _, _, p in rows]
        others = {pid: mb for pid, mb in peak.items() if pid != me}
        return {"sampled": True, "how": self.how, "samples": len(rows), "util_mean_pct": round(statistics.mean(utils), 1),
                "util_max_pct": max(utils), "mem_total_peak_mib": round(max(total), 1), "processes": len(others),
                "per_process_peak_mib": sorted((round(v, 1) for v in others.values()), reverse=True),
                "this_process_peak_mib": round(peak[me], 1) if me in peak else None}


# ------------------------------------------------------------------------------------------------ runs
def start_ray(sz: Sizes) -> None:
    """One local Ray for the step's runs (fedray's runs join it). Dry run: 8 logical CPUs and 1 fake GPU, so the
    fractional-GPU workers schedule as on the GPU machine; there, Ray counts the real GPU and CPUs."""
    from fedray.core.ray_env import ensure_ray

    if sz.dry:
        ensure_ray(1 << 30, address="local", num_cpus=8, num_gpus=1, log_to_driver=False, configure_logging=False)
    else:
        ensure_ray(4 << 30, address="local", log_to_driver=False, configure_logging=False)


def fedray_run(cfg: dict, sampler: GpuSampler | None = None, resume: str | None = None, after_round=None) -> dict:
    """Run ``cfg`` (or resume a run directory) and summarise it: steady-state updates/s over rounds 2..R (round 1
    holds the cold start: CUDA kernels, the workers' first touches), round 1, the GPU window of rounds 2..R.
    ``after_round(n)`` is called after the n-th round (1, 2, ...) ends."""
    from fedray.config import from_dict
    from fedray.driver.runner import run_experiment

    marks: list[float] = []

    def on_round(_report) -> bool:
        marks.append(time.monotonic())
        if after_round is not None:
            after_round(len(marks))
        return False

    t0 = time.monotonic()
    if resume is not None:
        res = run_experiment(resume=resume, progress=False, log=lambda *a: None, on_round=on_round)
    else:
        res = run_experiment(from_dict(cfg), progress=False, log=lambda *a: None, on_round=on_round, overwrite=True)
    rows = res.rounds
    secs = [float(r["wall_seconds"]) - float(r["seconds"].get("eval", 0.0)) for r in rows]
    clients = [int(r.get("num_clients", 0)) for r in rows]
    steady = list(zip(secs[1:], clients[1:])) or list(zip(secs, clients))
    out = {"weights_hash": res.weights_hash, "rounds": len(rows), "round_s": [round(s, 4) for s in secs],
           "round1_s": round(secs[0], 4) if secs else None,
           "updates_per_s": round(sum(c for _, c in steady) / max(sum(s for s, _ in steady), 1e-9), 3),
           "startup_s": None if res.startup_seconds is None else round(res.startup_seconds, 2),
           "total_s": round(time.monotonic() - t0, 2), "run_dir": str(res.run_dir),
           "workers": rows[-1].get("workers") if rows else None}
    if rows and "split" in rows[-1]:
        per_iter, cl, sv = [], [], []
        parts: dict[str, list[float]] = defaultdict(list)  # every timed part of a round, per local iteration
        for r in rows[1:] or rows:
            iters = int(r["split"]["iterations"])
            wall = float(r["wall_seconds"]) - float(r["seconds"].get("eval", 0.0))
            per_iter.append(wall / iters)
            cl.append(float(r["seconds"]["clients"]) / iters)
            sv.append(float(r["seconds"]["server"]) / iters)
            timed = {k: float(v) for k, v in r["seconds"].items() if k != "eval"}
            for k, v in timed.items():
                parts[k].append(v / iters)
            parts["untimed"].append((wall - sum(timed.values())) / iters)
        out.update(ms_per_iter=round(1000 * statistics.mean(per_iter), 2),
                   ms_clients_per_iter=round(1000 * statistics.mean(cl), 2),
                   ms_server_per_iter=round(1000 * statistics.mean(sv), 2),
                   ms_parts_per_iter={k: round(1000 * statistics.mean(v), 2) for k, v in sorted(parts.items())})
    if sampler is not None:
        out["gpu"] = sampler.window(marks[0] if len(marks) > 1 else None, marks[-1] if marks else None)
    return out


def attempt(rec: Record, what: str, fn, **labels):
    """``fn()`` recorded under ``labels``; an exception is recorded and the step goes on."""
    print(f"[gpu_bench] {rec.data['step']}: {what} ...", flush=True)
    t = time.monotonic()
    try:
        res = fn()
    except BaseException as e:  # noqa: BLE001 - recorded; KeyboardInterrupt/SystemExit re-raised below
        rec.error(what, e)
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return None
    entry = rec.add({"what": what, **labels, **res, "seconds": round(time.monotonic() - t, 2)})
    print(f"[gpu_bench]   {json.dumps({k: v for k, v in entry.items() if k not in ('gpu', 'round_s', 'run_dir')})}",
          flush=True)
    return entry


def cuda_device(sz: Sizes):
    import torch

    return torch.device("cuda" if not sz.dry and torch.cuda.is_available() else "cpu")


def release_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------ plain loop
def plain_loop(cfg_dict: dict, device, sampler: GpuSampler | None = None) -> dict:
    """The workload of ``cfg_dict`` as a plain-PyTorch FedAvg loop in this process on ``device``: the same data,
    clients (fedray's partition), sampled clients, model, local epochs and batch size; each client's data moved
    to the device once, batches indexed there; the weighted average folded on the device in sampled order."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from fedray.config import from_dict
    from fedray.driver.setup import prepare_data
    from fedray.models import model_for_meta
    from fedray.plugins import load_plugins

    torch.set_num_threads(1)  # as fedray's workers (engine.torch_threads: 1); the GPU does the arithmetic
    cfg = from_dict({**cfg_dict, "engine": {**cfg_dict["engine"], "backend": "local"}})
    load_plugins(cfg)
    _, store = prepare_data(cfg, log=lambda *a: None)
    meta, sizes = store.meta, np.asarray(store.sizes, np.int64)
    t = cfg.train
    torch.manual_seed(int(cfg.seed))
    model = model_for_meta(cfg.model.name, meta, **cfg.model.params).to(device)
    params = list(model.parameters())
    glob = [p.detach().clone() for p in params]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    secs, marks = [], []
    for rnd in range(1, int(t.rounds) + 1):
        sync()
        t0 = time.perf_counter()
        sampled = np.random.default_rng([int(cfg.seed), rnd]).choice(len(sizes), size=int(t.clients_per_round),
                                                                       replace=False)
        sampled = [int(c) for c in sampled if sizes[c] > 0]
        total = float(sum(int(sizes[c]) for c in sampled))
        acc = [torch.zeros_like(g) for g in glob]
        for cid in sampled:
            images, labels = store.client_arrays(cid)
            x = torch.from_numpy(np.array(images)).to(device).float().div_(255.0)
            y = torch.from_numpy(np.array(labels, dtype=np.int64)).to(device)
            with torch.no_grad():
                for p, g in zip(params, glob):
                    p.copy_(g)
            opt = torch.optim.SGD(params, lr=float(t.lr))
            model.train()
            n = len(y)
            for ep in range(int(t.local_epochs)):
                perm = torch.from_numpy(np.random.default_rng([int(cfg.seed), rnd, cid, ep]).permutation(n)).to(device)
                for i in range(0, n, int(t.batch_size)):
                    idx = perm[i:i + int(t.batch_size)]
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(model(x[idx]), y[idx]).backward()
                    opt.step()
            with torch.no_grad():
                for a, p in zip(acc, params):
                    a.add_(p, alpha=float(sizes[cid]) / total)
        glob = acc
        sync()
        secs.append(time.perf_counter() - t0)
        marks.append(time.monotonic())
    k = int(t.clients_per_round)
    steady = secs[1:] or secs
    out = {"round_s": [round(s, 4) for s in secs], "round1_s": round(secs[0], 4),
           "updates_per_s": round(k * len(steady) / sum(steady), 3)}
    if device.type == "cuda":
        out["torch_max_allocated_mib"] = round(torch.cuda.max_memory_allocated(device) / 2 ** 20, 1)
    if sampler is not None:
        out["gpu"] = sampler.window(marks[0] if len(marks) > 1 else None, marks[-1])
    del model, params, glob, acc
    release_cuda()
    return out


# ------------------------------------------------------------------------------------------------ steps
def step_packing(args, sz: Sizes, rec: Record, work: Path) -> None:
    start_ray(sz)
    dev = cuda_device(sz)
    with GpuSampler() as sampler:
        # the FedRCL shape may start runs until 70 % of the budget, so that the W1 CNN keeps its share of the step
        for wl, fraction in (("fedrcl", 0.7), ("w1", 1.0)):
            for share in sz.shares:
                if over_budget(args, fraction):
                    rec.error(f"{wl} share {share}", TimeoutError("step budget spent: not started"))
                    continue
                n = int(round(1 / share))
                cfg = base_config(sz, wl, work / f"pack-{wl}-{n}", num_workers=n, worker_num_gpus=share)
                attempt(rec, f"fedray {wl}: {n} workers x {share:g} GPU", lambda c=cfg: fedray_run(c, sampler),
                        impl="fedray", workload=wl, workers=n, worker_num_gpus=share)
            if not over_budget(args, fraction + 0.1):  # the baseline, a little past the workload's share
                cfg = base_config(sz, wl, work / f"plain-{wl}")
                attempt(rec, f"plain PyTorch loop {wl} on {dev}", lambda c=cfg: plain_loop(c, dev, sampler),
                        impl="plain", workload=wl, device=str(dev))


def step_multiclient(args, sz: Sizes, rec: Record, work: Path) -> None:
    start_ray(sz)
    plans = [("fedrcl", [1, 5]), ("w1", [1, 10, 5])]  # the large model first: the figure a GPU changes most
    with GpuSampler() as sampler:
        for wl, ms in plans:
            for m in ms:
                if over_budget(args):
                    rec.error(f"{wl} multi_client {m}", TimeoutError("step budget spent: not started"))
                    continue
                cfg = base_config(sz, wl, work / f"mc-{wl}-{m}", num_workers=1, worker_num_gpus=1.0, multi_client=m)
                if wl == "fedrcl":
                    cfg["train"].update(local_epochs=1, rounds=sz.mc_rounds)
                else:
                    cfg["train"]["rounds"] = sz.mc_rounds
                attempt(rec, f"{wl}: multi_client {m}, 1 worker x 1 GPU", lambda c=cfg: fedray_run(c, sampler),
                        workload=wl, multi_client=m)
    for wl, _ in plans:  # the default the figures suggest: the fastest m per model
        runs = [r for r in rec.data["runs"] if r["workload"] == wl]
        if runs:
            best = max(runs, key=lambda r: r["updates_per_s"])
            base = next((r for r in runs if r["multi_client"] == 1), None)
            rec.data.setdefault("fastest", {})[wl] = {
                "multi_client": best["multi_client"], "updates_per_s": best["updates_per_s"],
                "speedup_vs_1": None if not base else round(best["updates_per_s"] / base["updates_per_s"], 3)}
    rec.save()


def step_determinism(args, sz: Sizes, rec: Record, work: Path) -> None:
    import numpy as np

    start_ray(sz)
    det = {"deterministic": True}
    share = 0.25

    def cfg_for(tag: str, **engine) -> dict:
        c = base_config(sz, "w1", work / f"det-{tag}", **{"worker_num_gpus": share, **engine})
        c["train"]["rounds"] = sz.det_rounds
        return c

    def fedray_of(tag: str, eng: dict):
        return lambda c=cfg_for(tag, **eng): fedray_run(c)

    # a driver crash after round 2's checkpoint (fault injection: exit 17), then --resume in this process
    def crash_and_resume() -> dict:
        crash = cfg_for("resume", backend="local", num_workers=1, fault_injection={"kind": "driver_exit", "round": 2},
                        **det)
        crash["output"]["checkpoint_every"] = 1
        path = work / "det-resume.json"
        path.write_text(json.dumps(crash))
        code = ("import json, sys; sys.path.insert(0, %r); from fedray.config import from_dict; "
                "from fedray.driver.runner import run_experiment; "
                "run_experiment(from_dict(json.load(open(%r))), progress=False, log=lambda *a: None)"
                % (str(ROOT), str(path)))
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        if proc.returncode != 17:
            raise RuntimeError(f"the crashing run exited {proc.returncode}, not 17: {proc.stderr[-1500:]}")
        run_dir = next((work / "det-resume" / "runs").iterdir())
        return {"crash_exit": proc.returncode, **fedray_run({}, resume=str(run_dir))}

    # one round of resnet18_gn under the flag: does every op of the large model have a deterministic CUDA kernel?
    def resnet_round() -> dict:
        c = base_config(sz, "fedrcl", work / "det-resnet", num_workers=1, worker_num_gpus=1.0, **det)
        c["train"].update(rounds=1, local_epochs=1)
        return fedray_run(c)

    # in the order of what the step is for (the first GPU run, 2026-11-28, spent its budget before the resume):
    # the bits with any number of workers and after a resume, every op of the large model, then the costs
    plan = [(f"ray-{n}w", fedray_of(f"ray-{n}w", dict(num_workers=n, **det))) for n in (1, 2, 4)]
    plan += [("local-1w", fedray_of("local-1w", dict(backend="local", num_workers=1, **det))),
             ("local-1w-resumed", crash_and_resume),
             ("resnet18_gn-deterministic", resnet_round),
             ("ray-2w-nondeterministic", fedray_of("ray-2w-nondeterministic", dict(num_workers=2, deterministic=False))),
             ("cpu-ray-2w", fedray_of("cpu-ray-2w", dict(num_workers=2, device="cpu", worker_num_gpus=0, **det)))]
    for tag, fn in plan:
        if over_budget(args):
            rec.error(tag, TimeoutError("step budget spent: not started"))
            continue
        attempt(rec, tag, fn, tag=tag)

    runs = {r["tag"]: r for r in rec.data["runs"]}
    gpu_tags = [t for t in ("ray-1w", "ray-2w", "ray-4w", "local-1w", "local-1w-resumed") if t in runs]
    summary: dict = {"deterministic_hashes": {t: runs[t]["weights_hash"] for t in gpu_tags}}
    summary["identical"] = len({runs[t]["weights_hash"] for t in gpu_tags}) == 1 if gpu_tags else None
    if "ray-2w" in runs and "ray-2w-nondeterministic" in runs:
        a, b = runs["ray-2w"], runs["ray-2w-nondeterministic"]
        summary["cost"] = {"updates_per_s_deterministic": a["updates_per_s"],
                           "updates_per_s_default": b["updates_per_s"],
                           "slowdown": round(b["updates_per_s"] / max(a["updates_per_s"], 1e-9), 3),
                           "same_bits_without_flag": a["weights_hash"] == b["weights_hash"]}
    if "ray-2w" in runs and "cpu-ray-2w" in runs:
        wa = np.load(Path(runs["ray-2w"]["run_dir"]) / "final_weights.npy")
        wb = np.load(Path(runs["cpu-ray-2w"]["run_dir"]) / "final_weights.npy")
        diff = np.abs(wa.astype(np.float64) - wb.astype(np.float64))
        summary["gpu_vs_cpu"] = {"same_bits": runs["ray-2w"]["weights_hash"] == runs["cpu-ray-2w"]["weights_hash"],
                                 "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
                                 "differing_fraction": float((wa != wb).mean()),
                                 "max_abs_weight": float(np.abs(wb).max())}
    rec.data["summary"] = summary
    rec.save()


def step_oom(args, sz: Sizes, rec: Record, work: Path) -> None:
    """Workers with too small a GPU share. On the GPU: resnet18_gn at batch 50 in 0.2 % of the GPU's memory (each
    worker's torch.cuda.set_per_process_memory_fraction); in the dry run the probe model raises the same error."""
    start_ray(sz)
    if sz.dry:
        cfg = base_config(sz, "w1", work / "oom", num_workers=2, worker_num_gpus=0.5)
        cfg["model"] = {"name": "gpu_oom_probe", "params": {}}
    else:
        cfg = base_config(sz, "fedrcl", work / "oom", num_workers=2, worker_num_gpus=0.002)
        cfg["train"].update(rounds=1, local_epochs=1)
    cfg["engine"]["heartbeat_s"] = 60

    def run() -> dict:
        t = time.monotonic()
        try:
            res = fedray_run(cfg)
        except Exception as e:  # noqa: BLE001 - the outcome under test
            msg = str(e)
            named = [line.strip() for line in msg.splitlines() if "engine.worker_num_gpus" in line]
            return {"outcome": "failed", "names_worker_num_gpus": bool(named), "error_type": type(e).__name__,
                    "error_line": named[0][:1500] if named else None, "error_tail": msg[-2000:],
                    "seconds_to_outcome": round(time.monotonic() - t, 2)}
        return {"outcome": "finished", "seconds_to_outcome": round(time.monotonic() - t, 2), **res}

    attempt(rec, "workers out of GPU memory", run, worker_num_gpus=cfg["engine"]["worker_num_gpus"],
            num_workers=cfg["engine"]["num_workers"], model=cfg["model"]["name"])


def step_split(args, sz: Sizes, rec: Record, work: Path) -> None:
    start_ray(sz)
    dev = cuda_device(sz)
    from bench_split import run_loop
    from fedray.config import from_dict
    from fedray.plugins import load_plugins

    # the baseline first (a few seconds): the first GPU run, 2026-11-28, spent the step's budget before it
    cfg = from_dict(base_config(sz, "scala", work / "split-loop", backend="local", num_workers=1))
    load_plugins(cfg)

    def loop() -> dict:
        r = run_loop(int(cfg.train.rounds), work / "split-loop", cfg=cfg, device=str(dev))
        release_cuda()
        return {"ms_per_iter": round(1000 * r["s_per_iter"], 2),
                "ms_clients_per_iter": round(1000 * r["breakdown"]["clients"], 2),
                "ms_server_per_iter": round(1000 * r["breakdown"]["server"], 2), "mb_per_iter": r["mb_per_iter"]}

    attempt(rec, f"one-process SCALA loop on {dev}", loop, impl="plain", tag="loop", device=str(dev))
    with GpuSampler() as sampler:
        for tag, eng in (("ray-1w", dict(num_workers=1, worker_num_gpus=1.0)),
                         ("ray-2w", dict(num_workers=2, worker_num_gpus=0.5)),
                         ("local-1w", dict(backend="local", num_workers=1))):
            if over_budget(args):
                rec.error(tag, TimeoutError("step budget spent: not started"))
                continue
            attempt(rec, f"fedray SCALA {tag}", lambda c=base_config(sz, "scala", work / f"split-{tag}", **eng):
                    fedray_run(c, sampler), impl="fedray", tag=tag)
    # where the in-process program's time goes against the loop (the first GPU run: 1.75x the loop, level on the
    # CPU): one in-process run under torch.profiler, the host-device copies and synchronisations per iteration
    if over_budget(args):
        rec.error("profile of the in-process SCALA", TimeoutError("step budget spent: not started"))
    else:
        c = base_config(sz, "scala", work / "split-profile", backend="local", num_workers=1)
        c["train"]["rounds"] = 4
        c["eval"]["every"] = 10 ** 6  # rounds 2 and 3, profiled, evaluate nothing
        try:
            rec.data["profile"] = run_profile(c, dev, per="local iteration")
            rec.save()
            print(f"[gpu_bench]   profile: {json.dumps(rec.data['profile']['per_unit'])}", flush=True)
        except Exception as e:  # noqa: BLE001 - recorded, the step goes on
            rec.error("profile of the in-process SCALA", e)


def run_profile(cfg: dict, dev, per: str, rounds: int = 2) -> dict:
    """An in-process run with ``rounds`` rounds from round 2 on under ``torch.profiler`` (round 1's cold start and
    the last round's evaluation left out: the config needs ``rounds + 2`` rounds): per unit of work (``per``: a
    split program's "local iteration" or a "client update"), the count of the calls that copy between host and
    device or wait for the device, and the ops that take the most host and device time."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    prof = profile(activities=acts)

    def window(n: int) -> None:
        if n == 1:
            prof.start()
        elif n == 1 + rounds:
            prof.stop()

    res = fedray_run(cfg, after_round=window)
    rows = [json.loads(line) for line in open(Path(res["run_dir"]) / "metrics.jsonl")]
    if per == "local iteration":
        units = sum(int(r["split"]["iterations"]) for r in rows[1:1 + rounds] if "split" in r)
    else:
        units = sum(int(r.get("num_clients", 0)) for r in rows[1:1 + rounds])
    events = prof.key_averages()
    watch = ("aten::to", "aten::_to_copy", "aten::copy_", "aten::item", "aten::_local_scalar_dense",
             "cudaMemcpyAsync", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaLaunchKernel")
    counts = {e.key: e.count for e in events if e.key in watch}

    def self_ms(e, kind: str) -> float:
        v = getattr(e, f"self_{kind}_time_total", None)
        if v is None and kind == "device":
            v = getattr(e, "self_cuda_time_total", 0.0)
        return float(v or 0.0) / 1000.0

    def top(kind: str) -> list[dict]:
        ranked = sorted(events, key=lambda e: self_ms(e, kind), reverse=True)[:12]
        return [{"op": e.key, "calls": e.count, "self_ms": round(self_ms(e, kind), 2)} for e in ranked
                if self_ms(e, kind) > 0]

    secs = [float(r["wall_seconds"]) - float(r["seconds"].get("eval", 0.0)) for r in rows[1:1 + rounds]]
    return {"per": per, "units": units, "ms_per_unit_profiled": round(1000 * sum(secs) / max(units, 1), 2),
            "per_unit": {k: round(v / max(units, 1), 1) for k, v in sorted(counts.items())},
            "top_host": top("cpu"), "top_device": top("device") if dev.type == "cuda" else []}


def step_profile(args, sz: Sizes, rec: Record, work: Path) -> None:
    """In-process runs under ``torch.profiler``, no Ray (so it runs beside bench/gpu/fidelity.py, whose data leaves
    no room for the carried Ray): the FedRCL shape (round 2 of 3, 1 local epoch; run 3 had one fedray worker at
    0.85x the plain loop) per client update, then SCALA (rounds 2 and 3 of 4) per local iteration."""
    dev = cuda_device(sz)
    c = base_config(sz, "fedrcl", work / "profile-fedrcl", backend="local", num_workers=1)
    c["train"].update(local_epochs=1, rounds=3)
    import copy

    from fedray.data import loader

    resident = loader.RESIDENT_BYTES
    c1 = copy.deepcopy(c)
    c1["output"]["root"] = str(work / "profile-fedrcl-per-batch")
    # fedray as it is (a client's rows on the GPU once, batches gathered there), then each batch copied from the
    # host as before (loader.RESIDENT_BYTES = 0): the two side by side
    jobs = [("fedrcl", c, "client update", 1, resident), ("fedrcl-per-batch", c1, "client update", 1, 0)]
    c2 = base_config(sz, "scala", work / "profile-scala", backend="local", num_workers=1)
    c2["train"]["rounds"] = 4
    c2["eval"]["every"] = 10 ** 6
    jobs.append(("scala", c2, "local iteration", 2, resident))
    for key, cfg, per, rounds, nbytes in jobs:
        if over_budget(args):
            rec.error(f"profile of the in-process {key}", TimeoutError("step budget spent: not started"))
            continue
        loader.RESIDENT_BYTES = nbytes
        try:
            rec.data.setdefault("profiles", {})[key] = run_profile(cfg, dev, per=per, rounds=rounds)
            rec.save()
            print(f"[gpu_bench]   profile {key}: {json.dumps(rec.data['profiles'][key]['per_unit'])}", flush=True)
        except Exception as e:  # noqa: BLE001 - recorded, the step goes on
            rec.error(f"profile of the in-process {key}", e)
        finally:
            loader.RESIDENT_BYTES = resident
        release_cuda()


STEPS = {"packing": step_packing, "multiclient": step_multiclient, "determinism": step_determinism,
         "oom": step_oom, "split": step_split, "profile": step_profile}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step", choices=sorted(STEPS))
    ap.add_argument("--json", required=True, help="where the step's figures go")
    ap.add_argument("--dry", action="store_true", help="engine.device: cpu, tiny sizes, a fake GPU (CPU dry run)")
    ap.add_argument("--budget", type=float, default=None, help="start no run after this many seconds")
    ap.add_argument("--work", default=None, help="run directories (default: a temporary directory)")
    args = ap.parse_args(argv)
    sz = Sizes(args.dry)
    work = Path(args.work or tempfile.mkdtemp(prefix=f"fedray-gpu-{args.step}-"))
    work.mkdir(parents=True, exist_ok=True)
    rec = Record(args.json, args.step, sz)
    try:
        STEPS[args.step](args, sz, rec, work)
    except BaseException as e:  # noqa: BLE001 - the step's own failure is a figure too
        rec.error(f"step {args.step}", e)
        rec.data["status"] = "failed"
        rec.save()
        return 1
    rec.data["status"] = "done" if not rec.data["errors"] else "done with errors"
    rec.save()
    print(f"[gpu_bench] {args.step}: {rec.data['status']} in {rec.data['elapsed_s']} s", flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    from fedray.core.process_exit import leave

    leave(code)  # no interpreter teardown (Ray's atexit hooks with live actors), as `fedray run` ends
