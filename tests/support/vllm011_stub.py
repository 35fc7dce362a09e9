"""A stand-in for a vLLM 0.11.0 OpenAI server on a GPU, with 0.11's response shapes (aiohttp, on a
background thread), for the end-to-end tests of ``calibrate measure`` and ``validate`` against the
oldest release the live path supports (issue 33).

What it answers as vLLM 0.11.0 does (read from the 0.11.0 wheel):

- ``/version``: ``{"version": "0.11.0"}``.
- ``/server_info?config_format=json`` (``VLLM_SERVER_DEV_MODE=1``): ``{"vllm_config": {...}}`` and
  nothing else: no ``system_env`` (``entrypoints/openai/api_server.py: show_server_info``), so the
  hardware is unknown; the scheduler settings are 0.11's GPU defaults (2048 / 256, sync scheduling).
- ``/metrics``: ``vllm:cache_config_info`` with block size 16 and utilisation 0.9, the load gauges,
  the prefix-cache counters and the request histograms (``v1/metrics/loggers.py``).
- ``POST /reset_prefix_cache``: 200 with an empty body whether or not the engine reset; the engine
  refuses while a request holds blocks (``v1/core/block_pool.py: reset_prefix_cache``), and so
  does this stub, while a completion streams.
- ``POST /v1/completions`` (streamed, ``return_token_ids``): chunks with ``token_ids``, then a usage
  chunk whose ``prompt_tokens_details`` is left out when the hit is 0
  (``serving_completion.py``: ``if self.enable_prompt_tokens_details and num_cached_tokens``).
- KV-cache events (optional ``kv_events`` ZeroMQ endpoint): each completion's stored blocks as
  one batch ``[ts, [[tag, fields...], ...], 0]``, events as arrays (``array_like=True``), stamped
  when the blocks are scheduled (0.11.0 publishes in ``Scheduler.schedule``), before the
  "step" runs.

The prefix cache and block hashes are the router's (``chained_block_hashes``), full blocks only,
never evicted; token ids of replies are a function of the prompt, so replays are repeatable.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

from kvroute.calibrate.live.prompts import chained_block_hashes

BLOCK = 16
"""vLLM 0.11's default block size on GPUs."""


