"""The served benchmark's printed summary and its chart, from the result ``bench.served``
writes (plain dicts, as in the JSON)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench import report
from bench.peers import side_by_side


def levels_table(rows: Sequence[dict[str, Any]]) -> str:
    headers = ["clients", "ok", "errors", "req/s", "tokens/s", "of ceiling", "p50 ms"]
    headers += ["p90 ms", "p99 ms", "queue p50", "infer p50", "req/batch", "others' CPU"]
    return report.table(
        headers,
        [
            [
                r["concurrency"],
                r["ok"],
                sum(r["errors"].values()),
                r["requests_per_s"],
                r["tokens_per_s"],
                f"{100 * r['share_of_engine_ceiling']:.0f}%",
                r["latency_ms"]["p50"],
                r["latency_ms"]["p90"],
                r["latency_ms"]["p99"],
                r["server_queue_ms_p50"],
                r["server_inference_ms_p50"],
                r["mean_requests_per_batch"] or float("nan"),
                f"{100 * r['cpu'].get('others_share', 0):.0f}%",
            ]
            for r in rows
        ],
    )


def print_summary(result: dict[str, Any]) -> None:
    """The levels' table, the best level against the engine ceiling, each peer's table."""
    rows, ceiling = result["levels"], result["engine_ceiling"]["tokens_per_s"]
    cosine = result["served_vs_engine_worst_cosine"]
    print()
    print(levels_table(rows))
    best = max(rows, key=lambda r: r["tokens_per_s"])
    print(
        f"\nengine ceiling {ceiling:,.0f} tokens/s; best served {best['tokens_per_s']:,.0f} "
        f"tokens/s at {best['concurrency']} clients = {100 * best['share_of_engine_ceiling']:.0f}% "
        f"of it; served vectors vs engine: worst cosine {cosine:.5f}"
    )
    for name, peer_result in (result["peers"] or {}).get("peers", {}).items():
        print()
        print(side_by_side.table(name, peer_result))


def plot(rows: Sequence[dict[str, Any]], ceiling: float, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [int(r["concurrency"]) for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(xs, [float(r["tokens_per_s"]) for r in rows], "o-", label="served")
    left.axhline(
        ceiling, color="grey", linestyle="--", label="engine ceiling: full batches, no server"
    )
    left.set_xscale("log", base=2)
    left.set_xlabel("concurrent clients")
    left.set_ylabel("tokens/s")
    left.set_ylim(0, max(ceiling, *(float(r["tokens_per_s"]) for r in rows)) * 1.15)
    left.legend()
    left.set_title("throughput")
    for key, style in (("p50", "o-"), ("p99", "s--")):
        right.plot(xs, [float(r["latency_ms"][key]) for r in rows], style, label=key)
    right.set_xscale("log", base=2)
    for axis in (left, right):
        axis.set_xticks(xs, [str(x) for x in xs])
        axis.minorticks_off()
    right.set_yscale("log")
    right.set_xlabel("concurrent clients")
    right.set_ylabel("latency, ms")
    right.legend()
    right.set_title("latency")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
