"""``kvroute profiles``: the shipped profiles, one line each; ``kvroute profiles derive``: a
profile for any GPU of the spec table and any dense model, with tensor parallelism."""

from __future__ import annotations

import click

from kvroute.cli.help_text import HelpfulGroup
from kvroute.cli.values import Choice, Number
from kvroute.traces.inputs import BLOCK_SIZE, FRACTION, TOKENS, Num


def _version_help() -> str:
    """``--vllm-version``'s help, from ``vllm_versions``: every group of releases read with the
    defaults the prior takes from it (block size, memory share, scheduling, CUDA-graph memory)."""
    from kvroute.sim.timing.vllm_versions import CURRENT, STUDY, family, release_groups

    parts = []
    for n, (first, last, d) in enumerate(release_groups()):
        span = first if first == last else f"{first}-{last}"
        scheduling = "async" if d.async_scheduling_cuda else "sync"
        what = (f"block {d.block_size}, memory {d.gpu_memory_utilization}, {scheduling} scheduling" if n == 0
                else f"{d.block_size}, {d.gpu_memory_utilization}, {scheduling}")
        what += ", CUDA graphs' memory set aside" if d.cudagraph_memory_profiled else ""
        parts.append(f"{span} ({what})")
    return (f"The vLLM release whose defaults the prior takes: {', '.join(parts)}; the seed study ran "
            f"{family(STUDY)} [default: the newest release read, {CURRENT}].")


def _default_help(attribute: str) -> str:
    """A release default's changes over the releases read, e.g. ``16; 64 from 0.34``."""
    from kvroute.sim.timing.vllm_versions import release_groups

    text, last = "", None
    for first, _, d in release_groups():
        value = getattr(d, attribute)
        if value != last:
            text += f"{value}" if last is None else f"; {value} from {first}"
            last = value
    return text


def profile_fields(name: str) -> list[str]:
    """A shipped profile's fields for its line: name, source (measured/derived), hardware, model
    and its KV blocks per worker (``engine.num_gpu_blocks``) with the block size.

    Raises:
        FileNotFoundError / ValueError: as :func:`kvroute.sim.timing.profile.load_profile`.
    """
    from kvroute.sim.timing.profile import load_profile

    profile = load_profile(name)
    raw = profile.raw
    kind = (raw.get("provenance") or {}).get("kind", "?")
    hardware = raw.get("hardware") or {}
    device = hardware.get("gpu") or hardware.get("description") or "?"
    model = (raw.get("model") or {}).get("name", "?")
    engine = profile.engine
    return [name, kind, device, model, f"{engine.num_gpu_blocks:>7,} KV blocks of {engine.block_size} tokens"]


def list_profiles() -> None:
    """Print the shipped profiles' lines."""
    from tabulate import tabulate

    from kvroute.sim.timing.profile import shipped_profiles

    rows = [profile_fields(name) for name in shipped_profiles()]
    click.echo(tabulate(rows, tablefmt="plain", disable_numparse=True))


@click.group("profiles", cls=HelpfulGroup, invoke_without_command=True)
@click.pass_context
def profiles_command(ctx: click.Context):
    """List the shipped profiles, one line each: name, source (measured/derived), hardware, model,
    KV blocks per worker.

    Subcommands: list (the same), derive (a profile for any GPU and model, with tensor
    parallelism), gpus and models (what derive takes).
    """
    if ctx.invoked_subcommand is None:
        list_profiles()


@profiles_command.command("list")
def list_command():
    """List the shipped profiles, one line each (as kvroute profiles with no subcommand)."""
    list_profiles()


@profiles_command.command("gpus")
def gpus_command():
    """List the GPUs that derive --gpu takes (the spec table sim/timing/data/gpus.csv)."""
    from kvroute.sim.timing.specs import load_gpu_table

    for name, g in load_gpu_table().items():
        fp8 = f"{g.peak_fp8_flops / 1e12:g}" if g.peak_fp8_flops else "-"
        nvlink = f"{g.nvlink_bidir_bytes_per_s / 1e9:g} GB/s" if g.nvlink_bidir_bytes_per_s else "none"
        click.echo(f"{name:<14} {g.name:<24} {g.memory_bytes / 2**30:6.1f} GiB  bf16 {g.peak_bf16_flops / 1e12:g} "
                   f"TFLOP/s  fp8 {fp8}  {g.memory_bandwidth_bytes_per_s / 1e12:g} TB/s  NVLink {nvlink}  ({g.source})")


@profiles_command.command("models")
def models_command():
    """List the model shapes that derive --model takes (sim/timing/data/models/)."""
    from kvroute.sim.timing.specs import model_names, model_spec

    for stem in model_names():
        m = model_spec(stem)
        click.echo(f"{stem:<16} {m.name:<36} {m.total_params / 1e9:6.2f}B params, {m.num_layers} layers, "
                   f"{m.num_kv_heads} KV heads")


