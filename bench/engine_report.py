"""The engine benchmark's verdict, its printed summary and its chart, from the rows
``bench.engine`` measured (plain dicts, as written to the JSON)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench import report

TARGET_SPEEDUP = 2.0
TARGET_COSINE = 0.999


def verdict(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """flotilla's default row (the second) against ST.encode's (the first)."""
    main_row = rows[1]
    # On a shared machine the paired per-chunk ratio is the robust statistic: the two
    # methods ran back to back on the same texts. Quiet pairs are preferred when there
    # are enough of them.
    use_quiet = main_row["quiet_pairs"] >= max(3, main_row["pairs"] // 4)
    judged = main_row["quiet_paired_speedup_median" if use_quiet else "paired_speedup_median"]
    return {
        "speedup_ratio_of_medians": main_row["speedup_vs_st"],
        "speedup_paired_median": main_row["paired_speedup_median"],
        "speedup_quiet_paired_median": main_row["quiet_paired_speedup_median"],
        "speedup_best_of": main_row["tokens_per_s_best"] / rows[0]["tokens_per_s_best"],
        "speedup_judged": judged,
        "judged_on": f"{'quiet ' if use_quiet else ''}paired per-chunk median",
        "worst_cosine": main_row["worst_cosine"],
        "meets_speedup": judged >= TARGET_SPEEDUP,
        "meets_cosine": main_row["worst_cosine"] >= TARGET_COSINE,
    }


def table(rows: Sequence[dict[str, Any]]) -> str:
    headers = ["method", "dtype", "tokens/s", "x ST", "paired x ST", "quiet pairs"]
    headers += ["best tok/s", "worst cos", "mean cos", "tokenize %"]
    return report.table(
        headers,
        [
            [
                r["method"] + (f" (= {r['same_as']})" if r["same_as"] else ""),
                r["dtype"].replace(" (float32 weights)", ""),
                r["tokens_per_s"],
                r["speedup_vs_st"],
                r["paired_speedup_median"],
                f"{r['quiet_paired_speedup_median']:.2f} ({r['quiet_pairs']}/{r['pairs']})"
                if r["quiet_pairs"]
                else "-",
                r["tokens_per_s_best"],
                r["worst_cosine"],
                r["mean_cosine"],
                "-" if r["tokenize_share"] is None else f"{100 * r['tokenize_share']:.1f}",
            ]
            for r in rows
        ],
    )


def print_summary(result: dict[str, Any]) -> None:
    """The rows' table, the padding, the machine's CPU and the verdict, as printed."""
    padding, profile = result["padding"], result["profile"]
    cpu, verdict = result["cpu_during_measurement"], result["verdict"]
    print()
    print(table(result["rows"]))
    print(
        f"\npadding overhead: ST.encode {100 * padding['st_padding_overhead']:.1f}%, "
        f"flotilla {100 * padding['flotilla_padding_overhead']:.1f}% "
        f"(forward_tokens {profile['forward_tokens']}, "
        f"forward_max_sequences {profile['forward_max_sequences']})"
    )
    print(
        f"CPU during the measurement: {100 * cpu.get('ours_share', 0):.0f}% ours, "
        f"{100 * cpu.get('others_share', 0):.0f}% other processes on this machine"
    )
    print(
        f"flotilla / ST.encode: ratio of medians {verdict['speedup_ratio_of_medians']:.2f}x, "
        f"paired per chunk {verdict['speedup_paired_median']:.2f}x, best-of "
        f"{verdict['speedup_best_of']:.2f}x; judged ({verdict['judged_on']}) "
        f"{verdict['speedup_judged']:.2f}x vs target {TARGET_SPEEDUP}x: "
        f"{'met' if verdict['meets_speedup'] else 'MISSED'}; worst cosine "
        f"{verdict['worst_cosine']:.5f} vs {TARGET_COSINE}: "
        f"{'met' if verdict['meets_cosine'] else 'MISSED'}"
    )


def plot(rows: Sequence[dict[str, Any]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [str(r["method"]) + (f"\n(= {r['same_as']})" if r["same_as"] else "") for r in rows]
    values = [float(r["tokens_per_s"]) for r in rows]
    colors = ["#888888" if str(r["method"]).startswith("st") else "#1f77b4" for r in rows]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bars = ax.bar(labels, values, color=colors)
    for bar, row in zip(bars, rows, strict=True):
        ax.annotate(
            f"{float(row['tokens_per_s']):,.0f}\n×{float(row['speedup_vs_st']):.2f}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax.set_ylabel("real tokens/s (padding excluded)")
    ax.set_title(title, fontsize=10)
    ax.set_ylim(0, max(values) * 1.25)
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
