"""An async client of one vLLM OpenAI-compatible server, for measuring.

- :meth:`VllmClient.complete`: a streaming ``/v1/completions`` request whose prompt is a list of
  token ids (prefix sharing is exact), ``ignore_eos`` and ``max_tokens`` (exactly that many tokens
  come back), with the client-side arrival time of every streamed token and the usage block
  (prompt and cached prompt tokens).
- :meth:`VllmClient.probe`: the engine's settings and the server's identity from ``/v1/models``,
  ``/version``, ``/metrics`` (``vllm:cache_config_info``) and, where the server runs with
  ``VLLM_SERVER_DEV_MODE=1``, ``/server_info`` (scheduler settings and hardware).
- :func:`parse_prometheus`: Prometheus text format to samples; :class:`MetricsSnapshot` sums
  counters and histograms over engines and takes differences.

The streamed completions are read with plain asyncio streams (see :func:`stream_completion`);
the other endpoints use ``httpx``, imported inside functions so importing this module stays cheap.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import MISSING, asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from kvroute.sim.inputs import (BLOCK_SIZE, COUNT, FRACTION, POSITIVE_INT, TOKENS, InputError, check_fields,
                                describe)

SERVER_INFO_SCHEMA = {
    "max_model_len": TOKENS,
    "block_size": BLOCK_SIZE,
    "num_gpu_blocks": COUNT,
    "max_num_batched_tokens": POSITIVE_INT,
    "max_num_seqs": POSITIVE_INT,
    "long_prefill_token_threshold": COUNT,
    "gpu_memory_utilization": FRACTION,
}
"""Rules of the engine settings a server reports (checked in ``ServerInfo``)."""


class CalibrationError(RuntimeError):
    """A measurement cannot go on: one clear message naming the server and the cause."""


# --------------------------------------------------------------------------------------------
# Prometheus text format
# --------------------------------------------------------------------------------------------

def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Parse Prometheus text exposition into ``(name, labels, value)`` samples, in page order.

    Parsed by ``prometheus_client.parser`` (the Prometheus project's own client). Comment lines
    (``# HELP``, ``# TYPE``) give no sample; on a page with a malformed line, the page is parsed
    line by line and the malformed lines are skipped. Values such as ``+Inf`` and ``NaN`` become
    floats; timestamps are dropped.
    """
    from prometheus_client.parser import text_string_to_metric_families

    def samples_of(page: str) -> list[tuple[str, dict[str, str], float]]:
        return [(s.name, dict(s.labels), float(s.value))
                for family in text_string_to_metric_families(page) for s in family.samples]

    try:
        return samples_of(text)
    except ValueError:
        pass
    samples = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                samples += samples_of(line.strip() + "\n")
            except ValueError:
                continue
    return samples


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """Counters and histogram sums/counts of one ``/metrics`` scrape, summed over label sets
    (engines), plus the labels of every ``*_info`` gauge.

    Attributes:
        values: ``name -> value`` for counters (``*_total``), histogram ``*_sum`` and ``*_count``
            and gauges; each summed over label sets except ``le`` buckets, which are dropped.
        info: ``name -> labels`` of the first sample of each ``*_info`` metric.
        taken_at: ``time.perf_counter()`` when the scrape finished, s.
    """

    values: dict[str, float]
    info: dict[str, dict[str, str]]
    taken_at: float = 0.0

    @classmethod
    def from_text(cls, text: str, taken_at: float = 0.0) -> "MetricsSnapshot":
        """Build from the text of a ``/metrics`` response."""
        values: dict[str, float] = {}
        info: dict[str, dict[str, str]] = {}
        for name, labels, value in parse_prometheus(text):
            if name.endswith("_bucket"):
                continue
            if name.endswith("_info"):
                info.setdefault(name, labels)
                continue
            if name.endswith("_created"):
                continue
            values[name] = values.get(name, 0.0) + value
        return cls(values, info, taken_at)

    def get(self, name: str, default: float = math.nan) -> float:
        """A summed value, or ``default`` when the server does not export it."""
        return self.values.get(name, default)

    def delta(self, earlier: "MetricsSnapshot", name: str) -> float:
        """``self[name] - earlier[name]``; NaN if either scrape lacks the metric."""
        return self.get(name) - earlier.get(name)