@profiles_command.command("derive")
@click.option("--gpu", "gpu", required=True, help="GPU of the spec table (kvroute profiles gpus), e.g. H100-SXM.")
@click.option("--model", "model", required=True,
              help="Shipped model (kvroute profiles models), e.g. Llama-3.1-70B, or the path of a Hugging Face config.json.")
@click.option("--tp", type=Number(Num(integer=True, minimum=1, maximum=1024)), default=1, show_default=True, help="Tensor-parallel size: GPUs per worker.")
@click.option("--dtype", type=Choice(["bf16", "fp8"]), default="bf16", show_default=True,
              help="Weights: bf16, or fp8 linear layers (embedding, LM head and norms stay bf16).")
@click.option("--kv-cache-dtype", type=Choice(["auto", "fp8"]), default="auto", show_default=True,
              help="KV cache: auto (bf16) or fp8.")
@click.option("--max-model-len", type=Number(TOKENS), default=None,
              help="Longest sequence, tokens [default: the model's max_position_embeddings].")
@click.option("--vllm-version", "vllm_version", default=None, metavar="VERSION", help=_version_help())
@click.option("--block-size", type=Number(BLOCK_SIZE), default=None,
              help=f"Tokens per KV block, as vLLM's --block-size [default: the release's, {_default_help('block_size')}]. "
                   "llm-d's precise scorer (blockSize) needs the engine's.")
@click.option("--gpu-memory-utilization", type=Number(FRACTION), default=None,
              help="vLLM's share of each GPU, as its --gpu-memory-utilization [default: the release's, "
                   f"{_default_help('gpu_memory_utilization')}].")
@click.option("--cudagraph-memory-gib", "cudagraph_gib", type=Number(Num(minimum=0.0, maximum=1024.0, unit="GiB")),
              default=None,
              help="Memory vLLM sets aside per GPU for CUDA graphs before the KV cache, as a server logs it "
                   "('Estimated CUDA graph memory: X GiB total'); 0 with --enforce-eager or "
                   "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 [default: 1 GiB (stated) from vLLM 0.21, 0 before].")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Profile JSON to write [default: <name>.json in the current directory].")
def derive_command(gpu, model, tp, dtype, kv_cache_dtype, max_model_len, vllm_version, block_size,
                   gpu_memory_utilization, cudagraph_gib, out):
    """Derive a profile for a GPU and a model from spec sheets, print its summary and write it.

    The profile is a roofline prior with stated efficiencies (docs/guide/derive-a-profile.md);
    kvroute compare --profile FILE takes the file.
    """
    import json

    from kvroute.sim.timing import priors
    from kvroute.sim.timing.profile import KVBlockTooLarge
    from kvroute.sim.timing.specs import gpu_spec, model_spec
    from kvroute.traces.outputs import write_text_atomic

    try:
        gpu_row = gpu_spec(gpu)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--gpu'") from None
    try:
        model_row = model_spec(model)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--model'") from None
    try:
        model_row.check_tp(tp)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--tp'") from None
    from kvroute.sim.timing.vllm_versions import CURRENT, TESTED_RANGE, parse_version

    version = CURRENT if vllm_version is None else vllm_version
    if parse_version(version) is None:
        raise click.BadParameter(f"a release such as 0.11 or 0.34.0, got {version!r}", param_hint="'--vllm-version'")
    if not parse_version(TESTED_RANGE[0]) <= parse_version(version) <= parse_version(TESTED_RANGE[1]):
        raise click.BadParameter(f"{version} is outside the releases read, {TESTED_RANGE[0]} to {TESTED_RANGE[1]}",
                                 param_hint="'--vllm-version'")
    try:
        doc = priors.derive_profile(gpu_row, model_row, tp=tp, dtype=dtype, kv_cache_dtype=kv_cache_dtype,
                                    max_model_len=max_model_len, vllm_version=version, block_size=block_size,
                                    gpu_memory_utilization=gpu_memory_utilization,
                                    cudagraph_bytes=None if cudagraph_gib is None else round(cudagraph_gib * 2**30))
    except KVBlockTooLarge as exc:
        raise click.ClickException(f"{exc} (a smaller --block-size, or fewer bytes per block: more GPUs with --tp, "
                                   "fp8 with --kv-cache-dtype)") from None
    except ValueError as exc:
        raise click.ClickException(f"{exc} (more GPUs with --tp, fp8 with --dtype/--kv-cache-dtype, or a "
                                   "shorter --max-model-len)") from None
    path = out if out is not None else f"{doc['name']}.json"
    click.echo(priors.derive_summary(doc))
    try:
        write_text_atomic(path, json.dumps(doc, indent=2) + "\n")
    except OSError as exc:
        raise click.BadParameter(f"cannot write {path}: {exc.strerror or exc}", param_hint="'--out'") from None
    click.echo(f"wrote {path} (kvroute compare --profile {path})")
