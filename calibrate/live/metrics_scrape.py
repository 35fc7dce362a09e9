"""The live replay's ``/metrics`` scrape: each vLLM server's load as a gateway sees it.

vLLM exports Prometheus gauges per engine: ``vllm:num_requests_running``,
``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc`` (a fraction 0..1; releases before
0.10 named it ``vllm:gpu_cache_usage_perc``, read only where the new name is absent). Requests
are summed over a server's engines, the KV usage averaged, so it stays a fraction.
``LiveMetrics`` polls every server's ``/metrics`` every ``interval_s`` (back to back at 0) and
keeps the last values, which the router reads through the same ``MetricsScrape`` object the
simulator uses.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

from kvroute.calibrate.live.stream import new_session
from kvroute.sim.routing import MetricsScrape

#: Limit on one scrape of one server, s.
SCRAPE_TIMEOUT_S = 5.0

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
          "vllm:gpu_cache_usage_perc")
"""The gauges :func:`parse_vllm_metrics` reads (the last: the KV usage's name before vLLM 0.10)."""


def parse_vllm_metrics(text: str) -> tuple[int, int, float]:
    """``(num_running, num_waiting, kv_usage)`` from a Prometheus text page: the requests summed
    over the engines a server reports (one line per engine label set), the KV usage their mean
    (a fraction; the old gauge name only where the new one is absent). A sample's optional
    timestamp (``name{labels} value timestamp``) is not its value.

    Raises:
        ValueError: a page without ``vllm:num_requests_running`` (not a vLLM server), or one of
            these gauges without a finite number for its value.
    """
    sums: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in GAUGES:
            continue
        rest = line[line.rfind("}") + 1:] if "{" in line else line[len(name):]
        fields = rest.split()
        try:
            value = float(fields[0])
        except (IndexError, ValueError):
            raise ValueError(f"the /metrics line {line[:80]!r} has no value") from None
        if not math.isfinite(value):
            raise ValueError(f"the /metrics line {line[:80]!r} has no finite value")
        total = sums.setdefault(name, [0.0, 0])
        total[0] += value
        total[1] += 1
    if "vllm:num_requests_running" not in sums:
        raise ValueError("the /metrics page has no vllm:num_requests_running gauge")
    usage = sums.get("vllm:kv_cache_usage_perc") or sums.get("vllm:gpu_cache_usage_perc") or [0.0, 1]
    return (int(sums["vllm:num_requests_running"][0]), int(sums.get("vllm:num_requests_waiting", [0.0])[0]),
            usage[0] / usage[1])


class LiveMetrics:
    """Polls the servers' ``/metrics``; ``scrape`` is the router's view of them.

    Args:
        urls: base URLs of the servers, worker ``i`` being ``urls[i]``.
        interval_s: seconds between polls of every server; 0 polls back to back.

    Attributes:
        scrape: the ``MetricsScrape`` to give the ``RouterView`` (its values are the last poll's).
        num_scrapes: completed polls of all servers.
    """

    def __init__(self, urls: Sequence[str], interval_s: float = 0.0) -> None:
        self.urls = list(urls)
        self.interval_s = interval_s
        self._latest = [(0, 0, 0.0) for _ in self.urls]
        self.scrape = MetricsScrape(lambda: list(self._latest))
        self.num_scrapes = 0

    async def _page(self, session: Any, url: str) -> str:
        """The text of ``url``/metrics.

        Raises:
            ValueError: no answer within :data:`SCRAPE_TIMEOUT_S`, a connection error or a status
                other than 200.
        """
        import aiohttp

        try:
            async with asyncio.timeout(SCRAPE_TIMEOUT_S):
                async with session.get(f"{url.rstrip('/')}/metrics") as resp:
                    if resp.status != 200:
                        raise ValueError(f"no /metrics page (HTTP {resp.status})")
                    return (await resp.read()).decode(errors="replace")
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ValueError(f"no /metrics page ({type(exc).__name__}: {exc})") from None

    async def poll_once(self, session: Any, strict: bool = False) -> None:
        """Scrape every server once; a server that does not answer keeps its last values.

        Args:
            session: an open ``aiohttp.ClientSession`` (``kvroute.calibrate.live.stream.new_session``).

        Raises:
            ValueError: with ``strict``, a server whose page cannot be read (naming its URL).
        """
        pages = await asyncio.gather(*(self._page(session, u) for u in self.urls), return_exceptions=True)
        for w, page in enumerate(pages):
            try:
                if isinstance(page, BaseException):
                    raise page
                self._latest[w] = parse_vllm_metrics(page)
            except ValueError as exc:
                if strict:
                    raise ValueError(f"{self.urls[w]}: {exc}") from None
        self.num_scrapes += 1

    async def first_poll(self) -> None:
        """One poll of every server with a session of its own (before the replay starts).

        Raises:
            ValueError: a server without vLLM's load gauges (naming its URL).
        """
        async with new_session() as session:
            await self.poll_once(session, strict=True)

    async def run(self) -> None:
        """Poll until cancelled."""
        async with new_session() as session:
            while True:
                await self.poll_once(session)
                await asyncio.sleep(self.interval_s)
