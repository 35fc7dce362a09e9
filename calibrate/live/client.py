"""An async client of one vLLM OpenAI-compatible server, for measuring.

- :meth:`VllmClient.complete`: a streaming ``/v1/completions`` request whose prompt is a list of
  token ids (prefix sharing is exact), ``ignore_eos`` and ``max_tokens`` (so that many tokens are
  asked for; a usage count that disagrees with the stream is flagged), with the client-side
  arrival time of every streamed token and the usage block (prompt and cached prompt tokens).
- :meth:`VllmClient.probe`: the engine's settings and the server's identity from ``/v1/models``,
  ``/version``, ``/metrics`` (``vllm:cache_config_info``) and, where the server runs with
  ``VLLM_SERVER_DEV_MODE=1``, ``/server_info`` (scheduler settings and hardware).
- :func:`parse_prometheus`: Prometheus text format to samples; :class:`MetricsSnapshot` sums
  counters and histograms over engines and takes differences.

Every request goes through aiohttp (imported inside functions, so importing this module stays
cheap); the streams are read by :mod:`kvroute.calibrate.live.stream`, the reader replay uses too.
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

from kvroute.calibrate.live.server_features import unmodeled_features
from kvroute.calibrate.live.stream import StreamLost, error_message, new_session, read_completion
from kvroute.traces.inputs import (BLOCK_SIZE, COUNT, FRACTION, POSITIVE_INT, TOKENS, InputError, check_fields,
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


class ServerUnreachable(CalibrationError):
    """No answer from a server: connection refused or broken, or none within the time limit."""


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


KV_BLOCKS_TOLERANCE = 0.02
"""Most relative difference between two servers' KV blocks that one calibration takes: GPU
servers started one after another still differ a little (what each one's memory profiling
found); more is a different KV cache."""


def kv_blocks_alike(a: int, b: int) -> bool:
    """Whether KV caches of ``a`` and ``b`` blocks are one size within :data:`KV_BLOCKS_TOLERANCE`."""
    return abs(a - b) <= KV_BLOCKS_TOLERANCE * max(a, b)


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
        async_scheduling: whether the engine schedules asynchronously (``/server_info``'s
            ``scheduler_config.async_scheduling``; without it the release's default on the device,
            :func:`kvroute.sim.timing.vllm_versions.defaults`); None: not known.
        reports_cached_tokens: whether the server reports cached prompt tokens in the usage block
            (``--enable-prompt-tokens-details``), as a probe request found; None: not probed. A
            server that reports them leaves the field out for a zero hit through vLLM 0.23, so a
            missing field from it means 0.
        unmodeled: serving features the server runs that kvroute's engine does not model, one
            phrase each (:func:`kvroute.calibrate.live.server_features.unmodeled_features` of
            ``/server_info``'s config); ``()`` on vLLM's defaults or without ``/server_info``.
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
    async_scheduling: bool | None = None
    reports_cached_tokens: bool | None = None
    unmodeled: tuple[str, ...] = ()

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
        d["unmodeled"] = list(self.unmodeled)
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
        for flag in ("async_scheduling", "reports_cached_tokens", "dev_mode", "enable_prefix_caching"):
            if flag in d and d[flag] is not None and type(d[flag]) is not bool:
                raise InputError(f"expected true, false or null, got {describe(d[flag])}", where, None, flag)
        d["served_models"] = tuple(d.get("served_models") or ())
        unmodeled = d.get("unmodeled") or ()
        if type(unmodeled) not in (list, tuple) or not all(type(x) is str for x in unmodeled):
            raise InputError(f"expected a list of strings, got {describe(unmodeled)}", where, None, "unmodeled")
        d["unmodeled"] = tuple(unmodeled)
        missing = [k for k, f in cls.__dataclass_fields__.items()
                   if k not in d and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise InputError("required field missing", where, None, missing[0])
        try:
            return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})
        except InputError as exc:
            raise InputError(exc.reason, where, None, exc.field) from None


def _hardware_from_system_env(env: dict[str, Any], gpus_used: int | None = None) -> tuple[str, str]:
    """``(hardware, device)`` from ``/server_info``'s ``system_env``. Its GPU list is the host's
    (``nvidia-smi -L``, whatever ``CUDA_VISIBLE_DEVICES`` the server has), so ``gpus_used``
    (tensor x pipeline parallel size) names the server's own: ``"1 x NVIDIA RTX A6000"`` for one
    of four alike, ``"1 of 2 x A, 2 x B"`` where the host's differ."""
    gpus = env.get("nvidia_gpu_models") or env.get("intel_gpu_models")
    if gpus:
        models = [re.sub(r"^GPU \d+:\s*", "", l).split(" (UUID")[0].strip() for l in str(gpus).splitlines()]
        models = [m for m in models if m]
        if models:
            uniq = sorted(set(models))
            if gpus_used and gpus_used < len(models):
                if len(uniq) == 1:
                    return f"{gpus_used} x {uniq[0]}", "cuda"
                return f"{gpus_used} of " + ", ".join(f"{models.count(m)} x {m}" for m in uniq), "cuda"
            return (", ".join(f"{models.count(m)} x {m}" for m in uniq), "cuda")
    cpu = str(env.get("cpu_info") or "")
    name = re.search(r"Model name:\s*(.+)", cpu)
    cores = re.search(r"^CPU\(s\):\s*(\d+)", cpu, re.M)
    if name:
        return (f"CPU {name.group(1).strip()} ({cores.group(1) if cores else '?'} cores)", "cpu")
    return ("unknown", "unknown")


