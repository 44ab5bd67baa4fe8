"""Grouped bar charts for the bench scripts' --png (matplotlib, where installed)."""
import sys


def bar_chart(path, labels, series, title, ylabel, hline=None, hline_label=None, figsize=(9, 4)):
    """series: {name: [one value per label]}, drawn side by side per label; hline: a reference
    line (1.0 for speedups, a floor). Prints a note and draws nothing without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"no matplotlib: no chart at {path}", file=sys.stderr)
        return
    n = len(series)
    width = 0.8 / n
    x = range(len(labels))
    plt.figure(figsize=figsize)
    for j, (name, values) in enumerate(series.items()):
        plt.bar([i + (j - (n - 1) / 2) * width for i in x], values, width, label=name)
    if hline is not None:
        plt.axhline(hline, color="k", lw=0.8, ls="--" if hline_label else "-", label=hline_label)
    plt.xticks(list(x), labels, rotation=20 if len(labels) > 4 else 0)
    plt.ylabel(ylabel)
    plt.title(title)
    if n > 1 or hline_label:
        plt.legend()
    plt.tight_layout()
    plt.savefig(path)