# --------------------------------------------------------------------------------------------
# Server identity and engine settings
# --------------------------------------------------------------------------------------------

#: vLLM 0.32 defaults for ``vllm serve`` (engine/arg_utils.py: get_batch_defaults), used only
#: when ``/server_info`` is unavailable: CPU backend 2048 / 128; GPUs under 70 GiB 2048 / 256.
CPU_BATCH_DEFAULTS = (2048, 128)
GPU_BATCH_DEFAULTS = (2048, 256)


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What a server says about itself.

    Attributes:
        url: base URL.
        model: served model name used in requests.
        model_root: the model path or id the server loaded (``root`` in ``/v1/models``).
        served_models: every name the server serves.
        vllm_version: from ``/version``.
        max_model_len: longest sequence (prompt + output), tokens.
        block_size: KV block size, tokens.
        num_gpu_blocks: KV blocks (vLLM counts block 0, which is reserved).
        enable_prefix_caching: whether the engine caches prefixes.
        max_num_batched_tokens: step token budget.
        max_num_seqs: most running requests.
        long_prefill_token_threshold: prefill chunk cap when requests compete (0: off).
        gpu_memory_utilization: vLLM's flag as the engine reports it.
        hardware: a one-line description (GPU models, or the CPU model name and core count).
        device: ``"cuda"``, ``"cpu"`` or what the server reports.
        dev_mode: whether ``/server_info`` answered (``VLLM_SERVER_DEV_MODE=1``).
        sources: where each engine setting came from.
    """

    url: str
    model: str
    model_root: str
    served_models: tuple[str, ...]
    vllm_version: str
    max_model_len: int
    block_size: int
    num_gpu_blocks: int
    enable_prefix_caching: bool
    max_num_batched_tokens: int
    max_num_seqs: int
    long_prefill_token_threshold: int = 0
    gpu_memory_utilization: float | None = None
    hardware: str = "unknown"
    device: str = "unknown"
    dev_mode: bool = False
    sources: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Check the engine settings once, where they enter (a server's answer or a meta.json).

        Raises:
            InputError (a ValueError): naming the server and the field.
        """
        values = {name: getattr(self, name) for name in SERVER_INFO_SCHEMA}
        check_fields(values, SERVER_INFO_SCHEMA, self.url,
                     required=tuple(k for k in SERVER_INFO_SCHEMA if k != "gpu_memory_utilization"))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        d = asdict(self)
        d["served_models"] = list(self.served_models)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "<dict>") -> "ServerInfo":
        """Inverse of :meth:`to_dict`.

        Raises:
            InputError (a ValueError): ``d`` is not an object, a field is missing or invalid;
                the message names ``where`` (or the server) and the field.
        """
        if type(d) is not dict:
            raise InputError(f"a server entry is a JSON object, got {describe(d)}", where)
        d = dict(d)
        d["served_models"] = tuple(d.get("served_models") or ())
        missing = [k for k, f in cls.__dataclass_fields__.items()
                   if k not in d and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise InputError("required field missing", where, None, missing[0])
        try:
            return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})
        except InputError as exc:
            raise InputError(exc.reason, where, None, exc.field) from None


def _hardware_from_system_env(env: dict[str, Any]) -> tuple[str, str]:
    gpus = env.get("nvidia_gpu_models") or env.get("intel_gpu_models")
    if gpus:
        models = [re.sub(r"^GPU \d+:\s*", "", l).split(" (UUID")[0].strip() for l in str(gpus).splitlines()]
        models = [m for m in models if m]
        if models:
            uniq = sorted(set(models))
            return (", ".join(f"{models.count(m)} x {m}" for m in uniq), "cuda")
    cpu = str(env.get("cpu_info") or "")
    name = re.search(r"Model name:\s*(.+)", cpu)
    cores = re.search(r"^CPU\(s\):\s*(\d+)", cpu, re.M)
    if name:
        return (f"CPU {name.group(1).strip()} ({cores.group(1) if cores else '?'} cores)", "cpu")
    return ("unknown", "unknown")


