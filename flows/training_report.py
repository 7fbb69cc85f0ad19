"""The training half of a run's report, read back from the registry: ``training.png`` and the
``## Training`` section of ``report.md`` (:mod:`flows.report` publishes both).

``training.png`` has one panel per signal, each drawn only when its series has data (:data:`PANELS`):

1. the SFT warm start's loss per step (``sft/loss``);
2. each RL step's training reward, mean ± its spread over the step's episodes (a band, or an
   error bar at a single step), with each reward component;
3. the share of groups whose rewards have no spread (no gradient) and of the policy's tokens whose
   importance ratio was clipped;
4. the KL of the policy to the warm start per token (k3 and k1; ``warm_start_kl/*``);
5. how the training and dev episodes ended (answer, token budget, format error, step cap);
6. the dev checks: dev EM per check, and the warm start's pass@1 and pass@k before RL (step 0).

A series of one point (``make run`` trains one RL step) is drawn as a marker with its value written
beside it; a panel with no data is left out and named, with the reason, in a note under the
figure. The curriculum's stage switches are dashed vertical lines on the RL panels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and workers

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from flows.runs import registry

Points = list[tuple[int, float]]
SFT, RL = "SFT step", "RL step (0: the warm start, before RL)"


@dataclass
class Spec:
    """A panel of the plot: its curves as (metric, label), and why it may have none."""

    title: str
    ylabel: str
    x: str
    curves: list[tuple[str, str]]
    absent: str
    band: tuple[str, str] | None = None  # (mean, spread) metrics drawn as mean ± spread


@dataclass
class Panel:
    """A panel with data: ``curves`` as (label, points), ``band`` as (label, points of mean, spreads)."""

    spec: Spec
    curves: list[tuple[str, Points]]
    band: tuple[str, Points, dict[int, float]] | None = None
    extra: list[tuple[str, Points]] = field(default_factory=list)


ENDED = [("answer", "answer"), ("token_budget", "token budget"), ("format_error", "format error"),
         ("step_cap", "step cap")]  # fmt: skip
PANELS = [
    Spec("SFT warm start: loss per step", "loss", SFT, [("sft/loss", "loss")],
         "no SFT step logged (the run starts RL from its model)"),
    Spec("RL: training reward, mean ± std over the step's episodes", "reward", RL, [],
         "no RL step logged", band=("train/reward", "train/reward_std")),
    Spec("RL: groups with no reward spread (no gradient); clipped importance ratios", "share", RL,
         [("train/frac_reward_zero_std", "groups with no reward spread"),
          ("train/clip_ratio/region_mean", "tokens clipped")],
         "no RL step logged"),
    Spec("RL: KL of the policy to the warm start, per token", "KL", RL,
         [("train/warm_start_kl/k3", "k3"), ("train/warm_start_kl/k1", "k1"),
          ("train/warm_start_kl/probe_k3", "k3 on the first step's episodes (fixed probe)")],
         "not measured (beta 0 and warm_start_kl 0)"),
    Spec("How the episodes ended (share)", "share", RL,
         [(f"train/ended/{k}", f"train: {v}") for k, v in ENDED]
         + [(f"dev/ended/{k}", f"dev: {v}") for k, v in ENDED],
         "no training or dev episode logged"),
    Spec("Dev checks: EM (greedy); the warm start's pass@1 / pass@k (sampled, before RL)", "EM", RL,
         [("dev/em", "dev EM"), ("headroom/pass@1", "pass@1"), ("headroom/pass@k", "pass@k")],
         "no dev check (a one-segment run evaluates its last checkpoint on test instead)"),
]  # fmt: skip


def gather(run_id: str) -> tuple[list[Panel], list[str]]:
    """The panels with data, and a note for each panel left out."""
    reg = registry()
    series: Callable[[str], Points] = lambda name: reg.metric_series(run_id, name)  # noqa: E731
    names = sorted(reg.latest_metrics(run_id))
    k = int(dict(series("headroom/k")).get(0, 0))
    panels, notes = [], []
    for spec in PANELS:
        curves = [(label, points) for name, label in spec.curves if (points := series(name))]
        curves = [(f"pass@{k}" if label == "pass@k" and k else label, p) for label, p in curves]
        band = None
        if spec.band is not None and (mean := series(spec.band[0])):
            band = ("reward", mean, dict(series(spec.band[1])))
            # TRL logs each reward function as rewards/<name>/mean and rewards/<name>/std: the means
            curves += [(n.removeprefix("train/rewards/").removesuffix("/mean"), series(n))
                       for n in names if n.startswith("train/rewards/") and n.endswith("/mean")]  # fmt: skip
        if curves or band:
            panels.append(Panel(spec, curves, band))
        else:
            notes.append(f"Left out: {spec.title.split(',')[0]}: {spec.absent}.")
    return panels, notes


def draw_points(ax: Axes, label: str, points: Points, color: str, style: str = "-") -> None:
    """A line with markers, or for a single point a larger marker with its value beside it (once
    per position: two series at the same point share one label)."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    if len(points) == 1:
        ax.plot(xs, ys, linestyle="none", marker="o", markersize=7, color=color, label=label)
        if all(t.xy != (xs[0], ys[0]) for t in ax.texts if hasattr(t, "xy")):
            ax.annotate(f"{ys[0]:.3g}", (xs[0], ys[0]), textcoords="offset points", xytext=(6, 4), fontsize=8,
                        color=color)  # fmt: skip
    else:
        ax.plot(xs, ys, linestyle=style, marker=".", linewidth=1.2, color=color, label=label)


