"""``kvroute profiles``: the shipped profiles, one line each."""

from __future__ import annotations

import click


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


@click.command("profiles")
def profiles_command():
    """List the shipped profiles, one line each: name, source (measured/derived), hardware, model,
    KV blocks per worker."""
    from tabulate import tabulate

    from kvroute.sim.timing.profile import shipped_profiles

    rows = [profile_fields(name) for name in shipped_profiles()]
    click.echo(tabulate(rows, tablefmt="plain", disable_numparse=True))
