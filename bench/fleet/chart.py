"""The fleet run's chart: above, the server's resident set every 100 ms against its floor,
the budget and the bound, with what the host says its resident models hold; below, every
request at the time it was due, by model, coloured by what it got. Dotted lines: the
popularity shifts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

WAITED_MS = 1000.0  # a correct answer this slow waited for its model to load
COLOURS = {"fast": "tab:green", "waited": "tab:orange", "503": "tab:grey", "error": "tab:red"}


def outcome_class(outcome: str, latency_ms: float) -> str:
    if outcome == "200":
        return "fast" if latency_ms < WAITED_MS else "waited"
    return "503" if outcome == "503" else "error"


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(11, 7.5), sharex=True, gridspec_kw={"height_ratios": [1, 1.3]}
    )
    _memory(top, data)
    _requests(bottom, data)
    shift = float(data["load"]["shift_s"])
    end = float(data["load"]["duration_s"])
    for axis in (top, bottom):
        for k in range(1, int(end // shift) + 1):
            axis.axvline(k * shift, color="grey", linestyle=":", linewidth=0.8)
    bottom.set_xlabel("seconds since the load began")
    machine = data["machine"]
    fig.suptitle(
        f"flotilla bench fleet: {len(data['fleet'])} on-demand entries, budget "
        f"{data['budget_mb']:.0f} MB; {machine.get('cpu')}, {machine.get('cores')} cores",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _memory(axis: Any, data: dict[str, Any]) -> None:
    m = data["memory"]
    rss = data["timeline"]["rss_mb"]
    axis.plot([t for t, _ in rss], [v for _, v in rss], linewidth=1, label="resident set")
    polls = data["timeline"]["polls"]
    axis.step([p[0] for p in polls], [m["floor_mb"] + p[1] for p in polls], where="post",
              linewidth=1, label="floor + what the host says its models hold")  # fmt: skip
    axis.axhline(m["floor_mb"], color="black", linewidth=0.8, label="floor")
    axis.axhline(m["floor_mb"] + m["budget_mb"], color="tab:blue", linestyle="--",
                 linewidth=0.8, label="floor + budget")  # fmt: skip
    axis.axhline(m["limit_mb"], color="tab:red", linestyle="--", linewidth=0.8,
                 label="bound (+ libraries + tolerance)")  # fmt: skip
    axis.set_ylabel("MB")
    axis.legend(fontsize=7, loc="lower right")


def _requests(axis: Any, data: dict[str, Any]) -> None:
    names = [e["name"] for e in data["fleet"]]
    row = {name: i for i, name in enumerate(names)}
    for cls, colour in COLOURS.items():
        picked = [a for a in data["timeline"]["answers"] if outcome_class(a[3], a[2]) == cls]
        if picked:
            axis.scatter([a[1] for a in picked], [row[a[0]] for a in picked], s=6, c=colour,
                         label=_LABELS[cls])  # fmt: skip
    axis.set_yticks(range(len(names)), names, fontsize=7)
    axis.invert_yaxis()
    axis.legend(fontsize=7, loc="upper right", ncols=4)


_LABELS = {
    "fast": "200",
    "waited": f"200 after {WAITED_MS / 1e3:g} s or more (a load)",
    "503": "503",
    "error": "error or wrong",
}
