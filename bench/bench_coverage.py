"""Coverage of the validation intervals over every saved bench_validate run: how many measured
values fall inside their prediction interval, per profile, pooled over runs, and per run, shape
and measure, each with the runs and live rounds behind it (issue 37).

    python bench/bench_coverage.py                        # every run in bench/data/live-rounds/, ~30 s each
    python bench/bench_coverage.py --jobs 1               # one run at a time (default: a run per core)
    python bench/bench_coverage.py --keep /tmp/bv5 --label 2026-12-05c   # archive a run, then score all
    python bench/bench_coverage.py --no-speed-scale      # the profiles as they are
    python bench/bench_coverage.py --one-round           # also each live round on its own

A run is what ``python bench/bench_validate.py --out DIR`` saved: per shape its live rounds
(``live.pickle``) and speed probes (``probes.json``). ``--keep DIR`` copies them, compressed,
into ``bench/data/live-rounds/<label>/`` with a ``run.json`` (date, host, load), so runs made on
other days and machines add up. Each archived run is rescored by ``bench_validate.py --rescore``
with today's code and profiles (the live rounds are not re-run), and the coverage lines are
printed with the number of runs, figures and live rounds behind each. The target of issue 37: at
least 85 % of the measured values inside their 90 % interval over at least three runs on
different days or machines.

Archived runs are pickles of ``kvroute.calibrate.validation.validate.Validation``: a field added
later takes its default when read back (``bench_validate._saved_rounds``); a field renamed or
removed breaks the old runs, which then need a converter.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARCHIVE = HERE / "data" / "live-rounds"
SHAPES = ("long-chats", "short-replies", "open-loop")


def keep(run: Path, label: str, archive: Path = ARCHIVE) -> Path:
    """Copy a bench_validate run's live rounds (gzip) and probes into ``archive/label/``, with a
    ``run.json`` of where and when it was measured; returns the folder.

    Raises:
        SystemExit: no shape of ``run`` has saved live rounds, or ``archive/label`` exists.
    """
    dest = archive / label
    if dest.exists():
        sys.exit(f"error: {dest} exists: pick another --label")
    shapes = [s for s in SHAPES if (run / s / "live.pickle").exists()]
    if not shapes:
        sys.exit(f"error: {run}: no <shape>/live.pickle (is it a bench_validate --out folder?)")
    for shape in shapes:
        (dest / shape).mkdir(parents=True)
        (dest / shape / "live.pickle.gz").write_bytes(gzip.compress((run / shape / "live.pickle").read_bytes(), 9))
        if (run / shape / "probes.json").exists():
            shutil.copy(run / shape / "probes.json", dest / shape / "probes.json")
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    stamp = datetime.fromtimestamp((run / shapes[0] / "live.pickle").stat().st_mtime, timezone.utc)
    (dest / "run.json").write_text(json.dumps({
        "label": label, "measured": stamp.isoformat(timespec="minutes"), "shapes": shapes,
        "host": this_host(),
        "speed_probes": summary.get("speed_probes"), "host_cpu": summary.get("host_cpu"),
        "wall_s": summary.get("wall_s"), "api_cores": summary.get("api_cores")}, indent=2) + "\n")
    return dest


def this_host() -> dict:
    """Where a run is measured: architecture, CPU name, cores, the CPU's vector and matrix
    extensions (:data:`ISA_FLAGS` it reports; a VM keeps its name and id on other hardware, and
    vLLM's CPU speed follows these), host name and ``/etc/machine-id`` (None where the system has
    none), the last two telling machines apart (:func:`machine_of`)."""
    try:
        machine_id = Path("/etc/machine-id").read_text().strip() or None
    except OSError:
        machine_id = None
    return {"machine": platform.machine(), "cpu": _cpu_name(), "cores": os.cpu_count(), "isa": _cpu_isa(),
            "hostname": platform.node() or None, "machine_id": machine_id}


def machine_of(meta: dict) -> str:
    """An archived run's machine, from its ``run.json``: its machine id (a VM cloned from one image
    may share it, so the host name goes with it), else its host name, else what its CPU says
    (architecture, name, cores), which cannot tell two like machines apart."""
    host = meta.get("host") or {}
    if host.get("machine_id") or host.get("hostname"):
        return f"{host.get('hostname')}/{host.get('machine_id')}"
    return f"{host.get('machine')} {host.get('cpu')} x{host.get('cores')}"


def place_of(meta: dict) -> str:
    """An archived run's UTC day and machine, from its ``run.json``, as the coverage's "by day and
    machine" line names them: ``2026-12-05 vm/3d1219c7`` (the machine id cut to 8 characters), or
    ``unknown`` without a date."""
    if not meta.get("measured"):
        return "unknown"
    host = meta.get("host") or {}
    if host.get("machine_id"):
        machine = f"{host.get('hostname')}/{host['machine_id'][:8]}"
    else:  # the host name alone, else what the CPU says (machine_of)
        machine = host.get("hostname") or machine_of(meta)
    return f"{meta['measured'][:10]} {machine}"


def runs_behind(runs: list[Path]) -> str:
    """One line: the days (UTC, from each ``run.json``'s ``measured``) and machines
    (:func:`machine_of`) the archived ``runs`` come from, and how many distinct (day, machine)
    pairs, against issue 37's three runs on different days or machines.

    Raises:
        SystemExit: a run's ``run.json`` is not a JSON object (:func:`_run_meta`).
    """
    metas = [_run_meta(r) for r in runs]
    places = {(m["measured"][:10], machine_of(m)) for m in metas if m.get("measured")}
    days = sorted({day for day, _ in places})
    machines = {machine for _, machine in places}
    met = "met" if len(places) >= 3 else "not met"
    return (f"{len(runs)} runs on {len(days)} day(s) ({', '.join(days) or 'unknown'}) and {len(machines)} machine(s), "
            f"{len(places)} distinct day-and-machine pair(s); issue 37 asks for runs on >= 3 different days or "
            f"machines: {met}")


def _run_meta(run: Path) -> dict:
    """An archived run's ``run.json`` ({} without one).

    Raises:
        SystemExit: a one-line error naming the file, line and column when it is not valid JSON.
    """
    path = run / "run.json"
    if not path.exists():
        return {}
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        sys.exit(f"error: {path}:{exc.lineno}: not valid JSON ({exc.msg}, column {exc.colno})")
    if not isinstance(meta, dict):
        sys.exit(f"error: {path}: a run.json is a JSON object, got {type(meta).__name__}")
    return meta


ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")
"""The ``/proc/cpuinfo`` flags a run records: what decides whether vLLM's CPU backend runs a
bf16 model's matrix products in oneDNN (AVX-512 BF16, AMX) or falls back to slower paths."""


def _cpuinfo(field: str) -> str | None:
    """The first processor's ``field`` in ``/proc/cpuinfo`` (``model name``, ``flags``); None
    where the file or the field is missing."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _cpu_isa() -> list[str] | None:
    """The :data:`ISA_FLAGS` the first processor of ``/proc/cpuinfo`` reports; None without one."""
    flags = _cpuinfo("flags")
    return None if flags is None else [f for f in ISA_FLAGS if f in flags.split()]


def _cpu_name() -> str:
    name = _cpuinfo("model name")
    return name if name is not None else platform.processor() or "unknown"


def rescore(run: Path, extra: list[str]) -> list[dict]:
    """``bench_validate.py --rescore run`` (today's code and profiles); the rows of its
    ``summary.json``, each tagged with the run's label."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, str(HERE / "bench_validate.py"), "--rescore", str(run), "--out", tmp,
               "--shapes", ",".join(s for s in SHAPES if (run / s).is_dir()), *extra]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"error: rescoring {run} failed:\n{done.stderr[-2000:]}")
        rows = json.loads((Path(tmp) / "summary.json").read_text())["rows"]
    for r in rows:
        r["run"] = run.name
    return rows