# --------------------------------------------------------------------------------------------
# Streaming results
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class StreamResult:
    """One streamed completion as the client saw it.

    Attributes:
        t_send: ``time.perf_counter()`` just before the request was sent, s.
        token_times: arrival time of every output token, s after ``t_send`` (a chunk carrying
            k tokens contributes k equal times).
        prompt_tokens: prompt length the server counted.
        cached_tokens: prompt tokens served from the prefix cache (None if not reported).
        completion_tokens: output tokens the server counted.
        t_done: end of the stream, s after ``t_send``.
        error: the server's error message (or ``"measurement error: ..."`` for a usage block
            that fails its checks), or None.
        status: HTTP status.
        warning: set when usage and the streamed chunks disagree on the token count.
    """

    t_send: float
    token_times: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    t_done: float = math.nan
    error: str | None = None
    status: int = 0
    warning: str | None = None

    @property
    def ttft(self) -> float:
        """Time to the first token, s (NaN when none came)."""
        return self.token_times[0] if self.token_times else math.nan


USAGE_SCHEMA = {"prompt_tokens": COUNT, "completion_tokens": COUNT}
"""Rules of a streamed ``usage`` block (``prompt_tokens_details.cached_tokens`` is a COUNT too)."""


class StreamEvents:
    """The one reader of a completion stream's events, for calibration and replay alike.

    Rules of ``vllm bench serve`` (``vllm/benchmarks/lib/endpoint_request_func.py:
    async_request_openai_completions``): a chunk counts as output only when it carries content
    (token ids, or non-empty ``text`` for a server that sends no ids), so an empty first chunk is
    not the first token; the token count is the usage block's ``completion_tokens`` when the
    server sends one, with :attr:`warning` set when it disagrees with the tokens counted in the
    chunks. The usage block is checked (ints >= 0); a bad one is kept as :attr:`usage_error` and
    its figures as None, so what was measured is not thrown away.

    Attributes:
        url: the server, for messages.
        counted: output tokens counted in the chunks.
        token_ids: the ids received, or None once a chunk with content came without ids.
        prompt_tokens, completion_tokens, cached_tokens: the usage block's figures, or None.
        error: an error event's message, or None.
        usage_error: why the usage block was rejected, or None.
        done: ``[DONE]`` was received.
    """

    __slots__ = ("url", "counted", "token_ids", "prompt_tokens", "completion_tokens", "cached_tokens",
                 "error", "usage_error", "done")

    def __init__(self, url: str) -> None:
        self.url = url
        self.counted = 0
        self.token_ids: list[int] | None = []
        self.prompt_tokens = self.completion_tokens = self.cached_tokens = None
        self.error: str | None = None
        self.usage_error: str | None = None
        self.done = False

    def feed(self, data: bytes) -> tuple[int, list[int] | None]:
        """Apply one event's payload; returns ``(tokens it carried, their ids or None)``.

        Raises:
            ValueError: the payload is not JSON or not an object (the server is broken).
        """
        if data == b"[DONE]":
            self.done = True
            return 0, None
        chunk = json.loads(data)
        if type(chunk) is not dict:
            raise ValueError(f"a stream event is {describe(chunk)}, expected a JSON object")
        if "error" in chunk:
            self.error = _error_message(data)
        n, ids_out = 0, []
        for choice in chunk.get("choices") or ():
            ids = choice.get("token_ids") if type(choice) is dict else None
            if type(ids) is list and ids:
                n += len(ids)
                ids_out.extend(int(i) for i in ids)
            elif type(choice) is dict and choice.get("text"):  # content without ids: one token
                n += 1
                ids_out = None
        if n:
            self.counted += n
            if ids_out is None or self.token_ids is None:
                self.token_ids = None
            else:
                self.token_ids.extend(ids_out)
        usage = chunk.get("usage")
        if usage:
            self._usage(usage)
        return n, ids_out

    def _usage(self, usage: object) -> None:
        try:
            figures = check_fields(usage, USAGE_SCHEMA, self.url, prefix="usage.")
            details = usage.get("prompt_tokens_details") or {}
            cached = check_fields(details, {"cached_tokens": COUNT}, self.url,
                                  prefix="usage.prompt_tokens_details.")
        except InputError as exc:
            self.usage_error = str(exc)
            return
        self.prompt_tokens = figures.get("prompt_tokens")
        self.completion_tokens = figures.get("completion_tokens")
        self.cached_tokens = cached.get("cached_tokens")

    @property
    def num_tokens(self) -> int:
        """Output tokens: the usage block's count when given, else the tokens counted."""
        return self.counted if self.completion_tokens is None else self.completion_tokens

    @property
    def warning(self) -> str | None:
        """Set when the usage block's token count differs from the tokens counted in the chunks."""
        if self.completion_tokens is None or self.completion_tokens == self.counted:
            return None
        return (f"{self.url}: usage says {self.completion_tokens} completion tokens but "
                f"{self.counted} came in the stream's chunks; using the usage count")