_BATCH_SETTINGS = ("max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold")
"""The scheduler's settings :meth:`VllmClient.probe` reads from ``/server_info`` (or defaults)."""


def _gpus_used(par: Any) -> int | None:
    """GPUs the server runs on (tensor x pipeline parallel size) from ``/server_info``'s
    ``parallel_config``; None when it does not say (not an object, or sizes that are not ints)."""
    if not isinstance(par, dict):
        return None
    sizes = [par.get("tensor_parallel_size") or 1, par.get("pipeline_parallel_size") or 1]
    return sizes[0] * sizes[1] if all(type(x) is int for x in sizes) else None


def _configured_device(dev_cfg: Any) -> str:
    """The device ``/server_info``'s ``device_config`` names (``"cuda"``, ``"cpu"``, ...;
    ``"unknown"`` when it names none or says ``"auto"``).

    Raises:
        AttributeError: ``dev_cfg`` is not an object.
    """
    # NOTE: device_type is init=False in 0.11's DeviceConfig; its device is torch.device(type)
    named = dev_cfg.get("device_type") or (dev_cfg.get("device") if dev_cfg.get("device") != "auto" else None)
    return str(named or "unknown").split(":")[0]


def _default_async_scheduling(version: str, device: str) -> tuple[bool, str]:
    """Whether vLLM ``version`` schedules asynchronously on ``device`` by default, and the
    source to record for it (for a server whose ``/server_info`` did not say)."""
    from kvroute.sim.timing.vllm_versions import defaults

    return defaults(version).async_scheduling(device), (
        f"vLLM {version}'s default on {device} (kvroute.sim.timing.vllm_versions; "
        "on CUDA from 0.14, never on the CPU backend); /server_info did not say")


