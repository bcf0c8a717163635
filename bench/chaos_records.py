"""The chaos harness's results file and its figures (bench/chaos.py ``--results`` / ``--report``).

A results file is JSON Lines, append-only: one record per finished schedule, written whole in one ``write`` to a
file opened ``O_APPEND`` under an exclusive ``flock`` and then fsynced, so shards of one seed run in pieces (or side
by side) accumulate in one file and a killed harness leaves whole lines only. A schedule is named by its key (mode,
seed, index and the digest of what its plan was drawn from: variants, kinds, fault counts, carry-over): a key
already in the file is refused, before a shard starts and again under the lock when its record is appended, so no
schedule is counted twice. ``--report FILE...`` aggregates any number of files into the figures table of
docs/reliability.md (a line that is not a whole record is named and refused, never skipped in silence).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
from collections import Counter
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VERSION = 1


class DuplicateSchedule(RuntimeError):
    pass


def plan_digest(settings: dict) -> str:
    """What a schedule's plan was drawn from (the same seed and index under other settings is another schedule)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


def key(rec: dict) -> tuple:
    return rec["mode"], rec["seed"], rec["index"], rec["plan_digest"]


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "bench", "fedray", "tuning"], cwd=ROOT,
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() + ("+changes" if dirty else "")


def make_record(o: Any, *, mode: str, seed: int, settings: dict, commit: str) -> dict:
    """The record of finished schedule ``o`` (a bench.chaos.Outcome)."""
    return {
        "v": VERSION, "mode": mode, "seed": seed, "index": o.index, "plan_digest": plan_digest(settings),
        "settings": settings, "variant": o.variant, "commit": commit,
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "faults": [{k: v for k, v in asdict(f).items() if k != "due"} for f in o.faults],
        "drivers": [{"command": a.command, "rc": a.rc, "status": a.status, "reason": (a.reason or "")[:300],
                     "seconds": round(a.seconds, 1), "hung": a.hung} for a in o.attempts],
        "ending": o.ending, "problems": o.problems, "leaked": o.leaked, "started_over": o.started_over,
        "seconds": round(o.seconds, 1), "extra": getattr(o, "extra", {}) or {},
    }


def read(paths: list[Path]) -> list[dict]:
    """Every record of ``paths``, in order; a torn or foreign line is an error naming the file and the line."""
    out = []
    for path in paths:
        if not path.is_file():
            continue
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                key(rec)
            except (ValueError, KeyError, TypeError) as e:
                raise SystemExit(f"chaos: {path}:{n} is not a whole chaos record ({e}); refusing to count it") from e
            out.append(rec)
    return out


def duplicates(records: list[dict]) -> list[tuple]:
    seen: set[tuple] = set()
    dup = []
    for r in records:
        k = key(r)
        if k in seen:
            dup.append(k)
        seen.add(k)
    return dup


