"""kvroute.calibrate.vllm: the vLLM client (one stream reader, probe, /metrics) and server control."""
