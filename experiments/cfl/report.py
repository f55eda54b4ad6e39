"""The CFL experiment's report: a markdown table and a plot of accuracy against string length."""

from __future__ import annotations

from pathlib import Path


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def summary_rows(report: dict) -> list[tuple[str, float, float]]:
    """``(variant, mean in-distribution accuracy, mean accuracy beyond the training lengths)``."""
    longest = report["train_lengths"][1]
    rows = []
    for name, result in report["variants"].items():
        cells = [cell for per_length in result["accuracy"].values() for cell in per_length.values()]
        rows.append((name, _mean(c["accuracy"] for c in cells if c["length"] <= longest),
                     _mean(c["accuracy"] for c in cells if c["length"] > longest)))
    return rows


def write_markdown(report: dict, path) -> None:
    lengths = report["eval_lengths"]
    longest = report["train_lengths"][1]
    lines = [
        "# CFL recognition: accuracy by string length",
        "",
        f"Trained on lengths {report['train_lengths'][0]}..{longest}; {report['examples']} strings per cell "
        "(half positive, hard negatives). A language without positives at N is measured at the nearest shorter "
        "length that has them (e.g. marked_palindrome at N - 1); `*` marks lengths beyond training.",
        "",
        f"Command: `{report['command']}`; wall {report['wall_seconds']:.0f} s, CPU {report['cpu_seconds']:.0f} s.",
        "",
        "| variant | parameters | steps | final loss | train CPU s | eval CPU s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, result in report["variants"].items():
        lines.append(f"| {name} | {result['parameters']:,} | {result['train_steps']} | {result['final_loss']:.3f} | "
                     f"{result['train_cpu_seconds']:.0f} | {result['eval_cpu_seconds']:.0f} |")
    lines += ["", "| variant | mean accuracy, N <= %d | mean accuracy, N > %d |" % (longest, longest),
              "| --- | ---: | ---: |"]
    lines += [f"| {name} | {inside:.3f} | {beyond:.3f} |" for name, inside, beyond in summary_rows(report)]
    header = " | ".join(f"{n}{'*' if n > longest else ''}" for n in lengths)
    lines += ["", f"| language | variant | {header} |", "| --- | --- |" + " ---: |" * len(lengths)]
    for language in report["languages"]:
        for name, result in report["variants"].items():
            cells = result["accuracy"][language]
            values = " | ".join(f"{cells[str(n)]['accuracy']:.3f}" for n in lengths)
            lines.append(f"| {language} | {name} | {values} |")
    Path(path).write_text("\n".join(lines) + "\n")


def write_plot(report: dict, path) -> None:
    """One panel per language: accuracy against N, a line per variant, the training range shaded."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    languages = report["languages"]
    columns = min(4, len(languages))
    rows = -(-len(languages) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 2.9 * rows), squeeze=False, sharey=True)
    for ax, language in zip(axes.flat, languages):
        for name, result in report["variants"].items():
            cells = result["accuracy"][language]
            ax.plot([cells[str(n)]["length"] for n in report["eval_lengths"]],
                    [cells[str(n)]["accuracy"] for n in report["eval_lengths"]], marker="o", label=name)
        ax.axvspan(report["train_lengths"][0], report["train_lengths"][1], color="grey", alpha=0.15)
        ax.axhline(0.5, color="grey", linestyle=":", linewidth=1)
        ax.set_title(language)
        ax.set_ylim(0.4, 1.02)
        ax.set_xlabel("string length N")
        ax.grid(True, alpha=0.3)
    for ax in axes.flat[len(languages):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("accuracy")
    axes.flat[0].legend(fontsize=7, loc="lower left")
    fig.suptitle("CFL recognition accuracy vs length (shaded: training lengths)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