# --------------------------------------------------------------------------------------------
# Streaming results
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class StreamResult:
    """One streamed completion as the client saw it.

    Attributes:
        t_send: ``time.perf_counter()`` when the request was written (after any connection
            set-up; see :attr:`kvroute.calibrate.live.stream.Stream.t_send`), s.
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

    @property
    def num_tokens(self) -> int:
        """Output tokens as ``vllm bench serve`` counts them: the usage block's count when the
        server sent one, else the tokens counted in the chunks."""
        return len(self.token_times) if self.completion_tokens is None else self.completion_tokens


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
        self.num_scrapes = 0  # /metrics requests sent (each costs the API process CPU time)
        self.reset_note = "not tried"  # how the last reset_prefix_cache call was decided
        self._session = None

    async def __aenter__(self) -> "VllmClient":
        self._session = new_session()
        return self

    async def __aexit__(self, *exc) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(self, method: str, path: str, **params) -> tuple[int, bytes]:
        """``(status, body)`` of one plain request.

        Raises:
            ServerUnreachable: the server is unreachable or did not answer within ``timeout_s``.
        """
        import aiohttp

        try:
            async with asyncio.timeout(self.timeout_s):
                async with self._session.request(method, f"{self.url}{path}", params=params or None) as resp:
                    return resp.status, await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ServerUnreachable(
                f"cannot reach the vLLM server at {self.url}: {type(exc).__name__}: "
                f"{' '.join(str(exc).split()) or 'no answer'}"
            ) from exc

    async def metrics(self) -> MetricsSnapshot:
        """Scrape ``/metrics``.

        Raises:
            CalibrationError: the server is unreachable or answers with an error status.
        """
        self.num_scrapes += 1
        status, body = await self._request("GET", "/metrics")
        if status != 200:
            raise CalibrationError(f"{self.url}/metrics answered {status}: {error_message(body)}")
        return MetricsSnapshot.from_text(body.decode(errors="replace"), time.perf_counter())

    async def reset_prefix_cache(self, attempts: int = 60, wait_s: float = 0.5) -> bool | None:
        """``POST /reset_prefix_cache`` until the engine has reset (needs dev mode).

        The engine refuses while a request still holds blocks (``v1/core/block_pool.py:
        reset_prefix_cache``), so the call is retried ``attempts`` times, ``wait_s`` apart. From
        vLLM 0.26 the answer says whether it reset (``{"success": false}`` when refused); through
        0.25 it is 200 with an empty body either way, so such an answer counts as a reset only
        when ``/metrics`` shows the engine idle (no request running or waiting), the one state in
        which the engine cannot refuse. :attr:`reset_note` says how the last call was decided.

        Returns:
            True if the cache was reset; False if the server refused (no
            ``VLLM_SERVER_DEV_MODE=1``: 404) or never succeeded (or, with an empty answer, never
            was idle); None if it is unreachable.
        """
        self.reset_note = "not tried"
        for _ in range(attempts):
            try:
                busy_before = await self._held_requests()
                status, body = await self._request("POST", "/reset_prefix_cache")
            except ServerUnreachable:  # a stopped server would cost the POST's timeout again
                self.reset_note = "unreachable"
                return None
            if status != 200:
                self.reset_note = f"refused: HTTP {status} (no VLLM_SERVER_DEV_MODE=1?)"
                return False
            try:
                doc = json.loads(body)
                ok = doc.get("success") if isinstance(doc, dict) else None
            except ValueError:
                ok = None
            if ok is None:  # vLLM <= 0.25: 200 with an empty body, reset or not
                # idle before and after the call: no request could hold a block when it reset
                try:
                    after = await self._held_requests()
                except ServerUnreachable:
                    after = math.nan
                busy = math.nan if math.isnan(busy_before) or math.isnan(after) else max(busy_before, after)
                if busy == 0:
                    self.reset_note = "reset: empty answer (vLLM <= 0.25) while /metrics showed the engine idle"
                    return True
                self.reset_note = ("not confirmed: empty answer (vLLM <= 0.25) while /metrics showed "
                                   + ("no load gauges" if math.isnan(busy) else f"{busy:g} request(s) held")
                                   + "; the engine refuses a reset while blocks are held")
            elif ok:
                self.reset_note = "reset"
                return True
            else:
                self.reset_note = "refused: {\"success\": false} (a request still holds blocks)"
            await asyncio.sleep(wait_s)
        return False

    async def _held_requests(self) -> float:
        """Requests running or waiting on the engine per ``/metrics`` (NaN when unknown: an error
        status, or no load gauges).

        Raises:
            ServerUnreachable: no answer (the reset that asks is then not tried).
        """
        try:
            snap = await self.metrics()
        except ServerUnreachable:
            raise
        except CalibrationError:
            return math.nan
        return snap.get("vllm:num_requests_running") + snap.get("vllm:num_requests_waiting")

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
        """:meth:`probe` without its translation of errors: ``/v1/models``, ``/version``,
        ``/metrics`` and ``/server_info`` are asked in that order, each answer checked as it comes.
        """
        names, entry = await self._served_model()
        version = await self._vllm_version()
        block_size, num_blocks, prefix, util = await self._cache_config()
        sources = dict.fromkeys(("block_size", "num_gpu_blocks", "enable_prefix_caching", "gpu_memory_utilization"),
                                f"{self.url}/metrics vllm:cache_config_info")
        max_model_len = int(entry.get("max_model_len") or 0)
        sources["max_model_len"] = f"{self.url}/v1/models max_model_len"
        server_info = await self._server_info()
        sched, hardware, device, unmodeled = server_info or ({}, "unknown", "unknown", ())
        mnbt, mns, lptt, async_flag, sched_sources = self._scheduler_settings(sched, hardware, device)
        sources.update(sched_sources)
        if async_flag is None and version != "unknown" and device != "unknown":
            async_flag, sources["async_scheduling"] = _default_async_scheduling(version, device)
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
            dev_mode=server_info is not None,
            sources=sources,
            async_scheduling=async_flag,
            unmodeled=unmodeled,
        )

    async def _served_model(self) -> tuple[tuple[str, ...], dict[str, Any]]:
        """Every model name ``/v1/models`` lists, and its entry for :attr:`model` (set to the only
        name listed when None).

        Raises:
            CalibrationError: an error status; several models and none chosen; :attr:`model` not
                among them (the message lists them).
            ValueError, TypeError, KeyError, AttributeError: an answer not shaped as vLLM's.
        """
        status, body = await self._request("GET", "/v1/models")
        if status != 200:
            raise CalibrationError(f"{self.url}/v1/models answered {status}: {error_message(body)}")
        models = json.loads(body).get("data", [])
        names = tuple(m["id"] for m in models)
        if self.model is None:
            if len(names) != 1:
                raise CalibrationError(f"{self.url} serves {len(names)} models {list(names)}; choose one with --model")
            self.model = names[0]
        if self.model not in names:
            raise CalibrationError(
                f"the server at {self.url} does not serve model {self.model!r}; it serves: {', '.join(names)}"
            )
        return names, next(m for m in models if m["id"] == self.model)

    async def _vllm_version(self) -> str:
        """The vLLM release ``/version`` names; ``"unknown"`` when it answers with an error status.

        Raises:
            ValueError, AttributeError: an answer that is not JSON, or not an object.
        """
        status, body = await self._request("GET", "/version")
        if status != 200:
            return "unknown"
        return str(json.loads(body).get("version", "unknown"))

    async def _cache_config(self) -> tuple[int, int, bool, str | None]:
        """``(block_size, num_gpu_blocks, enable_prefix_caching, gpu_memory_utilization)`` from
        ``/metrics``' ``vllm:cache_config_info``: tokens, blocks (0 when absent), the flag (True
        when absent), and the utilisation's label text as given (None when absent).

        Raises:
            CalibrationError: ``/metrics`` answers with an error status or has no
                ``vllm:cache_config_info``.
            ValueError: a block size or count that is not an int.
        """
        snap = await self.metrics()
        cache = snap.info.get("vllm:cache_config_info", {})
        if not cache:
            raise CalibrationError(f"{self.url}/metrics has no vllm:cache_config_info; is this a vLLM v1 server?")
        return (int(cache.get("block_size", "0") or 0), int(cache.get("num_gpu_blocks", "0") or 0),
                cache.get("enable_prefix_caching", "True") == "True", cache.get("gpu_memory_utilization"))

    async def _server_info(self) -> tuple[Any, str, str, tuple[str, ...]] | None:
        """``(scheduler_config, hardware, device, unmodeled)`` from ``/server_info``, which answers
        only with ``VLLM_SERVER_DEV_MODE=1`` (None on an error status). The scheduler config is
        ``{}`` when the answer has none; hardware and device are ``"unknown"`` when neither the
        device config nor ``system_env`` names them; ``unmodeled``:
        :func:`~kvroute.calibrate.live.server_features.unmodeled_features` of the config.

        Raises:
            ValueError, AttributeError: an answer that is not JSON, or not shaped as vLLM's.
        """
        status, body = await self._request("GET", "/server_info", config_format="json")
        if status != 200:
            return None
        doc = json.loads(body)
        cfg = doc.get("vllm_config", {})
        sched: Any = {}
        device, gpus_used = "unknown", None
        if isinstance(cfg, dict):
            gpus_used = _gpus_used(cfg.get("parallel_config") or {})
            sched = cfg.get("scheduler_config", {}) or {}
            device = _configured_device(cfg.get("device_config") or {})
        hardware, env_device = _hardware_from_system_env(doc.get("system_env", {}) or {}, gpus_used)
        return sched, hardware, device if device != "unknown" else env_device, unmodeled_features(cfg)

    def _scheduler_settings(self, sched: Any, hardware: str, device: str
                            ) -> tuple[int, int, int, bool | None, dict[str, str]]:
        """``(max_num_batched_tokens, max_num_seqs, long_prefill_token_threshold, async_scheduling,
        sources)``: from ``/server_info``'s ``scheduler_config`` ``sched`` when it has one, else
        vLLM's defaults on ``device`` (``async_scheduling`` then None).

        Raises:
            KeyError, ValueError, TypeError: a scheduler config without the two batch limits, or
                with values that are not ints.
        """
        if not sched:
            mnbt, mns = CPU_BATCH_DEFAULTS if device == "cpu" else GPU_BATCH_DEFAULTS
            note = "vLLM 0.32 vllm-serve default (engine/arg_utils.py: get_batch_defaults); /server_info unavailable"
            return mnbt, mns, 0, None, dict.fromkeys(_BATCH_SETTINGS, note)
        mnbt, mns = int(sched["max_num_batched_tokens"]), int(sched["max_num_seqs"])
        lptt = int(sched.get("long_prefill_token_threshold") or 0)
        sources = dict.fromkeys(_BATCH_SETTINGS, f"{self.url}/server_info scheduler_config")
        async_flag = None
        if type(sched.get("async_scheduling")) is bool:
            async_flag = sched["async_scheduling"]
            sources["async_scheduling"] = f"{self.url}/server_info scheduler_config.async_scheduling"
        sources["hardware"] = (f"{self.url}/server_info system_env" if hardware != "unknown" else
                               f"{self.url}/server_info has no system_env (vLLM before 0.16): hardware unknown, "
                               "give it with --hardware")
        return mnbt, mns, lptt, async_flag, sources

    async def complete(
        self, prompt: Sequence[int], max_tokens: int, on_token: Callable[[int], None] | None = None
    ) -> StreamResult:
        """Stream one completion of a token-id prompt, asking for ``max_tokens`` tokens with
        ``ignore_eos`` (the count that came back is in the result; nothing here checks it).

        Read by the shared reader (:func:`kvroute.calibrate.live.stream.read_completion`) on this
        client's connections.

        Args:
            prompt: prompt token ids.
            max_tokens: output tokens (``ignore_eos`` is set).
            on_token: called with the number of tokens received so far, after each chunk with output.

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
        return await stream_completion(self.url, body, self.timeout_s, on_token, self._session)


