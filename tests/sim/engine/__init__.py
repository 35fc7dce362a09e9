"""Tests of ``kvroute.sim.engine`` (the vLLM mirror), including parity with vLLM's own scheduler."""