def append(path: Path, rec: dict) -> None:
    """Append ``rec`` as one line, refusing a schedule the file already holds (checked under the lock)."""
    line = (json.dumps(rec, sort_keys=True, default=str) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with open(path) as f:  # the lines appended by other shards so far
            held = {key(json.loads(x)) for x in f if x.strip()}
        if key(rec) in held:
            raise DuplicateSchedule(f"chaos: {path} already holds schedule {key(rec)}; not recorded twice")
        if os.write(fd, line) != len(line):
            raise OSError(f"chaos: a short append to {path}")
        os.fsync(fd)
    finally:
        os.close(fd)  # releases the lock


# ------------------------------------------------------------------------------------------- figures
def summarize(records: list[dict]) -> dict:
    faults = [f for r in records for f in r["faults"]]
    planned = Counter(f["kind"] for f in faults)
    injected = Counter(f["kind"] for f in faults if f["fired"])
    endings = Counter(r["ending"] for r in records)
    loud = [sum(1 for d in r["drivers"] if d["rc"] != 0) for r in records]
    drivers = [d for r in records for d in r["drivers"]]
    ended = Counter(_how(d) for d in drivers if d["rc"] != 0)
    return {
        "schedules": len(records), "variants": dict(sorted(Counter(r["variant"] for r in records).items())),
        "faults_planned": sum(planned.values()), "faults_injected": sum(injected.values()),
        "by_kind": {k: [injected.get(k, 0), planned[k]] for k in sorted(planned)},
        "carried": sum(1 for f in faults if f.get("carried")),
        "drivers": len(drivers), "drivers_failed": sum(ended.values()), "drivers_failed_by": dict(ended),
        "identical": endings.get("identical", 0),
        "identical_after_loud_failures": sum(1 for r, n in zip(records, loud) if r["ending"] == "identical" and n),
        "loud_failures_resumed": sum(n for r, n in zip(records, loud) if r["ending"] == "identical"),
        "started_over": sum(r["started_over"] for r in records),
        "other_bits": endings.get("other bits", 0), "refused": endings.get("refused", 0),
        "unfinished": endings.get("unfinished", 0),
        "hung_drivers": sum(1 for d in drivers if d["hung"]),
        "leaked_processes": sum(len(r["leaked"]) for r in records),
        "violations": sum(1 for r in records if r["problems"]),
        "problem_kinds": dict(Counter(p.split(":")[0] for r in records for p in r["problems"])),
        "seeds": sorted({(r["mode"], r["seed"]) for r in records}),
        "commits": sorted({r["commit"] for r in records}),
        "seconds": round(sum(r["seconds"] for r in records), 1),
    }


def _how(d: dict) -> str:
    if d["status"] is None:
        return "before run.json"
    return "failed with a reason" if d["status"] == "failed" else str(d["status"])


def table(fig: dict) -> str:
    """The figures as the markdown table of docs/reliability.md."""
    kinds = ", ".join(f"{k} {i}/{p}" for k, (i, p) in fig["by_kind"].items())
    variants = ", ".join(f"`{k}` {v}" if k != "federated" else f"plain {v}" for k, v in fig["variants"].items())
    failed = ", ".join(f"{k} {v}" for k, v in sorted(fig["drivers_failed_by"].items(), key=lambda kv: -kv[1]))
    rows = [
        ("schedules", f"{fig['schedules']} ({variants})"),
        ("faults injected / planned", f"{fig['faults_injected']} / {fig['faults_planned']}: {kinds}"),
        ("driver processes", f"{fig['drivers']}: {fig['drivers_failed']} ended non-zero ({failed})"),
        ("bit-identical endings", f"{fig['identical']} of {fig['schedules']}; {fig['identical_after_loud_failures']}"
                                  f" of them after loud failures ({fig['loud_failures_resumed']} loud failures, each "
                                  f"resumed)"),
        ("resumes refused for want of a checkpoint, then `--overwrite`", str(fig["started_over"])),
        ("ended with other bits without failing", str(fig["other_bits"])),
        ("resume refused / never finished", f"{fig['refused']} / {fig['unfinished']}"),
        ("schedules with a violation (lost or repeated rounds, half-written files, failures without a reason, ...)",
         f"{fig['violations']}" + (f" {fig['problem_kinds']}" if fig["problem_kinds"] else "")),
        ("processes leaked", str(fig["leaked_processes"])),
        ("drivers still running at the harness's limit (killed as hung)", str(fig["hung_drivers"])),
        ("schedule time (sum)", f"{fig['seconds'] / 60:.0f} min"),
    ]
    return "| | |\n|---|---|\n" + "\n".join(f"| {a} | {b} |" for a, b in rows)


def report(paths: list[Path]) -> int:
    records = read(paths)
    dup = duplicates(records)
    if dup:
        raise SystemExit(f"chaos: the files hold {len(dup)} schedule(s) twice, e.g. {dup[:3]}; refusing to count")
    if not records:
        raise SystemExit(f"chaos: no record in {', '.join(map(str, paths))}")
    fig = summarize(records)
    print(f"chaos figures of {', '.join(map(str, paths))}: seeds {fig['seeds']}, harness commits {fig['commits']}\n")
    print(table(fig))
    bad = [r for r in records if r["problems"]]
    for r in bad:
        print(f"\nVIOLATION in {r['mode']} seed {r['seed']} schedule {r['index']}: {r['problems']}")
    return 1 if bad else 0