def coverage_report(rows: list[dict], one_round: bool = False) -> list[str]:
    """Lines: per profile, the pooled coverage with runs, figures and live rounds behind it, then
    per run, per shape and per measure. ``one_round``: of the rows that score each live round on
    its own (``bench_validate --one-round``), else of the rows that score the rounds' means."""
    lines = []
    for profile in dict.fromkeys(r["profile"] for r in rows):
        mine = [r for r in rows if r["profile"] == profile and r.get("inside") is not None
                and bool(r.get("one_round")) == one_round]
        if not mine:
            continue
        runs = sorted({r["run"] for r in mine})
        if one_round:
            rounds = len({(r["run"], r["shape"], r["round"]) for r in mine})
        else:
            rounds = sum({(r["run"], r["shape"]): r["live_rounds"] for r in mine}.values())
        k, n = sum(bool(r["inside"]) for r in mine), len(mine)
        level = mine[0]["level"]
        # bench_validate's <name>@<period> rows score the first profile at the ends of its engine-speed
        # period's interval: a check, not counted as a target there or here
        target = ("a check at one end of the engine-speed period's interval, not a target" if "@" in profile
                  else "target >= 85 % over >= 3 runs on different days or machines")
        what = "single live rounds inside their one-round" if one_round else "inside the"
        lines.append(f"{profile}: {k} of {n} {what} {100 * level:g} % interval ({100 * k / n:.0f} %; {target}), "
                     f"{len(runs)} runs, {rounds} live rounds per policy")

        def part(key: str, name: str, width: bool = False) -> str:
            sub = [r for r in mine if r[key] == name]
            text = f"{name} {sum(bool(r['inside']) for r in sub)}/{len(sub)}"
            return text + (f" ({_width(sub)})" if width else "")

        lines.append("  by run:     " + ", ".join(part("run", v) for v in runs))
        if all("place" in r for r in mine):  # issue 37's unit: runs on different days or machines
            places = sorted({r["place"] for r in mine})
            lines.append("  by day and machine: " + ", ".join(part("place", v) for v in places))
        lines.append("  by shape:   " + ", ".join(part("shape", v) for v in dict.fromkeys(r["shape"] for r in mine)))
        lines.append("  by measure (median interval width: high / low for times, percentage points for changes, absolute for shares): "
                     + ", ".join(part("metric", v, True) for v in dict.fromkeys(r["metric"] for r in mine)))
    return lines


