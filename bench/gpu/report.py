"""The figures of bench/gpu/run_all.sh as text: the pytest step's JUnit XML as JSON, and every step's JSON as
Markdown tables (printed at the end of run_all.sh's log; docs/gpu.md is written from them).

    python bench/gpu/report.py junit RESULTS.xml OUT.json     # the GPU-relevant tests' outcomes
    python bench/gpu/report.py summary OUTDIR                 # the tables of OUTDIR/*.json
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def junit(xml_path: str, out_path: str, extra: dict | None = None) -> dict:
    """``{passed, failed, errors, skipped, tests: [{name, outcome, seconds, message}]}`` of a JUnit XML file."""
    tests = []
    if Path(xml_path).is_file():
        for case in ET.parse(xml_path).getroot().iter("testcase"):
            outcome, message = "passed", ""
            for tag in ("failure", "error", "skipped"):
                node = case.find(tag)
                if node is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                    message = ((node.get("message") or "") + "\n" + (node.text or "")).strip()[-3000:]
                    break
            tests.append({"name": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                          "seconds": round(float(case.get("time") or 0.0), 2), "message": message})
    counts = {k: sum(t["outcome"] == k for t in tests) for k in ("passed", "failed", "error", "skipped")}
    res = {"step": "tests", **counts, "collected": len(tests), "tests": tests, **(extra or {})}
    res["status"] = "done" if res.get("exit_code", 0) == 0 and tests else "failed"
    res.setdefault("elapsed_s", res.get("seconds"))
    Path(out_path).write_text(json.dumps(res, indent=1))
    return res


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def _table(rows: list[dict], cols: list[tuple[str, str]]) -> list[str]:
    out = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for _, key in cols:
            v = r
            for part in key.split("."):
                v = v.get(part) if isinstance(v, dict) else None
            cells.append(_fmt(v))
        out.append("| " + " | ".join(cells) + " |")
    return out


def _profile(pr: dict | None) -> list[str]:
    """The lines of a step's in-process profile (runs 1-3 wrote ``iterations``/``per_iteration``, later runs
    ``units``/``per_unit`` with what a unit is)."""
    if not pr:
        return []
    per = pr.get("per", "local iteration")
    units = pr.get("units", pr.get("iterations"))
    ms = pr.get("ms_per_unit_profiled", pr.get("ms_per_iter_profiled"))
    lines = [f"profile of the in-process run ({units} x {per}, {ms} ms each under the profiler), calls per {per}: "
             f"{json.dumps(pr.get('per_unit', pr.get('per_iteration')))}"]
    for kind in ("top_host", "top_device"):
        if pr.get(kind):
            lines.append(f"{kind}: " + ", ".join(f"{t['op']} {t['self_ms']} ms ({t['calls']})" for t in pr[kind]))
    return lines


def summary(outdir: str) -> str:
    d = Path(outdir)
    lines: list[str] = []

    def load(name: str) -> dict | None:
        p = d / f"{name}.json"
        if not p.is_file():
            lines.append(f"\n## {name}: no figures ({p.name} missing: the step did not start or was killed early)")
            return None
        data = json.loads(p.read_text())
        lines.append(f"\n## {name}: {data.get('status', '?')}, {data.get('elapsed_s', '?')} s"
                     + (" (CPU dry run)" if data.get("dry_run") else ""))
        for e in data.get("errors", []):
            lines.append(f"- error in {e['what']}: {e['error'].splitlines()[-1][:300] if e['error'] else ''}")
        return data

    env = load("env")
    if env:
        lines.append("```\n" + json.dumps({k: v for k, v in env.items() if k != "errors"}, indent=1) + "\n```")
    t = load("tests")
    if t:
        lines.append(f"{t['passed']} passed, {t['failed']} failed, {t['error']} errors, {t['skipped']} skipped")
        lines += [f"- {x['outcome']}: {x['name']}: {x['message'].splitlines()[0][:300] if x['message'] else ''}"
                  for x in t["tests"] if x["outcome"] != "passed"]
    p = load("packing")
    if p:
        lines += _table(p["runs"], [("workload", "workload"), ("impl", "impl"), ("workers", "workers"),
                                    ("GPU/worker", "worker_num_gpus"), ("updates/s (rounds 2..R)", "updates_per_s"),
                                    ("round 1 s", "round1_s"), ("GPU util %", "gpu.util_mean_pct"),
                                    ("GPU MiB peak, all", "gpu.mem_total_peak_mib"),
                                    ("per process MiB", "gpu.per_process_peak_mib")])
    m = load("multiclient")
    if m:
        lines += _table(m["runs"], [("workload", "workload"), ("multi_client", "multi_client"),
                                    ("updates/s", "updates_per_s"), ("round 1 s", "round1_s"),
                                    ("GPU util %", "gpu.util_mean_pct")])
        if m.get("fastest"):
            lines.append(f"fastest: {json.dumps(m['fastest'])}")
        lines += _profile(m.get("profile"))
    dt = load("determinism")
    if dt:
        lines += _table(dt["runs"], [("run", "tag"), ("weights hash", "weights_hash"), ("updates/s", "updates_per_s"),
                                     ("total s", "total_s")])
        if dt.get("summary"):
            lines.append("```\n" + json.dumps(dt["summary"], indent=1) + "\n```")
    o = load("oom")
    if o:
        lines += _table(o["runs"], [("model", "model"), ("workers", "num_workers"), ("GPU/worker", "worker_num_gpus"),
                                    ("outcome", "outcome"), ("names worker_num_gpus", "names_worker_num_gpus"),
                                    ("s to outcome", "seconds_to_outcome")])
        for r in o["runs"]:
            if r.get("error_line") or r.get("error_tail"):
                lines.append(f"error: {(r.get('error_line') or r['error_tail'][-600:])[:600]}")
    pf = load("profile") if (d / "profile.json").is_file() else None  # a step of its own, not run_all's
    if pf:
        for key, pr in (pf.get("profiles") or {}).items():
            lines += [f"{key}:"] + _profile(pr)
    s = load("split")
    if s:
        lines += _table(s["runs"], [("run", "tag"), ("ms / local iteration", "ms_per_iter"),
                                    ("ms clients", "ms_clients_per_iter"), ("ms server", "ms_server_per_iter"),
                                    ("GPU util %", "gpu.util_mean_pct")])
        for r in s["runs"]:
            if r.get("ms_parts_per_iter"):
                lines.append(f"{r.get('tag')}: ms per local iteration by part of the round: "
                             f"{json.dumps(r['ms_parts_per_iter'])}")
        lines += _profile(s.get("profile"))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "junit" and len(argv) >= 3:
        extra = json.loads(argv[3]) if len(argv) > 3 else None
        res = junit(argv[1], argv[2], extra)
        print(f"tests: {res['passed']} passed, {res['failed']} failed, {res['error']} errors, {res['skipped']} skipped")
        return 0
    if argv and argv[0] == "summary" and len(argv) == 2:
        print(summary(argv[1]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
