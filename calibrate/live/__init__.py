"""kvroute.calibrate.live: the live vLLM client, stream, server control, metrics scrape and KV events."""
