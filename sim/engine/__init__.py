"""kvroute.sim.engine: The vLLM mirror: vLLM's scheduler, KV-cache manager and block pool, step for step."""