def draw_band(ax: Axes, label: str, mean: Points, spread: dict[int, float]) -> None:
    """Mean ± spread: a shaded band over several steps, an error bar at a single step."""
    xs, ys = [x for x, _ in mean], [y for _, y in mean]
    errs = [spread.get(x, 0.0) for x in xs]
    if len(mean) == 1:
        ax.errorbar(xs, ys, yerr=errs, fmt="o", markersize=7, capsize=5, color="tab:blue",
                    label=f"{label} ± std")  # fmt: skip
        ax.annotate(f"{ys[0]:.3g} ± {errs[0]:.2g}", (xs[0], ys[0]), textcoords="offset points", xytext=(8, 4),
                    fontsize=8, color="tab:blue")  # fmt: skip
        return
    ax.plot(xs, ys, marker="o", linewidth=1.5, color="tab:blue", label=label)
    low, high = [y - e for y, e in zip(ys, errs, strict=True)], [y + e for y, e in zip(ys, errs, strict=True)]
    ax.fill_between(xs, low, high, color="tab:blue", alpha=0.2, label="± std")


def steps_of(panel: Panel) -> list[int]:
    band = panel.band[1] if panel.band is not None else []
    return [x for _, points in panel.curves for x, _ in points] + [x for x, _ in band]


def draw(ax: Axes, panel: Panel, switches: list[Any], rl_steps: tuple[int, int]) -> None:
    """One panel; the RL panels share the x range ``rl_steps`` (step 0 is the warm start)."""
    if panel.band is not None:
        draw_band(ax, *panel.band)
    for i, (label, points) in enumerate(panel.curves):
        style = ":" if panel.band is not None else ("--" if label.startswith("dev") else "-")
        draw_points(ax, label, points, f"C{(i + 2) % 10}", style)
    spec = panel.spec
    ax.set_title(spec.title, fontsize=9, loc="left")
    ax.set_ylabel(spec.ylabel)
    ax.set_xlabel(spec.x, fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.margins(x=0.08, y=0.15)
    if spec.x == RL:
        ax.set_xlim(rl_steps[0] - 0.5, rl_steps[1] + 0.5)
    if len(ax.get_legend_handles_labels()[1]) > 1:
        ax.legend(fontsize=7, loc="best")
    if spec.x == RL:
        for s in switches:
            ax.axvline(s.step, color="tab:red", linestyle="--", linewidth=1)
            ax.annotate(f"{s.to_stage}", (s.step, 1), xycoords=("data", "axes fraction"), color="tab:red",
                        ha="left", va="top", fontsize=8)  # fmt: skip


def training_figure(run_id: str) -> Figure | None:
    """The figure of :func:`training_plot` (None when the run logged no training signal)."""
    panels, notes = gather(run_id)
    if not panels:
        return None
    height = 2.3 * len(panels) + 0.6 + 0.16 * len(notes)
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, height), squeeze=False)
    switches = registry().stage_switches(run_id)
    rl = [x for p in panels if p.spec.x == RL for x in steps_of(p)] or [0]
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        draw(ax, panel, switches, (min(rl), max(rl)))
    fig.suptitle(f"{run_id}: training")
    for i, note in enumerate(notes):
        fig.text(0.01, 0.01 + 0.16 * i / height, note, fontsize=7, color="dimgray")
    fig.tight_layout(rect=(0, (0.16 * len(notes) + 0.05) / height, 1, 1))
    return fig


