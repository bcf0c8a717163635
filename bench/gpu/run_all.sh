#!/usr/bin/env bash
# Every measurement of issue 32 on the GPU machine, one command (docs/gpu.md):
#
#   bash bench/gpu/run_all.sh                 # on the GPU machine: $OUT gets the figures (JSON) and run_all.log
#   bash bench/gpu/run_all.sh --cpu           # CPU dry run here (also FEDRAY_GPU_DRYRUN=1): engine.device cpu, tiny
#                                             #   sizes, the venv's Python and Ray; figures in $OUT or bench/out/gpu
#
# On the GPU machine (Python 3.12 with CUDA PyTorch, no Ray, no network) it unpacks the Ray runtime that
# bench/gpu/prepare.sh built here (bench/gpu/.runtime/ray-cp312.tar.xz, carried with the call) into a site directory
# and puts it and the repository on PYTHONPATH. Then each step runs under its own time limit (`timeout`), writes its
# figures to $OUT/<step>.json as it goes and its output to $OUT/run_all.log; a step that fails or runs out of time is
# recorded and the next one starts. Steps and limits (seconds; about 9 minutes in all at most):
#   env 30 | tests 60 | packing 170 | multiclient 90 | determinism 120 | oom 30 | split 90 (590 s at most;
#   the first GPU run, 2026-11-28, took 371 s: Ray starts in 5-11 s a run there)
# FEDRAY_GPU_STEPS="env packing" runs only the steps named (a rerun of some with the minutes left);
# FEDRAY_GPU_RUNTIME=PATH another runtime tarball (prepare.sh's PYVER=3.11 one, to try the GPU path here).
# Eight files come back from $OUT (the device returns at most 8): env, tests, packing, multiclient, determinism, oom,
# split (.json) and run_all.log, whose end holds every table (bench/gpu/report.py summary).
set -uo pipefail

# the whole script is one function, read entirely before it runs: an edit of this file during a run changes nothing
main() {

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
DRY=0
[[ "${1:-}" == "--cpu" || "${FEDRAY_GPU_DRYRUN:-0}" == "1" ]] && DRY=1
OUT="${OUT:-$ROOT/bench/out/gpu}"
mkdir -p "$OUT"
LOG="$OUT/run_all.log"
: > "$LOG"
exec > >(tee -a "$LOG") 2>&1
T_START=$(date +%s)
say() { echo "[run_all $(( $(date +%s) - T_START ))s] $*"; }

export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 TQDM_DISABLE=1 FEDRAY_NO_WARM=1
WORK="${FEDRAY_GPU_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/fedray-gpu.XXXXXX")}"
SCALE=1
if (( DRY )); then
  PY="${PYTHON:-$ROOT/.venv/bin/python}"
  SCALE="${FEDRAY_GPU_TIME_SCALE:-5}"  # a shared 2-core machine: generous limits, the same steps
  DRYFLAG=(--dry)
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  say "CPU dry run: $PY, engine.device cpu, tiny sizes, time limits x$SCALE, work $WORK"
else
  PY="${PYTHON:-python3}"
  SCALE="${FEDRAY_GPU_TIME_SCALE:-1}"
  DRYFLAG=()
  TARBALL="${FEDRAY_GPU_RUNTIME:-$HERE/.runtime/ray-cp312.tar.xz}"
  SITE="$WORK/site"
  mkdir -p "$SITE"
  if [[ ! -f "$TARBALL" ]]; then
    say "no $TARBALL: run bench/gpu/prepare.sh where PyPI is reachable and carry bench/gpu/.runtime"
    exit 2
  fi
  say "unpacking $(basename "$TARBALL") into $SITE"
  # tar with xz when the image has xz; else Python's own lzma and tarfile
  tar -C "$SITE" -xJf "$TARBALL" 2>/dev/null \
    || "$PY" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$TARBALL" "$SITE" \
    || { say "unpacking failed"; exit 2; }
  export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
  say "unpacked: $(cat "$SITE/FEDRAY_RUNTIME.txt")"
fi
cd "$ROOT"
export OUT WORK PY DRY SITE="${SITE:-}"  # the steps that are functions run in `bash -c` under `timeout`

STATUS=()
step() {  # step NAME LIMIT_S COMMAND...: run under `timeout`, record how it ended
  local name="$1" limit=$(( $2 * SCALE )); shift 2
  if [[ -n "${FEDRAY_GPU_STEPS:-}" && " $FEDRAY_GPU_STEPS " != *" $name "* ]]; then
    say "step $name: skipped (FEDRAY_GPU_STEPS=$FEDRAY_GPU_STEPS)"
    return 0
  fi
  say "step $name: start (limit ${limit}s)"
  local t0=$(date +%s)
  timeout -k 10 "$limit" "$@"
  local rc=$?
  local how="ok"
  (( rc == 124 || rc == 137 )) && how="TIMED OUT after ${limit}s"
  (( rc != 0 && rc != 124 && rc != 137 )) && how="failed (exit $rc)"
  STATUS+=("$name: $how in $(( $(date +%s) - t0 ))s")
  say "step $name: $how"
  # `timeout` signals the step's whole process group, and fedray's local Ray dies with the process that started
  # it; on the GPU machine (a machine of its own) whatever Ray process a killed step still left is ended too, so
  # that it holds no GPU memory in the next step. Never in the dry run: this machine is shared.
  if (( rc == 124 || rc == 137 )) && (( ! DRY )); then
    "$PY" - <<'EOF' 2>/dev/null || true
import os, signal
import psutil
me = os.getpid()
for p in psutil.process_iter(["pid", "cmdline"]):
    cmd = " ".join(p.info["cmdline"] or [])
    if p.info["pid"] != me and ("ray::" in cmd or "/ray/core/src/ray/" in cmd or "ray/_private" in cmd
                                or "ray/dashboard" in cmd or "gpu_bench.py" in cmd):
        try:
            os.kill(p.info["pid"], signal.SIGKILL)
        except OSError:
            pass
EOF
  fi
}

