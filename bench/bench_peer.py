"""kvroute side by side with a compiled peer (NVIDIA AISimulate with the Dynamo KV router) and
with a reference kvroute (e.g. the main branch), whole processes timed, runs interleaved.
Both kvroutes are byte-compiled first (``compileall``), as an installed package is.

    python bench/bench_peer.py                          # every case, 3 pairs each
    python bench/bench_peer.py --cases full-kv,full-rr --runs 5
    python bench/bench_peer.py --reference-ref main     # seed20 and help against main's kvroute
    python bench/bench_peer.py --reference-python /path/to/other/venv/bin/python

Cases (A is this checkout's kvroute: against the peer installed with ``pip install .`` in a venv
of its own, as the peer is in its own (``--kvroute-venv``; ``here`` for this Python); against the
reference kvroute and in ``scaling`` run with this Python):

- ``full-rr``, ``full-kv``: the Mooncake conversation trace (12,031 requests), 8 workers,
  ``kvroute simulate --policy round_robin|kv_aware`` against the peer's
  ``dynamo.replay.run_trace_replay(..., router_mode="round_robin"|"kv_router")`` with the
  engine of the ``a100-80gb-qwen2.5-7b`` profile (16-token blocks, 66,534 blocks, 2048 batched
  tokens, 256 sequences, max_model_len 32,768).
- ``first1000-rr``, ``first1000-kv``: the same on the trace's first 1,000 records (start-up counts).
- ``seed20``: the seed burst with 20 turns (fixed 128-token replies, from one trace file), 4 workers,
  kv_aware, against the reference kvroute.
- ``help``: ``kvroute simulate --help`` against the reference kvroute's.
- ``scaling``: not a pair: this kvroute on the trace concatenated 4 times (hash ids offset per
  copy, timestamps shifted by the trace's span) against one copy; target <= 4.5x the time, and
  peak memory < 1 GB for one copy.

Each pair runs A then B, ``--runs`` times; the ratio A/B is taken pair by pair (pairing keeps it
meaningful when the machine's speed drifts). Wall time is ``time.perf_counter`` around the child
process, peak memory the child's own ``ru_maxrss`` (``os.wait4``). The peer is installed on first
use into its own venv (``--peer-venv``) from PyPI with the pins below; newer aisimulate dev
builds do not match that runtime's schema and the 0.13.0 release is a stub. The shared trace
files are read from ``../shared/traces`` (beside the clone); cases that need them are skipped
with a message when they are absent. The reference kvroute for ``--reference-ref`` is exported
with ``git archive`` into a temporary folder, its compiled engine core built there
(``setup.py build_ext --inplace``, when it has one) and imported through ``PYTHONPATH`` with
this Python (its dependencies must match); the run prints which engine core each side imports.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
DEFAULT_PEER_VENV = Path.home() / ".cache" / "kvroute-bench" / "peer-venv"
DEFAULT_KVROUTE_VENV = Path.home() / ".cache" / "kvroute-bench" / "kvroute-venv"

PEER_PINS = [
    ["aisimulate==0.13.0.dev202610130000000070", "ai-dynamo-runtime==1.6.1"],
    ["--no-deps", "ai-dynamo==1.6.1"],
    ["aiohttp<4,>=3.14.3", "certifi>=2026.10.19", "kubernetes<33,>=32.0.1", "msgspec>=0.19",
     "prometheus-client<1,>=0.23.1", "pyzmq>=26", "redis<9,>=6.2", "transformers>=4.56",
     "zstandard<1,>=0.23"],
]
"""pip install steps for the peer, in order (``ai-dynamo`` without its dependencies)."""

PEER_ENGINE = {"engine": {"block_size": 16, "num_gpu_blocks": 66534, "max_num_batched_tokens": 2048,
                          "max_num_seqs": 256, "max_model_len": 32768},
               "num_gpu_blocks_is_explicit": True}

PEER_CHILD = """
import sys
from dynamo.replay import run_trace_replay
report = run_trace_replay(sys.argv[2], num_workers=8, router_mode=sys.argv[1], trace_block_size=512,
                          trace_format="mooncake", extra_engine_args=%r)
print("completed", report.summary["completed_requests"])
""" % (PEER_ENGINE,)

CASES = ["full-rr", "full-kv", "first1000-rr", "first1000-kv", "seed20", "help", "scaling"]


def ensure_peer(venv: Path) -> Path:
    """The peer venv's python, creating the venv and installing the pins when missing."""
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", "import dynamo.replay"],
                                          capture_output=True).returncode == 0:
        return python
    print(f"installing the peer into {venv} (a few minutes)...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    for step in PEER_PINS:
        subprocess.run([str(python), "-m", "pip", "install", "-q", *step], check=True)
    return python


def ensure_kvroute(venv: Path) -> Path:
    """A venv of its own with this checkout installed as a user installs a package (``pip install
    .``: a wheel, byte-compiled, no editable finder), as the peer is installed in its own; its
    python. The venv and kvroute's dependencies are made on first use; kvroute itself is rebuilt
    from this checkout on every call (``--no-deps --force-reinstall``, about 30 s: the compiled core).

    NOTE: the interpreter's own site-packages can cost a process tens of milliseconds before
    ``main`` runs (on this project's machine a sandbox's ``.pth`` imports certifi and
    ``importlib.resources``, and the editable install's finder loads at every start, about 40 ms
    of a 0.3 s first-1,000 run); the peer's venv pays neither, so neither side is timed there.
    """
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"installing kvroute's dependencies into {venv} (about a minute)...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", str(ROOT)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(ROOT)],
                   check=True, capture_output=True)
    return python


