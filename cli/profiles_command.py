"""``kvroute profiles``: the shipped profiles, one line each."""

from __future__ import annotations

import click


def profile_line(name: str) -> str:
    """One line for a shipped profile: name, source (measured/derived), hardware, model, KV blocks
    per worker (``engine.num_gpu_blocks``) and block size.

    Raises:
        FileNotFoundError / ValueError: as :func:`kvroute.sim.profile.load_profile`.
    """
    from kvroute.sim.profile import load_profile

    profile = load_profile(name)
    raw = profile.raw
    kind = (raw.get("provenance") or {}).get("kind", "?")
    hardware = raw.get("hardware") or {}
    device = hardware.get("gpu") or hardware.get("description") or "?"
    model = (raw.get("model") or {}).get("name", "?")
    engine = profile.engine
    return (f"{name:<22} {kind:<9} {device:<24} {model:<26} "
            f"{engine.num_gpu_blocks:>7,} KV blocks of {engine.block_size} tokens")


@click.command("profiles")
def profiles_command():
    """List the shipped profiles, one line each: name, source (measured/derived), hardware, model,
    KV blocks per worker."""
    from kvroute.sim.profile import shipped_profiles

    for name in shipped_profiles():
        click.echo(profile_line(name))