class Vllm011Stub:
    """The stub server; ``url`` once constructed, :meth:`close` to stop it.

    Args:
        model: served model name.
        max_model_len: the model's longest sequence, tokens.
        token_delay_s: time between streamed tokens, s.
        prefill_s_per_token: time before the first token per uncached prompt token, s.
        kv_events: a ZeroMQ endpoint to publish KV-cache events on (``ipc://...``), or None.
        prompt_tokens_details: whether the server runs with ``--enable-prompt-tokens-details``.
    """

    def __init__(self, model: str = "Qwen/Qwen2.5-7B-Instruct", max_model_len: int = 32768,
                 token_delay_s: float = 0.0002, prefill_s_per_token: float = 1e-7, kv_events: str | None = None,
                 prompt_tokens_details: bool = True) -> None:
        self.model, self.max_model_len = model, max_model_len
        self.token_delay_s, self.prefill_s_per_token = token_delay_s, prefill_s_per_token
        self.kv_events, self.details = kv_events, prompt_tokens_details
        self.cache: dict[int, int] = {}  # router hash of a cached block -> its vLLM-side hash
        self.running = self.waiting = 0
        self.counters = dict(queries=0, hits=0, prompt=0, generation=0, success=0, cpu=0.0)
        self.hist = {name: [0.0, 0] for name in ("request_queue_time_seconds", "request_prefill_time_seconds",
                                                 "request_decode_time_seconds", "time_to_first_token_seconds",
                                                 "inter_token_latency_seconds", "e2e_request_latency_seconds")}
        self.resets = {"done": 0, "refused": 0}
        self.log: list[str] = []
        self._pub = None
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("the vLLM 0.11 stub did not start")

    @property
    def url(self) -> str:
        """Base URL."""
        return f"http://127.0.0.1:{self.port}"

    # -- server ---------------------------------------------------------------------------------

    def _main(self) -> None:
        from aiohttp import web

        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/version", self._version)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/server_info", self._server_info)
        app.router.add_post("/reset_prefix_cache", self._reset)
        app.router.add_post("/v1/completions", self._complete)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        if self.kv_events:
            import zmq

            self._ctx = zmq.Context()
            self._pub = self._ctx.socket(zmq.PUB)
            self._pub.bind(self.kv_events)
        self._ready.set()
        self._loop.run_forever()

    def close(self) -> None:
        """Stop the server and its thread."""
        async def stop():
            await self._runner.cleanup()
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(stop(), self._loop)
        self._thread.join(10)
        if self._pub is not None:
            self._pub.close(linger=0)
            self._ctx.term()

    async def _version(self, request):
        from aiohttp import web

        return web.json_response({"version": "0.11.0"})

    async def _health(self, request):
        from aiohttp import web

        return web.Response(status=200)

    async def _models(self, request):
        from aiohttp import web

        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": 0, "owned_by": "vllm", "root": self.model,
             "parent": None, "max_model_len": self.max_model_len, "permission": []}]})

    async def _server_info(self, request):
        from aiohttp import web

        sched = {"runner_type": "generate", "max_num_batched_tokens": 2048, "max_num_seqs": 256,
                 "max_model_len": self.max_model_len, "max_num_partial_prefills": 1,
                 "long_prefill_token_threshold": 0, "enable_chunked_prefill": True, "async_scheduling": False}
        config = {"model_config": {"model": self.model, "max_model_len": self.max_model_len},
                  "cache_config": {"block_size": BLOCK, "gpu_memory_utilization": 0.9, "enable_prefix_caching": True},
                  "scheduler_config": sched, "device_config": {"device": "cuda"}}
        if request.query.get("config_format") == "json":
            return web.json_response({"vllm_config": config})
        return web.json_response({"vllm_config": str(config)})

    async def _metrics(self, request):
        from aiohttp import web

        labels = f'engine="0",model_name="{self.model}"'
        c = self.counters
        lines = [
            f'vllm:cache_config_info{{block_size="{BLOCK}",cache_dtype="auto",enable_prefix_caching="True",'
            f'engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="65536",num_cpu_blocks="None"}} 1.0',
            f"vllm:num_requests_running{{{labels}}} {self.running}",
            f"vllm:num_requests_waiting{{{labels}}} {self.waiting}",
            f"vllm:kv_cache_usage_perc{{{labels}}} {min(1.0, self.running / 1000):g}",
            f"vllm:prefix_cache_queries_total{{{labels}}} {c['queries']}",
            f"vllm:prefix_cache_hits_total{{{labels}}} {c['hits']}",
            f"vllm:num_preemptions_total{{{labels}}} 0",
            f"vllm:prompt_tokens_total{{{labels}}} {c['prompt']}",
            f"vllm:generation_tokens_total{{{labels}}} {c['generation']}",
            f'vllm:request_success_total{{finished_reason="length",{labels}}} {c["success"]}',
            f"process_cpu_seconds_total {c['cpu']}",
        ]
        for name, (total, count) in self.hist.items():
            lines += [f"vllm:{name}_sum{{{labels}}} {total}", f"vllm:{name}_count{{{labels}}} {count}"]
        self.counters["cpu"] += 0.0078125  # a scrape's own API CPU time (a power of two: exact sums)
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def _reset(self, request):
        from aiohttp import web

        if self.running or self.waiting:  # the engine refuses; 0.11's API server answers 200 regardless
            self.resets["refused"] += 1
        else:
            self.cache.clear()
            self.resets["done"] += 1
        self.log.append("reset")
        return web.Response(status=200)

    # -- completions ----------------------------------------------------------------------------

    def _publish(self, stored: list[tuple[list[int], int | None, list[int]]]) -> None:
        if self._pub is None or not stored:
            return
        import msgspec

        events = [["BlockStored", hashes, parent, tokens, BLOCK, None, "GPU"] for hashes, parent, tokens in stored]
        self._pub.send_multipart([b"", (0).to_bytes(8, "big"), msgspec.msgpack.encode([time.time(), events, 0])])

    async def _complete(self, request):
        from aiohttp import web

        req = await request.json()
        if req.get("model") != self.model:
            return web.json_response({"object": "error", "message": f"The model `{req.get('model')}` does not exist.",
                                      "type": "NotFoundError", "param": None, "code": 404}, status=404)
        prompt = [int(t) for t in req["prompt"]]
        n, max_tokens = len(prompt), int(req["max_tokens"])
        if n + max_tokens > self.max_model_len:
            return web.json_response({"object": "error", "message": (
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{n + max_tokens} tokens ({n} in the messages, {max_tokens} in the completion)."),
                "type": "BadRequestError", "param": None, "code": 400}, status=400)
        self.log.append("completion")
        self.running += 1
        try:
            hashes = chained_block_hashes(prompt, BLOCK)
            hit = 0
            for h in hashes[: (n - 1) // BLOCK]:
                if h not in self.cache:
                    break
                hit += 1
            cached = hit * BLOCK
            stored, parent = [], (self.cache[hashes[hit - 1]] if hit else None)
            for k in range(hit, len(hashes)):
                vh = hashes[k] ^ 0x5EED  # the engine's own hash of the block, unlike the router's
                if hashes[k] not in self.cache:
                    self.cache[hashes[k]] = vh
                    stored.append(([vh], parent, prompt[k * BLOCK:(k + 1) * BLOCK]))
                parent = self.cache[hashes[k]]
            t0 = time.perf_counter()
            self._publish(stored)  # 0.11.0: stamped when the step is scheduled, before it runs
            await asyncio.sleep(self.prefill_s_per_token * (n - cached))
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            first = time.perf_counter()
            for i in range(max_tokens):
                tok = 100 + (prompt[-1] * 31 + i * 7 + n) % 900
                chunk = {"id": "cmpl-stub", "object": "text_completion", "created": 0, "model": self.model,
                         "choices": [{"index": 0, "text": "x", "logprobs": None,
                                      "finish_reason": "length" if i == max_tokens - 1 else None,
                                      "stop_reason": None, "token_ids": [tok]}]}
                if i == 0:
                    chunk["choices"][0]["prompt_token_ids"] = prompt
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                if i < max_tokens - 1:
                    await asyncio.sleep(self.token_delay_s)
            last = time.perf_counter()
            usage = {"prompt_tokens": n, "total_tokens": n + max_tokens, "completion_tokens": max_tokens}
            if self.details and cached:  # 0.11 leaves the details out for a zero hit
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            final = {"id": "cmpl-stub", "object": "text_completion", "created": 0, "model": self.model,
                     "choices": [], "usage": usage}
            c = self.counters
            c["queries"] += n
            c["hits"] += cached
            c["prompt"] += n
            c["generation"] += max_tokens
            c["success"] += 1
            c["cpu"] += 0.001953125
            for name, value in (("request_queue_time_seconds", 0.0), ("request_prefill_time_seconds", first - t0),
                                ("request_decode_time_seconds", last - first),
                                ("time_to_first_token_seconds", first - t0),
                                ("e2e_request_latency_seconds", last - t0)):
                self.hist[name][0] += value
                self.hist[name][1] += 1
            if max_tokens > 1:
                self.hist["inter_token_latency_seconds"][0] += last - first
                self.hist["inter_token_latency_seconds"][1] += max_tokens - 1
        finally:
            self.running -= 1
        await resp.write(b"data: " + json.dumps(final).encode() + b"\n\ndata: [DONE]\n\n")
        await resp.write_eof()
        return resp
