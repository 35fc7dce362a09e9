"""Policies from the command line: specs with parameters, the listing, and a user's own policy."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvroute.cli.main import cli
from kvroute.sim.routing import POLICIES


USER_POLICY = '''
from kvroute.sim.routing import Policy, register, pick_min


@register("fewest_tokens")
class FewestTokens(Policy):
    """The live worker with the fewest prompt tokens waiting to be prefilled."""

    def choose(self, request, view):
        return pick_min(view.alive_workers(), view.outstanding_tokens.__getitem__, self.rng)
'''


def test_policies_lists_every_policy_on_one_line():
    out = CliRunner().invoke(cli, ["policies"]).output.splitlines()
    assert [line.split()[0] for line in out] == list(POLICIES)
    assert any(line.startswith("dynamo ") and "[overlap_weight=1.0,temperature=0.0,ttl_s=120.0]" in line for line in out)


def test_compare_takes_policies_with_parameters():
    result = CliRunner().invoke(cli, ["compare", "--chats", "4", "--turns", "2", "--rounds", "1", "--json",
                                      "--policies", "sglang,dynamo:overlap_weight=2,temperature=0.5"])
    assert result.exit_code == 0, result.output
    assert '"dynamo:overlap_weight=2,temperature=0.5"' in result.output
    bad = CliRunner().invoke(cli, ["compare", "--policies", "dynamo:weight=1"])
    assert bad.exit_code == 2
    assert "policy 'dynamo' has no parameter 'weight'; its parameters: overlap_weight, temperature" in bad.output


def test_router_options_reach_the_cluster():
    args = ["simulate", "--chats", "8", "--turns", "3", "--json", "--policy", "kv_aware"]
    one = CliRunner().invoke(cli, args)
    local = CliRunner().invoke(cli, args + ["--gateways", "4"])
    shared = CliRunner().invoke(cli, args + ["--gateways", "4", "--gateway-state", "shared", "--store-latency", "0.05"])
    assert one.exit_code == local.exit_code == shared.exit_code == 0
    assert one.output != local.output and local.output != shared.output
    bad = CliRunner().invoke(cli, args + ["--gateways", "0"])
    assert bad.exit_code == 2 and "Invalid value for '--gateways': must be >= 1, got 0" in bad.output


def test_a_user_policy_in_one_file_runs_by_name(tmp_path: Path):
    path = tmp_path / "fewest_tokens.py"
    path.write_text(USER_POLICY)
    env = {**os.environ, "KVROUTE_POLICY_FILES": str(path)}
    kvroute = Path(sys.executable).with_name("kvroute")
    listing = subprocess.run([str(kvroute), "policies"], env=env, capture_output=True, text=True, check=True)
    assert listing.stdout.splitlines()[-1].startswith("fewest_tokens")
    run = subprocess.run([str(kvroute), "simulate", "--chats", "4", "--turns", "2", "--policy", "fewest_tokens"],
                         env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "fewest_tokens" in run.stdout


def test_a_missing_or_broken_user_policy_file_is_a_one_line_error(tmp_path: Path):
    missing = tmp_path / "nope.py"
    result = CliRunner().invoke(cli, ["policies"], env={"KVROUTE_POLICY_FILES": str(missing)})
    assert result.exit_code == 1
    assert result.output == f"Error: KVROUTE_POLICY_FILES: {missing} does not exist\n"
    listed = f"{tmp_path / 'a.py'},{tmp_path / 'b.py'}"  # a list in the wrong separator
    result = CliRunner().invoke(cli, ["policies"], env={"KVROUTE_POLICY_FILES": listed})
    assert result.output == f"Error: KVROUTE_POLICY_FILES: {listed} does not exist (the files are separated by ':', not ',')\n"
    broken = tmp_path / "broken.py"
    broken.write_text("def (:\n")
    result = CliRunner().invoke(cli, ["policies"], env={"KVROUTE_POLICY_FILES": str(broken)})
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: KVROUTE_POLICY_FILES: {broken} failed to import: invalid syntax")
    unimportable = tmp_path / "unimportable.py"  # the line of a failed import (a SyntaxError names its own)
    unimportable.write_text("import os\n\nimport kvroute_no_such_module\n")
    result = CliRunner().invoke(cli, ["policies"], env={"KVROUTE_POLICY_FILES": str(unimportable)})
    assert (result.exit_code, result.output) == (1, f"Error: KVROUTE_POLICY_FILES: {unimportable} failed to import at "
                                                    "line 3: No module named 'kvroute_no_such_module'\n")
    (tmp_path / "notes.txt").write_text("x = 1\n")
    for path, reason in ((tmp_path, "is a folder, not a file"), (tmp_path / "notes.txt", "is not a Python file (.py)")):
        result = CliRunner().invoke(cli, ["policies"], env={"KVROUTE_POLICY_FILES": str(path)})
        assert (result.exit_code, result.output) == (1, f"Error: KVROUTE_POLICY_FILES: {path} {reason}\n")
    # a run of built-in policies does not read the files
    run = CliRunner().invoke(cli, ["simulate", "--chats", "2", "--turns", "1", "--policy", "round_robin", "--quiet"],
                             env={"KVROUTE_POLICY_FILES": str(missing)})
    assert run.exit_code == 0, run.output


BROKEN_POLICIES = '''
from kvroute.sim.routing import Policy, register


@register("minus_one")
class MinusOne(Policy):
    def choose(self, request, view):
        return -1


@register("boom")
class Boom(Policy):
    def choose(self, request, view):
        return self.missing
'''


def test_a_user_policy_that_returns_no_worker_or_raises_is_a_one_line_error(tmp_path: Path):
    """Through the default executor (compare's runs in a process pool): the error names the
    policy, the user's file and the line that raised, not "internal error (a bug in kvroute)"."""
    path = tmp_path / "negpol.py"
    path.write_text(BROKEN_POLICIES)
    env = {**os.environ, "KVROUTE_POLICY_FILES": str(path)}
    kvroute = str(Path(sys.executable).with_name("kvroute"))
    small = ["--chats", "4", "--turns", "2", "--quiet"]
    raised = subprocess.run([kvroute, "compare", *small, "--rounds", "2", "--policies", "round_robin,boom"],
                            env=env, capture_output=True, text=True)
    assert (raised.returncode, raised.stderr) == (
        1, f"Error: policy 'boom' ({path} line 14) raised AttributeError in choose(): "
           "'Boom' object has no attribute 'missing'\n")
    negative = subprocess.run([kvroute, "simulate", *small, "--policy", "minus_one"], env=env, capture_output=True,
                              text=True)
    assert (negative.returncode, negative.stderr) == (
        1, f"Error: policy 'minus_one' ({path}, choose() defined at line 7) returned -1 from choose(): a worker must be "
           "an int in range(4)\n")
    # a sweep stops on it too: a policy's bug is not an infeasible grid point to mark failed and pass
    swept = subprocess.run([kvroute, "sweep", "--chats", "3,4", "--turns", "2", "--workers", "2", "--rounds", "1",
                            "--no-progress", "--policies", "minus_one"], env=env, capture_output=True, text=True)
    assert (swept.returncode, swept.stderr.splitlines()[-1]) == (
        1, f"Error: policy 'minus_one' ({path}, choose() defined at line 7) returned -1 from choose(): a worker must be "
           "an int in range(2)")


def test_a_scenario_of_ones_own_policy_records_its_file_and_says_how_to_rerun(tmp_path: Path):
    """Its scenario.yaml could not be re-run in a new shell (the policy is imported from its file)
    and nothing recorded which file: now the header's command sets KVROUTE_POLICY_FILES, the
    provenance holds the file's path and sha256, and a re-run warns when the file changed."""
    import hashlib

    import yaml

    path = tmp_path / "fewest_tokens.py"
    path.write_text(USER_POLICY)
    kvroute = str(Path(sys.executable).with_name("kvroute"))
    env = {**os.environ, "KVROUTE_POLICY_FILES": str(path)}
    out, again = tmp_path / "a", tmp_path / "b"
    run = subprocess.run([kvroute, "compare", "--chats", "4", "--turns", "2", "--rounds", "1", "--policies",
                          "round_robin,fewest_tokens", "--out", str(out), "--records-format", "csv"], env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    text = (out / "scenario.yaml").read_text()
    assert text.splitlines()[0] == (f"# KVROUTE_POLICY_FILES={path} kvroute compare --config {out / 'scenario.yaml'} "
                                    "re-runs this scenario; command-line flags override these values.")
    # the line for the output flags sets it too (it left it out, and failed as printed)
    assert text.splitlines()[2] == (f"# to write the same files again: KVROUTE_POLICY_FILES={path} kvroute compare "
                                    f"--config {out / 'scenario.yaml'} --out DIR --records-format csv")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert yaml.safe_load(text)["kvroute"]["policy_files"] == {"fewest_tokens": {"path": str(path), "sha256": digest}}
    bare = {k: v for k, v in os.environ.items() if k != "KVROUTE_POLICY_FILES"}
    lost = subprocess.run([kvroute, "compare", "--config", str(out / "scenario.yaml")], env=bare, capture_output=True,
                          text=True)
    assert lost.returncode == 2 and "unknown policy 'fewest_tokens'" in lost.stderr
    assert "(a policy of your own is imported from its file: KVROUTE_POLICY_FILES=FILE.py)" in lost.stderr
    assert " ".join(lost.stderr.split()).endswith(  # the file's run says where its policy came from
        f"; its run imported fewest_tokens from {path}: re-run with KVROUTE_POLICY_FILES={path}, as the file's "
        "first line says")
    path.write_text(USER_POLICY + "# edited\n")
    rerun = subprocess.run([kvroute, "compare", "--config", str(out / "scenario.yaml"), "--out", str(again)], env=env,
                           capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert (f"warning: policy fewest_tokens's file {path} (sha256 {digest[:12]}... then, "
            f"{hashlib.sha256(path.read_bytes()).hexdigest()[:12]}... now) differs from the --config run's") in rerun.stderr


def test_an_unknown_policy_says_what_each_policy_file_registered(tmp_path: Path, monkeypatch):
    """A file that registers nothing (no @register) made the error say how to import a file, as if
    KVROUTE_POLICY_FILES were unset."""
    from kvroute.sim.routing import parse_spec

    bare = tmp_path / "unregistered_policy.py"
    bare.write_text("from kvroute.sim.routing import Policy\n\n\nclass Mine(Policy):\n"
                    "    def choose(self, request, view):\n        return 0\n")
    monkeypatch.setenv("KVROUTE_POLICY_FILES", str(bare))
    with pytest.raises(ValueError) as caught:
        parse_spec("mine")
    assert str(caught.value).endswith(f"(KVROUTE_POLICY_FILES: {bare} registers no policy (no @register))")


def _sessionless_trace(path: Path) -> Path:
    import json

    rows = [{"timestamp": 0.1 * i, "input_length": 200, "output_length": 10, "hash_ids": [i]} for i in range(4)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_compare_says_session_affinity_fell_back_on_a_trace_without_sessions(tmp_path):
    trace = _sessionless_trace(tmp_path / "t.jsonl")
    result = CliRunner().invoke(cli, ["compare", "--trace", str(trace), "--workers", "2", "--rounds", "1",
                                      "--policies", "least_loaded,session_affinity"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == (
        "Note: no request of this workload carries a session id, so session_affinity routed every request as "
        "least_loaded does (its fallback for a request without a session); sticky sessions need a trace whose "
        "records give session_id.")
    assert "session id" not in CliRunner().invoke(cli, ["compare", "--trace", str(trace), "--workers", "2", "--rounds",
                                                        "1", "--policies", "least_loaded"]).output


def test_session_affinity_counts_the_requests_without_a_session():
    cls = POLICIES["session_affinity"]
    records = [type("R", (), {"session_id": s}) for s in (None, 7, None, 7)]
    assert cls.workload_note(records) == ("Note: 2 of 4 requests carry no session id; session_affinity routed those "
                                          "as least_loaded does (its fallback for a request without a session).")
    assert cls.workload_note(records[1::2]) == ""
    assert POLICIES["least_loaded"].workload_note(records) == ""


def test_a_saved_runs_policy_file_is_named_only_when_its_block_gives_a_path():
    """A hand-edited block with an empty path made the hint read "imported x from : re-run with
    KVROUTE_POLICY_FILES=,"."""
    from kvroute.cli.config import _saved_policy_files

    assert _saved_policy_files({"policy_files": {"mine": {"path": "/p/mine.py"}}}) == (
        "; its run imported mine from /p/mine.py: re-run with KVROUTE_POLICY_FILES=/p/mine.py, as the file's first "
        "line says")
    for block in ({"mine": {"path": ""}}, {"mine": {"path": 7}}, {"mine": None}, [1, 2], "x"):
        assert _saved_policy_files({"policy_files": block}) == ""
    assert _saved_policy_files({"policy_files": {"round_robin": {"path": "/p/rr.py"}}}) == ""  # built in: no hint