def _width(rows: list[dict]) -> str:
    """The rows' median interval width: as high / low for times and rates (log-space intervals),
    in percentage points for changes, absolute for shares."""
    import statistics

    ivs = [r["interval"] for r in rows if r.get("interval") and None not in r["interval"]]
    if not ivs:
        return "-"
    if rows[0]["metric"].startswith("change "):
        return f"{statistics.median(hi - lo for lo, hi in ivs):.1f} pp"
    if rows[0]["metric"].endswith("_s"):
        return f"x{statistics.median(hi / lo for lo, hi in ivs if lo > 0):.2f}"
    return f"{statistics.median(hi - lo for lo, hi in ivs):.3f}"


def main(argv: list[str] | None = None) -> None:
    sys.stdout.reconfigure(line_buffering=True)  # each line as it is printed, also into a file or pipe
    first, _, rest = __doc__.partition("\n\n")
    parser = argparse.ArgumentParser(description=first, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=rest)
    parser.add_argument("runs", nargs="*", type=Path,
                        help=f"Archived runs (default: every folder of {ARCHIVE.relative_to(HERE.parent)}).")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="Archive this bench_validate --out folder first.")
    parser.add_argument("--label", help="The archived run's folder name (default: its date and time).")
    parser.add_argument("--no-speed-scale", action="store_true", help="Passed to bench_validate.py.")
    parser.add_argument("--profile", action="append", help="Passed to bench_validate.py (repeatable).")
    parser.add_argument("--run-to-run-prior", type=float, metavar="LOG_SD",
                        help="Passed to bench_validate.py (used with --one-round, and by a figure left with one "
                             "whole live round when the others were cut short).")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, metavar="N",
                        help="Runs rescored at once, each in its own process (default: the cores, %(default)s).")
    parser.add_argument("--one-round", action="store_true",
                        help="Also score every live round on its own against its one-round interval (kvroute "
                             "validate's default of one live round); printed after the rounds' means.")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs: at least 1, got {args.jobs}")
    if args.run_to_run_prior is not None and not 0 <= args.run_to_run_prior < math.inf:
        parser.error(f"--run-to-run-prior: a finite number >= 0, got {args.run_to_run_prior}")
    for name in args.profile or []:
        from kvroute.sim.timing.profile import load_profile

        try:
            load_profile(name)
        except (FileNotFoundError, ValueError) as exc:
            parser.error(f"--profile: {exc}")
    for run in args.runs:
        if not run.exists():
            parser.error(f"{run}: does not exist")
        if not any((run / shape).is_dir() for shape in SHAPES):
            parser.error(f"{run}: not an archived run (no {', '.join(SHAPES)} folder in it)")
    if args.keep:
        label = args.label or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H%M")
        print(f"archived {args.keep} as {keep(args.keep, label)}")
    runs = args.runs or sorted(p for p in ARCHIVE.glob("*") if p.is_dir())
    if not runs:
        sys.exit(f"error: no archived run in {ARCHIVE} (archive one with --keep DIR)")
    extra = ((["--no-speed-scale"] if args.no_speed_scale else []) + (["--one-round"] if args.one_round else [])
             + (["--run-to-run-prior", str(args.run_to_run_prior)] if args.run_to_run_prior is not None else [])
             + [a for p in args.profile or [] for a in ("--profile", p)])
    behind = runs_behind(runs)  # before the rescoring: a bad run.json stops it at once
    places = {run.name: place_of(_run_meta(run)) for run in runs}
    print(f"rescoring {len(runs)} run(s), {min(args.jobs, len(runs))} at a time ...", file=sys.stderr)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # each rescore is its own process
        rows = [row for rows in pool.map(lambda run: rescore(run, extra), runs) for row in rows]
    for row in rows:
        row["place"] = places[row["run"]]
    print(behind)
    for line in coverage_report(rows):
        print(line)
    if args.one_round:
        print("each live round on its own, as kvroute validate checks its default single live round:")
        for line in coverage_report(rows, one_round=True):
            print(line)


if __name__ == "__main__":
    main()
