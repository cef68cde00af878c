"""``roicore bench --plot FILE.png``: the native-ratio table as bars, one panel per direction."""
from __future__ import annotations

from ._report import UsageError

EXTRA = "roicore[plot]"


def require():
    """UsageError, naming the extra that installs it, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(f"--plot needs matplotlib, which the plot extra installs: "
                         f"pip install '{EXTRA}'") from None


def subtitle(report):
    env = report["environment"]
    scale = (f"workloads scaled down by {report['scale']:g}"
             + (": a smoke run, not a measurement" if report.get("quick") else "")
             if report["scale"] != 1 else "full-size workloads")
    return (f"{report['threads']} thread(s) for every contender, {env['cpu']}, median of "
            f"{report['repeats']} round(s); {scale}")


def bars(report):
    """``(groups, directions, natives, ratio)``: the label of each bar group (workload, op
    and, when the run has several, dtype), the directions, the frameworks whose native ops
    ran, and {(group, direction, framework): native time / roicore.core time}."""
    several = len({r["dtype"] for r in report["results"]}) > 1
    core = [r for r in report["results"] if r["framework"] == "roicore" and r["kind"] == "core"
            and not r.get("variant")]

    def group(r):
        return (r["workload"], r["operator"]) + ((r["dtype"],) if several else ())
    groups = list(dict.fromkeys(group(r) for r in core))
    directions = list(dict.fromkeys(r["direction"] for r in core))
    natives = [n for n, i in report["frameworks"].items() if n != "roicore" and i.get("version")]
    ratio = {(group(r), r["direction"], r["framework"]): r["ratio"] for r in report["results"]
             if r["kind"] == "native" and "ratio" in r}
    return groups, directions, natives, ratio


def figure(report):
    """The matplotlib figure of a compare-mode report (Agg backend, nothing shown)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups, directions, natives, ratio = bars(report)
    n = max(1, len(natives))
    height = 0.8 / n
    values = list(ratio.values()) or [1.0]
    lo, hi = min(min(values), 1.0) / 2.5, max(max(values), 1.0) * 4
    fig, axes = plt.subplots(1, max(1, len(directions)), sharey=True, squeeze=False,
                             figsize=(7 * max(1, len(directions)),
                                      1.8 + 0.2 * len(groups) * n + 0.3 * len(groups)))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, direction in zip(axes[0], directions):
        for gi, g in enumerate(groups):
            for fi, fw in enumerate(natives):
                y = gi + (fi - (n - 1) / 2) * height
                v = ratio.get((g, direction, fw))
                if v is None:   # this framework has no such contender
                    ax.text(1.06, y, f"n/a ({fw})", va="center", ha="left", fontsize=8,
                            color="0.45", style="italic")
                    continue
                # from the 1x line: right where roicore is faster, left where it is slower
                ax.barh(y, abs(v - 1), height * 0.9, left=min(v, 1.0),
                        color=colors[fi % len(colors)])
                faster = v >= 1
                ax.text(v * (1.06 if faster else 1 / 1.06), y, f"{v:.3g}x", va="center",
                        ha="left" if faster else "right", fontsize=8)
        for gi in range(len(groups) - 1):
            ax.axhline(gi + 0.5, color="0.85", lw=0.6)
        ax.axvline(1, color="k", lw=1)   # roicore.core
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        ax.set_title(direction, fontsize=11)
        ax.set_xlabel("native time / roicore.core time (log scale; > 1: roicore is faster)",
                      fontsize=9)
        ax.grid(axis="x", which="major", color="0.9", lw=0.6)
        ax.set_axisbelow(True)
    axes[0][0].set_yticks(range(len(groups)))
    axes[0][0].set_yticklabels(["\n".join(g) for g in groups], fontsize=9)
    axes[0][0].set_ylim(len(groups) - 0.5, -0.5)
    env = report["environment"]
    fig.suptitle(f"roicore {env['roicore']} against the frameworks' own RoI operators\n"
                 + subtitle(report), fontsize=12)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[i % len(colors)])
               for i in range(len(natives))]
    if natives:
        fig.legend(handles, natives, loc="lower center", ncol=len(natives), fontsize=9,
                   frameon=False)
    fig.tight_layout(rect=(0, 0.04 if natives else 0, 1, 0.97))
    return fig


def plot(report, path):
    import matplotlib.pyplot as plt
    fig = figure(report)
    fig.savefig(path, dpi=100)
    plt.close(fig)