# 0. the machine, torch's CUDA, Ray from the carried tree: ray.init and one actor
env_probe() {
  "$PY" - "$OUT/env.json" "${SITE:-}" <<'EOF'
import json, os, subprocess, sys, time
T0 = time.perf_counter()
out, site = sys.argv[1], sys.argv[2]
import torch
env = {"step": "env", "status": "running", "python": sys.version.split()[0], "torch": torch.__version__,
       "cuda_available": torch.cuda.is_available(), "cpus": os.cpu_count(), "errors": []}
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    env.update(gpu=p.name, gpu_mem_gib=round(p.total_memory / 2**30, 1), torch_cuda=torch.version.cuda,
               gpus=torch.cuda.device_count(), sms=p.multi_processor_count)
try:
    env["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                        "--format=csv,noheader"], capture_output=True, text=True, timeout=10).stdout.strip()
except Exception as e:
    env["nvidia_smi"] = f"unavailable: {e}"
try:
    import pynvml  # noqa: F401
    env["nvml"] = True
except ImportError:
    env["nvml"] = False
t = time.perf_counter()
if site:
    r = subprocess.run([sys.executable, "bench/gpu/check_runtime.py", site], capture_output=True, text=True, timeout=120)
    env["ray_check"] = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else None
    if r.returncode:
        env["errors"].append({"what": "ray check", "error": r.stderr[-2000:]})
else:
    import ray
    env["ray_check"] = f"dry run: the venv's ray {ray.__version__} at {ray.__file__}"
env["ray_check_s"] = round(time.perf_counter() - t, 2)
env["status"] = "done" if not env["errors"] else "done with errors"
env["elapsed_s"] = round(time.perf_counter() - T0, 2)
json.dump(env, open(out, "w"), indent=1)
print(json.dumps(env, indent=1))
EOF
}
export -f env_probe
step env 30 bash -c env_probe

# 1. the GPU-relevant tests (marker gpu: tests/gpu) and the unit tests of engine.deterministic / the errors' hints
run_tests() {
  local xml="$WORK/tests.xml" t0=$(date +%s)
  "$PY" -m pytest tests/gpu tests/engine/test_device_options.py -q -p no:cacheprovider -o addopts="" \
    --junitxml="$xml" --durations=8
  local rc=$?
  "$PY" bench/gpu/report.py junit "$xml" "$OUT/tests.json" \
    "{\"exit_code\": $rc, \"seconds\": $(( $(date +%s) - t0 )), \"dry_run\": $(( DRY ))}"
  return $rc
}
export -f run_tests
step tests 60 bash -c run_tests

# 2-6. the measurements (bench/gpu/gpu_bench.py); --budget: no new run starts past it, so a step ends on its own
step packing 170 "$PY" bench/gpu/gpu_bench.py packing --json "$OUT/packing.json" --budget $(( 140 * SCALE )) \
  --work "$WORK/packing" "${DRYFLAG[@]}"
step multiclient 90 "$PY" bench/gpu/gpu_bench.py multiclient --json "$OUT/multiclient.json" --budget $(( 60 * SCALE )) \
  --work "$WORK/multiclient" "${DRYFLAG[@]}"
step determinism 120 "$PY" bench/gpu/gpu_bench.py determinism --json "$OUT/determinism.json" \
  --budget $(( 100 * SCALE )) --work "$WORK/determinism" "${DRYFLAG[@]}"
step oom 30 "$PY" bench/gpu/gpu_bench.py oom --json "$OUT/oom.json" --work "$WORK/oom" "${DRYFLAG[@]}"
step split 90 "$PY" bench/gpu/gpu_bench.py split --json "$OUT/split.json" --budget $(( 70 * SCALE )) \
  --work "$WORK/split" "${DRYFLAG[@]}"

say "steps:"
for s in "${STATUS[@]}"; do echo "  $s"; done
say "figures:"
"$PY" bench/gpu/report.py summary "$OUT" || true
say "done in $(( $(date +%s) - T_START ))s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
[[ -n "${FEDRAY_GPU_WORK:-}" ]] || rm -rf "$WORK"
}

main "$@"; exit $?  # one line: bash has read the exit before main runs, whatever happens to the file meanwhile
