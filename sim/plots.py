"""Figures: TTFT distributions per policy and TTFT by turn (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def plot_ttft(records: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """Write a PNG with two panels: TTFT CDF per policy, and mean TTFT by turn per policy.

    Args:
        records: per-request records with ``policy``, ``turn``, ``ttft`` (s) and ``status``
            columns (``Comparison.records()``); all rounds are pooled.
        path: output PNG path.
        title: figure title.

    Returns:
        The path written.
    """
    ok = records[records["status"] == "ok"]
    fig, (ax_cdf, ax_turn) = plt.subplots(1, 2, figsize=(11, 4.2))
    for policy, group in ok.groupby("policy", sort=False):
        ttft = np.sort(group["ttft"].to_numpy(float))
        ax_cdf.plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft), label=policy)
        if group["turn"].notna().any():
            by_turn = group.groupby("turn")["ttft"]
            mean, p90 = by_turn.mean(), by_turn.quantile(0.9)
            line = ax_turn.plot(mean.index, mean.values, marker="o", label=f"{policy} mean")[0]
            ax_turn.plot(p90.index, p90.values, ls="--", color=line.get_color(), label=f"{policy} p90")
    ax_cdf.set_xlabel("TTFT (s)")
    ax_cdf.set_ylabel("share of requests")
    ax_cdf.set_title("TTFT distribution")
    ax_cdf.grid(alpha=0.3)
    ax_cdf.legend()
    ax_turn.set_xlabel("turn")
    ax_turn.set_ylabel("TTFT (s)")
    ax_turn.set_title("TTFT by turn")
    ax_turn.grid(alpha=0.3)
    if ax_turn.lines:
        ax_turn.legend(fontsize=8)
    else:
        ax_turn.text(0.5, 0.5, "trace has no turns", ha="center", va="center", transform=ax_turn.transAxes)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