def export_reference(ref: str, into: Path) -> dict[str, str]:
    """Export ``ref`` of this repository and lay it out as an importable ``kvroute`` package.

    Returns:
        the environment to run the reference with (``PYTHONPATH`` set).
    """
    src = into / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    if (src / "setup.py").exists():  # its compiled engine core, built as pip builds it for this checkout
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=src, capture_output=True)
    pkg = into / "path" / "kvroute"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for name in ("sim", "traces", "calibrate", "cli"):
        (pkg / name).symlink_to(src / name)
    return {**os.environ, "PYTHONPATH": str(into / "path")}


def engine_core(python: str, env: dict[str, str] | None = None) -> str:
    """Which engine core ``python`` (with ``env``) imports: "compiled" or "pure Python (why)"."""
    code = ("import warnings; warnings.simplefilter('ignore')\n"
            "from kvroute.sim.engine import compiled as c\n"
            "print('compiled' if c.COMPILED else f'pure Python ({c.REASON})')")
    done = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True)
    return done.stdout.strip() or f"unknown ({done.stderr.strip().splitlines()[-1:]})"


def precompile(python: str, folders: list[Path]) -> None:
    """Byte-compile the kvroute sources in ``folders`` with ``python`` (``compileall``), as an
    installed package is: without it every run compiles every module again when bytecode is not
    written (``PYTHONDONTWRITEBYTECODE``, an editable install on a read-only tree), which the
    peer, byte-compiled by pip, never pays (about 0.3 G of 5 G instructions of the first-1,000 case)."""
    subprocess.run([python, "-m", "compileall", "-q", *map(str, folders)], check=True, capture_output=True)


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Run ``cmd`` to completion; its wall seconds, peak resident MB and standard output.

    Raises:
        RuntimeError: the command failed (its standard error's tail is in the message).
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:4])}... exited {proc.returncode}: {err.read().decode()[-800:]}")
        return wall, usage.ru_maxrss / 1024, out.read().decode()


def kvroute_cmd(python: str, args: list[str]) -> list[str]:
    """``kvroute ARGS`` run by ``python`` (through the module, so any venv or PYTHONPATH works)."""
    return [python, "-c", "from kvroute.cli.main import main; main()", *args]


def trace_args(path: Path, policy: str) -> list[str]:
    return ["simulate", "--trace", str(path), "--workers", "8", "--profile", "a100-80gb-qwen2.5-7b",
            "--policy", policy, "--json"]


def first_records(path: Path, count: int, into: Path) -> Path:
    """The first ``count`` lines of a Mooncake trace, as a file of their own."""
    target = into / f"first{count}.jsonl"
    with open(path, encoding="utf-8") as src:
        target.write_text("".join(line for _, line in zip(range(count), src)))
    return target


