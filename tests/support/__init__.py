"""Helpers the tests share: drivers of the simulator, of vLLM's own scheduler and of ``kvroute validate``,
the per-block reference pool, the shared public traces and the paths of the repository."""