def training_plot(run_id: str, path: Path) -> Path | None:
    """``training.png`` (module docstring); None when there is nothing to plot."""
    fig = training_figure(run_id)
    if fig is None:
        return None
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def num(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


#: the report's tables of RL steps: (title, [(metric, header, format)]); a few columns each
STEP_TABLES = [
    ("reward", [("reward", "reward", ".3f"), ("reward_std", "± std", ".3f"),
                ("frac_reward_zero_std", "flat groups", ".2f"), ("clip_ratio/region_mean", "clipped", ".3f"),
                ("warm_start_kl/k3", "KL k3", ".3g")]),
    ("how the episodes ended", [(f"ended/{k}", v, ".2f") for k, v in ENDED]),
    ("the policy", [("entropy", "entropy", ".3g"), ("grad_norm", "grad norm", ".3g"),
                    ("searches", "searches", ".2f"), ("answer_tokens", "answer tokens", ".1f"),
                    ("warm_start_kl/k1", "KL k1", ".3g")]),
]  # fmt: skip


def shown_steps(steps: list[int], most: int = 12) -> list[int]:
    """At most ``most`` steps, evenly spread, the last included: ``shown_steps(list(range(1, 31)), 4)``
    is ``[1, 11, 21, 30]``."""
    if len(steps) <= most:
        return steps
    every = -(-len(steps) // (most - 1))
    return [*steps[::every][: most - 1], steps[-1]]


def headroom_line(latest: dict[str, float]) -> list[str]:
    if "headroom/pass@k" not in latest:
        return []
    k = int(latest["headroom/k"])
    return [
        f"- Before RL, the warm start answered {int(latest['headroom/questions'])} answerable dev questions "
        f"{k} times each, sampled at temperature {latest.get('headroom/temperature', 1.0):g} in the training "
        f"episode shape: pass@1 {latest['headroom/pass@1']:.3f}, pass@{k} {latest['headroom/pass@k']:.3f}. "
        f"pass@{k} is what a policy that kept its best of {k} samples would answer, the headroom RL can "
        f"sharpen towards; {latest['headroom/frac_reward_zero_std']:.0%} of the questions' groups had no "
        "reward spread, so no gradient."
    ]


def training_section(run_id: str, table: Callable[[list[str], list[list[str]]], list[str]]) -> list[str]:
    """The ``## Training`` lines of ``report.md``: the SFT loss, the headroom before RL, and the RL
    steps' signals in narrow tables (``table``: :func:`flows.report.table`); [] without training."""
    reg = registry()
    sft = reg.metric_series(run_id, "sft/loss")
    lines = []
    if sft:
        lines.append(f"- SFT warm start: {len(sft)} steps, loss {sft[0][1]:.3f} -> {sft[-1][1]:.3f}.")
    lines += headroom_line(reg.latest_metrics(run_id))
    steps = [s for s, _ in reg.metric_series(run_id, "train/reward")]
    tables: list[str] = []
    if steps:
        shown = shown_steps(steps)
        more = f" ({len(shown)} of {len(steps)} steps)" if len(shown) < len(steps) else ""
        for title, columns in STEP_TABLES:
            values = {name: dict(reg.metric_series(run_id, f"train/{name}")) for name, _, _ in columns}
            rows = [[str(s)] + [num(values[n].get(s), f) for n, _, f in columns] for s in shown]
            headers = ["step"] + [h for _, h, _ in columns]
            tables += [f"### RL steps: {title}{more}", "", *table(headers, rows)]
    if not lines and not tables:
        return []
    return ["## Training", "", *lines, "", *tables]