def concatenated(path: Path, copies: int, into: Path) -> Path:
    """``copies`` copies of a Mooncake trace, one after the other: copy k's hash ids are offset
    by k times (largest id + 1) and its timestamps by k times (last timestamp + 1 s)."""
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    offset = 1 + max(h for r in records for h in r.get("hash_ids", [0]))
    span = records[-1]["timestamp"] + 1000
    target = into / f"x{copies}.jsonl"
    with open(target, "w", encoding="utf-8") as out:
        for k in range(copies):
            for r in records:
                out.write(json.dumps({**r, "timestamp": r["timestamp"] + k * span,
                                      "hash_ids": [h + k * offset for h in r["hash_ids"]]}) + "\n")
    return target


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def pair(name: str, a: list[str], b: list[str], runs: int, env_b: dict[str, str] | None, label_b: str,
         speedup: bool = True) -> dict:
    """Run A and B in turn ``runs`` times (after one unmeasured warm-up each); print one row."""
    timed(a)
    timed(b, env_b)
    wa, wb, ma, mb, ratio = [], [], [], [], []
    for _ in range(runs):
        ta, pa, _ = timed(a)
        tb, pb, _ = timed(b, env_b)
        wa.append(ta), wb.append(tb), ma.append(pa), mb.append(pb), ratio.append(ta / tb)
    row = {"case": name, "kvroute_s": wa, "other_s": wb, "kvroute_mb": max(ma), "other_mb": max(mb),
           "ratio": ratio, "vs": label_b}
    print(f"{name:<13} {spread(wa):>22} {max(ma):>7.0f} | {label_b:<9} {spread(wb):>22} {max(mb):>7.0f} | "
          f"{spread(ratio):>20} " + (f"{1 / statistics.median(ratio):>7.2f}x" if speedup else f"{'-':>8}"), flush=True)
    return row


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # each line as it is printed, also into a file or pipe
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    parser.add_argument("--runs", type=int, default=3, help="measured pairs per case (default 3)")
    parser.add_argument("--peer-venv", type=Path, default=DEFAULT_PEER_VENV)
    parser.add_argument("--kvroute-venv", default=str(DEFAULT_KVROUTE_VENV),
                        help="venv in which this checkout is installed (pip install .) for the cases against "
                             "the peer, as the peer is in its own; 'here' runs them with this Python instead "
                             f"(default {DEFAULT_KVROUTE_VENV})")
    parser.add_argument("--trace", type=Path, default=MOONCAKE)
    ref = parser.add_mutually_exclusive_group()
    ref.add_argument("--reference-ref", default="main", help="git ref of the reference kvroute (default main)")
    ref.add_argument("--reference-python", help="a Python with the reference kvroute installed instead")
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"--cases: unknown {sorted(unknown)}; valid: {', '.join(CASES)}")
    here = sys.executable
    with tempfile.TemporaryDirectory(prefix="kvroute-bench-") as tmp:
        tmp_path = Path(tmp)
        needs_trace = [c for c in cases if c.startswith(("full", "first", "scaling"))]
        if needs_trace and not args.trace.exists():
            print(f"skipping {', '.join(needs_trace)}: {args.trace} not found (the shared traces folder is absent)")
            cases = [c for c in cases if c not in needs_trace]
        against_peer = any(c.startswith(("full", "first")) for c in cases)
        peer = ensure_peer(args.peer_venv) if against_peer else None
        installed = here
        if against_peer and args.kvroute_venv != "here":
            installed = str(ensure_kvroute(Path(args.kvroute_venv)))
        ref_python, ref_env = here, None
        if any(c in ("seed20", "help") for c in cases):
            if args.reference_python:
                ref_python = args.reference_python
            else:
                ref_env = export_reference(args.reference_ref, tmp_path / "ref")
        precompile(here, [ROOT / name for name in ("sim", "traces", "calibrate", "cli")])
        if ref_env is not None:
            precompile(ref_python, [tmp_path / "ref" / "src"])
        label_ref = "reference"
        print(f"load average {os.getloadavg()[0]:.2f}; {args.runs} pairs per case; times in s (min / median / max)")
        if any(c in ("seed20", "help") for c in cases):
            print(f"this kvroute's engine core: {engine_core(here)}; the reference's "
                  f"({args.reference_python or args.reference_ref}): {engine_core(ref_python, ref_env)}")
        if against_peer:
            print(f"against the peer: kvroute run by {installed}, the peer by {peer}")
        print(f"{'case':<13} {'kvroute wall':>22} {'peak MB':>7} | {'vs':<9} {'wall':>22} {'peak MB':>7} | "
              f"{'kvroute/other per pair':>20} {'speedup':>8}")
        rows = []
        for case in cases:
            if case.startswith(("full", "first")):
                path = args.trace if case.startswith("full") else first_records(args.trace, 1000, tmp_path)
                policy, mode = ("kv_aware", "kv_router") if case.endswith("kv") else ("round_robin", "round_robin")
                rows.append(pair(case, kvroute_cmd(installed, trace_args(path, policy)),
                                 [str(peer), "-c", PEER_CHILD, mode, str(path)], args.runs, None, "peer"))
            elif case == "seed20":
                # NOTE: one trace file for both, with the lab's fixed 128-token replies: the default
                # seed workload now draws its reply lengths, which older kvroutes cannot.
                seed_trace = tmp_path / "seed20.jsonl"
                subprocess.run(kvroute_cmd(here, ["trace", "generate", "seed-chat", "--turns", "20",
                                                  "--reply-tokens", "128", "--out", str(seed_trace)]),
                               check=True, capture_output=True)
                sim = ["simulate", "--trace", str(seed_trace), "--policy", "kv_aware", "--json"]
                rows.append(pair(case, kvroute_cmd(here, sim), kvroute_cmd(ref_python, sim), args.runs,
                                 ref_env, label_ref))
            elif case == "help":
                helpargs = ["simulate", "--help"]
                rows.append(pair(case, kvroute_cmd(here, helpargs), kvroute_cmd(ref_python, helpargs),
                                 args.runs, ref_env, label_ref))
            elif case == "scaling":
                one = kvroute_cmd(here, trace_args(args.trace, "kv_aware"))
                four = kvroute_cmd(here, trace_args(concatenated(args.trace, 4, tmp_path), "kv_aware"))
                row = pair("scaling 4x/1x", four, one, args.runs, None, "1 copy", speedup=False)
                print(f"{'':<13} target: 4x within 4.5x the time of one copy (median {statistics.median(row['ratio']):.2f}x); "
                      f"peak for one copy {row['other_mb']:.0f} MB, target < 1024 MB")
                rows.append(row)
        print("speedup = 1 / median(kvroute/other); target >= 2x against the peer (full-*, first1000-*); "
              "against the reference kvroute (seed20, help) it is this checkout's gain over that version "
              "(about 1.0 for the same code)")


if __name__ == "__main__":
    main()