async def stream_completion(
    url: str, body: dict, timeout_s: float = 600.0, on_token: Callable[[int], None] | None = None,
    session: Any = None,
) -> StreamResult:
    """POST ``body`` to ``url``/v1/completions and read the server-sent events.

    Args:
        url: server base URL.
        body: the completion request.
        timeout_s: limit on the whole request, s.
        on_token: called with the number of tokens received so far, after each chunk with output.
        session: an open :func:`kvroute.calibrate.live.stream.new_session`; None: one for this request.

    Returns:
        A :class:`StreamResult` (token arrival times relative to the send).

    Raises:
        CalibrationError: connection refused, reset, cut before ``[DONE]`` or timed out.
    """
    own = session is None
    if own:
        session = new_session()
    counted = 0

    def on_tokens(k: int, t: float) -> None:
        nonlocal counted
        counted += k
        on_token(counted)

    try:
        s = await read_completion(session, url, body, timeout_s, None if on_token is None else on_tokens)
    except StreamLost as exc:
        raise CalibrationError(str(exc)) from exc
    finally:
        if own:
            await session.close()
    t0 = s.t_send
    error = s.error if s.usage_error is None else (s.error or f"measurement error: {s.usage_error}")
    return StreamResult(t_send=t0, token_times=[t - t0 for t in s.token_times], prompt_tokens=s.prompt_tokens,
                        cached_tokens=s.cached_tokens, completion_tokens=s.completion_tokens,
                        t_done=s.t_done - t0, error=error, status=s.status, warning=s.warning)