def _error_message(body: bytes | str) -> str:
    try:
        doc = json.loads(body)
        err = doc.get("error", doc)
        return str(err.get("message", err) if isinstance(err, dict) else err)
    except (ValueError, AttributeError):
        return (body.decode(errors="replace") if isinstance(body, bytes) else body)[:500]


class VllmClient:
    """Async client of one vLLM server.

    Args:
        url: base URL, e.g. ``http://127.0.0.1:8100``.
        model: served model name; None: the server's only model (see :meth:`probe`).
        timeout_s: per-request timeout, s.

    Use as ``async with VllmClient(url) as c: info = await c.probe()``.
    """

    def __init__(self, url: str, model: str | None = None, timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self._http = None

    async def __aenter__(self) -> "VllmClient":
        import httpx

        limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
        self._http = httpx.AsyncClient(base_url=self.url, timeout=self.timeout_s, limits=limits)
        return self

    async def __aexit__(self, *exc) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def _get(self, path: str, **params):
        import httpx

        try:
            return await self._http.get(path, params=params or None)
        except httpx.TransportError as exc:
            raise CalibrationError(
                f"cannot reach the vLLM server at {self.url}: {type(exc).__name__}: {exc or 'no answer'}"
            ) from exc

    async def metrics(self) -> MetricsSnapshot:
        """Scrape ``/metrics``.

        Raises:
            CalibrationError: the server is unreachable.
        """
        resp = await self._get("/metrics")
        resp.raise_for_status()
        return MetricsSnapshot.from_text(resp.text, time.perf_counter())

    async def reset_prefix_cache(self, attempts: int = 60, wait_s: float = 0.5) -> bool | None:
        """``POST /reset_prefix_cache`` until the engine reports success (needs dev mode).

        vLLM answers 200 with ``{"success": false}`` while a request still holds blocks, so the
        call is retried ``attempts`` times, ``wait_s`` apart.

        Returns:
            True if the cache was reset; False if the server refused (no
            ``VLLM_SERVER_DEV_MODE=1``: 404) or never succeeded; None if it is unreachable.
        """
        import asyncio

        import httpx

        for _ in range(attempts):
            try:
                resp = await self._http.post("/reset_prefix_cache")
            except httpx.TransportError:
                return None
            if resp.status_code != 200:
                return False
            try:
                ok = bool(resp.json().get("success", True))
            except ValueError:  # older servers answer 200 with an empty body
                ok = True
            if ok:
                return True
            await asyncio.sleep(wait_s)
        return False

    async def probe(self) -> ServerInfo:
        """Identify the server and read its engine settings.

        Sets :attr:`model` to the server's model when it was None.

        Raises:
            CalibrationError: unreachable server; a model name the server does not serve (the
                message lists what it serves); a server serving several models with none chosen;
                an answer that is not what vLLM sends (bad JSON, wrong types, settings out of
                range), naming the server.
        """
        try:
            return await self._probe()
        except InputError as exc:
            raise CalibrationError(str(exc)) from None
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise CalibrationError(f"{self.url}: its answer is not what a vLLM server sends "
                                   f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None

    async def _probe(self) -> ServerInfo:
        resp = await self._get("/v1/models")
        if resp.status_code != 200:
            raise CalibrationError(f"{self.url}/v1/models answered {resp.status_code}: {_error_message(resp.content)}")
        models = resp.json().get("data", [])
        names = tuple(m["id"] for m in models)
        if self.model is None:
            if len(names) != 1:
                raise CalibrationError(f"{self.url} serves {len(names)} models {list(names)}; choose one with --model")
            self.model = names[0]
        if self.model not in names:
            raise CalibrationError(
                f"the server at {self.url} does not serve model {self.model!r}; it serves: {', '.join(names)}"
            )
        entry = next(m for m in models if m["id"] == self.model)
        sources: dict[str, str] = {}
        version = "unknown"
        vresp = await self._get("/version")
        if vresp.status_code == 200:
            version = str(vresp.json().get("version", "unknown"))
        snap = await self.metrics()
        cache = snap.info.get("vllm:cache_config_info", {})
        if not cache:
            raise CalibrationError(f"{self.url}/metrics has no vllm:cache_config_info; is this a vLLM v1 server?")
        block_size = int(cache.get("block_size", "0") or 0)
        num_blocks = int(cache.get("num_gpu_blocks", "0") or 0)
        prefix = cache.get("enable_prefix_caching", "True") == "True"
        util = cache.get("gpu_memory_utilization")
        for k in ("block_size", "num_gpu_blocks", "enable_prefix_caching", "gpu_memory_utilization"):
            sources[k] = f"{self.url}/metrics vllm:cache_config_info"
        max_model_len = int(entry.get("max_model_len") or 0)
        sources["max_model_len"] = f"{self.url}/v1/models max_model_len"
        hardware, device = "unknown", "unknown"
        sched: dict[str, Any] = {}
        dev_mode = False
        sresp = await self._get("/server_info", config_format="json")
        if sresp.status_code == 200:
            dev_mode = True
            doc = sresp.json()
            cfg = doc.get("vllm_config", {})
            if isinstance(cfg, dict):
                sched = cfg.get("scheduler_config", {}) or {}
                device = str((cfg.get("device_config") or {}).get("device_type") or device)
            hardware, dev2 = _hardware_from_system_env(doc.get("system_env", {}) or {})
            device = device if device != "unknown" else dev2
        if sched:
            mnbt, mns = int(sched["max_num_batched_tokens"]), int(sched["max_num_seqs"])
            lptt = int(sched.get("long_prefill_token_threshold") or 0)
            for k in ("max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold"):
                sources[k] = f"{self.url}/server_info scheduler_config"
            sources["hardware"] = f"{self.url}/server_info system_env"
        else:
            mnbt, mns = CPU_BATCH_DEFAULTS if device == "cpu" else GPU_BATCH_DEFAULTS
            lptt = 0
            note = "vLLM 0.32 vllm-serve default (engine/arg_utils.py: get_batch_defaults); /server_info unavailable"
            for k in ("max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold"):
                sources[k] = note
        return ServerInfo(
            url=self.url,
            model=self.model,
            model_root=str(entry.get("root") or self.model),
            served_models=names,
            vllm_version=version,
            max_model_len=max_model_len,
            block_size=block_size,
            num_gpu_blocks=num_blocks,
            enable_prefix_caching=prefix,
            max_num_batched_tokens=mnbt,
            max_num_seqs=mns,
            long_prefill_token_threshold=lptt,
            gpu_memory_utilization=float(util) if util not in (None, "None") else None,
            hardware=hardware,
            device=device,
            dev_mode=dev_mode,
            sources=sources,
        )

    async def complete(
        self, prompt: Sequence[int], max_tokens: int, on_token: Callable[[int], None] | None = None
    ) -> StreamResult:
        """Stream one completion of a token-id prompt; exactly ``max_tokens`` tokens come back.

        The stream is read with plain asyncio streams rather than httpx: on a small machine the
        client shares cores with the API server, and httpx's per-chunk cost (about ten times
        this reader's) visibly slowed the server it was measuring.

        Args:
            prompt: prompt token ids.
            max_tokens: output tokens (``ignore_eos`` is set).
            on_token: called with the number of tokens received so far, after each chunk.

        Returns:
            The stream's timings and usage; a server-side rejection (HTTP 4xx/5xx) is returned
            in ``error`` and ``status``, not raised.

        Raises:
            CalibrationError: the server is unreachable or the connection broke.
        """
        body = {
            "model": self.model,
            "prompt": [int(t) for t in prompt],
            "max_tokens": int(max_tokens),
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        return await stream_completion(self.url, body, self.timeout_s, on_token)


class CompletionStream:
    """One streamed ``POST /v1/completions`` over plain asyncio (HTTP/1.1, server-sent events).

    A hand-written reader rather than httpx: at vLLM's decode speed httpx took about half a
    core, slowing the server it measured. The caller owns the timeout and maps errors (``open``
    and the iterators raise OSError, asyncio.IncompleteReadError or ValueError).

    Attributes:
        status: the HTTP status, after ``open``.
        t_send: ``time.perf_counter()`` when the request was written.
    """

    def __init__(self, url: str, body: dict) -> None:
        self.url = url
        self._parts = urlsplit(url)
        self._payload = json.dumps(body).encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._chunked = False
        self.status = 0
        self.t_send = time.perf_counter()

    async def open(self) -> int:
        """Connect, send the request, read the status line and headers; returns the status."""
        parts = self._parts
        host = parts.hostname or "127.0.0.1"
        port = parts.port or (443 if parts.scheme == "https" else 80)
        head = (
            f"POST {parts.path.rstrip('/')}/v1/completions HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(self._payload)}\r\nConnection: close\r\n\r\n"
        ).encode()
        self._reader, self._writer = await asyncio.open_connection(
            host, port, ssl=(parts.scheme == "https") or None
        )
        self.t_send = time.perf_counter()
        self._writer.write(head + self._payload)
        await self._writer.drain()
        status_line = await self._reader.readline()
        if not status_line:
            raise ConnectionResetError("the server closed the connection without answering")
        self.status = int(status_line.split()[1])
        while True:
            line = await self._reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            self._chunked |= k.strip().lower() == "transfer-encoding" and "chunked" in v.lower()
        return self.status

    async def _chunks(self):
        reader = self._reader
        while True:
            if self._chunked:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    return
                yield (await reader.readexactly(size + 2))[:-2]
            else:
                data = await reader.read(65536)
                if not data:
                    return
                yield data

    async def body(self) -> bytes:
        """The rest of the response body (an error answer)."""
        return b"".join([data async for data in self._chunks()])

    async def events(self):
        """Yield ``(perf_counter at arrival, payload)`` for every ``data:`` event, in order."""
        buf = b""
        async for data in self._chunks():
            now = time.perf_counter()
            buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                event = event.strip()
                if event.startswith(b"data:"):
                    yield now, event[5:].strip()

    def close(self) -> None:
        """Close the connection (safe to call more than once)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


async def stream_completion(
    url: str, body: dict, timeout_s: float = 600.0, on_token: Callable[[int], None] | None = None
) -> StreamResult:
    """POST ``body`` to ``url``/v1/completions and read the server-sent events.

    Returns:
        A :class:`StreamResult` (token arrival times relative to the send).

    Raises:
        CalibrationError: connection refused, reset or timed out.
    """
    res = StreamResult(t_send=time.perf_counter())
    conn = CompletionStream(url, body)
    try:
        async with asyncio.timeout(timeout_s):
            res.status = await conn.open()
            res.t_send = conn.t_send
            if res.status != 200:
                res.error = _error_message(await conn.body()) or f"HTTP {res.status}"
            else:
                times = res.token_times
                events = StreamEvents(url)
                async for t, data_s in conn.events():
                    n, _ = events.feed(data_s)
                    if events.done:
                        break
                    if n:
                        times.extend([t - res.t_send] * n)
                        if on_token is not None:
                            on_token(len(times))
                if not events.done and events.error is None:
                    raise ConnectionResetError(f"the stream ended before [DONE], after {len(times)} tokens")
                res.error = events.error or (None if events.usage_error is None
                                             else f"measurement error: {events.usage_error}")
                res.prompt_tokens, res.completion_tokens = events.prompt_tokens, events.completion_tokens
                res.cached_tokens, res.warning = events.cached_tokens, events.warning
    except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
        raise CalibrationError(
            f"lost the vLLM server at {url}: {type(exc).__name__}: {exc or 'no answer'}"
        ) from exc
    finally:
        conn.close()
    res.t_done = time.perf_counter() - res.t_send
    return res
