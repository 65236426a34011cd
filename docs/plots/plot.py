"""Draws the benchmark plots of docs/benchmarks.md and the dashboard picture of docs/operations.md.

Run by `make plots` (tests/ground/plots.sh: matplotlib in a venv under $LEASEHOLD_CACHE). Reads the
committed data files in docs/plots/data/ and writes PNGs next to this script, so the images in the repo
are always what this script makes of the data: change the data, run `make plots`, commit both.
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
# Fixed metadata so that an unchanged plot is an unchanged file.
SAVE = {"dpi": 110, "metadata": {"Software": None}}
WORKER, KCL, OTHER = "#1f77b4", "#d62728", "#7f7f7f"


def load(name):
    with open(os.path.join(DATA, name)) as f:
        return json.load(f)


def save(fig, name, caption):
    fig.text(0.01, 0.005, caption, fontsize=7, color="#555555", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(os.path.join(HERE, name), **SAVE)
    plt.close(fig)
    print(f"docs/plots/{name}")


def failover(b):
    f, r = b["failover"], b["runtime_failover_handoff"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    for label, color in (("Java KCL 2.5.4 MultiLangDaemon", KCL), ("leasehold-worker", WORKER)):
        trials = f["trials"][label]
        ax.plot(range(1, len(trials) + 1), trials, "o-", color=color, label=label)
    ax.set_xlabel("trial (sorted by time, as the archive records them)")
    ax.set_ylabel("seconds until the survivor processes the shard")
    ax.set_title("Failover after kill -9: worker vs Java KCL")
    ax.set_ylim(0, None)
    ax.set_xticks(range(1, 6))
    ax.legend(fontsize=8)
    names = ["failover kill -9", "handoff SIGTERM"]
    for i, name in enumerate(names):
        m = r[name]
        bx.errorbar([i], [m["median"]], yerr=[[m["median"] - m["min"]], [m["max"] - m["median"]]],
                    fmt="o", color=WORKER, capsize=8)
        bx.hlines(m["target_max"], i - 0.3, i + 0.3, colors=OTHER, linestyles="dashed")
        bx.annotate(f"max {m['max']} s", (i, m["max"]), textcoords="offset points", xytext=(12, 0), fontsize=8)
    bx.set_xticks(range(len(names)), ["failover (kill -9)", "handoff (SIGTERM)"])
    bx.set_xlim(-0.6, 1.6)
    bx.set_ylabel("seconds (median, min-max of 10 trials)")
    bx.set_title("Worker runtime, 10 trials each (dashed: target max)")
    save(fig, "failover.png", f"{f['command']}, {f['date']}; {r['command']}, {r['date']}")


def rebalance(b):
    r = b["rebalance"]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    labels = [run["date"] for run in r["runs"]]
    values = [run["seconds"] for run in r["runs"]]
    ax.bar(range(len(values)), values, color=WORKER)
    ax.axhline(r["target"], color=OTHER, linestyle="dashed", label=f"target {r['target']:.0f} s")
    for i, v in enumerate(values):
        ax.annotate(f"{v} s", (i, v), ha="center", textcoords="offset points", xytext=(0, 3), fontsize=8)
    ax.set_xticks(range(len(values)), labels, rotation=15, ha="right", fontsize=7)
    ax.set_ylabel("seconds to balance")
    ax.set_title("Rebalance 1 -> 10 workers on 100 shards, run by run")
    ax.legend(fontsize=8)
    save(fig, "rebalance.png", r["command"])


def scale(b):
    s = b["scale"]
    sizes = [f"{w} x {n}" for w, n in s["fleet"]]
    x = range(len(sizes))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    for design, color in (("segmented", WORKER), ("full-scan", OTHER)):
        ax.plot(x, s[design]["balanced_s"], "o-", color=color, label=design)
    ax.set_xticks(x, sizes)
    ax.set_xlabel("workers x shards")
    ax.set_ylabel("seconds from start to balanced")
    ax.set_title("Time to balance (every worker starting at once)")
    ax.legend(fontsize=8)
    for design, color in (("segmented", WORKER), ("full-scan", OTHER)):
        bx.plot(x, s[design]["read_units_rest"], "o-", color=color, label=f"{design}: read units")
    bx.plot(x, s["kcl2_arithmetic"]["read_units"], "s--", color=KCL, label="KCL 2 arithmetic: read units")
    bx.plot(x, s["kcl2_arithmetic"]["write_units"], "^:", color=KCL, label="KCL 2 arithmetic: renewal writes")
    bx.plot(x, s["segmented"]["write_units_rest"], "^:", color=WORKER, label="segmented: write units")
    bx.set_xticks(x, sizes)
    bx.set_xlabel("workers x shards")
    bx.set_ylabel("capacity units per shard-hour, at rest")
    bx.set_title("Lease-table cost per shard-hour")
    bx.legend(fontsize=7)
    save(fig, "scale.png", f"{s['date']}, cargo bench -p leasehold-worker --bench scale (docs/benchmarks.md). "
         "full-scan reads beyond 10 x 100 are what the emulator could serve, not the design's cost.")


def throughput(b):
    t = b["throughput"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1, 2]})
    names = list(t["sdk_loop"])
    ax.bar(range(2), [t["sdk_loop"][n] for n in names], color=[WORKER, OTHER])
    ax.set_xticks(range(2), ["leasehold-worker", "plain SDK\nGetRecords loop"])
    ax.set_ylabel("records/s")
    ax.set_title(f"vs a plain SDK loop: ratio {t['sdk_loop'][names[0]] / t['sdk_loop'][names[1]]:.2f}")
    colors = [KCL, WORKER, "#2ca02c"]
    width = 0.27
    for i, (name, rounds) in enumerate(t["kcl_rounds"].items()):
        bx.bar([r + (i - 1) * width for r in range(len(rounds))], rounds, width, label=name, color=colors[i])
    labels = t.get("round_labels") or [f"round {r + 1}" for r in range(len(rounds))]
    bx.set_xticks(range(len(labels)), labels)
    bx.set_ylim(0, 1.35 * max(max(r) for r in t["kcl_rounds"].values()))  # room for the legend
    bx.set_ylabel("records/s (amazon_kclpy sample, 100k records)")
    bx.set_title("vs the Java KCL MultiLangDaemon")
    bx.legend(fontsize=8)
    save(fig, "throughput.png", f"{t['command']}; {t['date']}")


def fanout(b):
    f = b["fanout"]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    modes = ["fan-out", "polling (idleTime 500 ms)"]
    for i, q in enumerate(["p50", "p99"]):
        values = [f[m][q] for m in modes]
        ax.bar([j + (i - 0.5) * 0.35 for j in range(2)], values, 0.35, label=q, color=[WORKER, "#aec7e8"][i])
        for j, v in enumerate(values):
            ax.annotate(f"{v} ms", (j + (i - 0.5) * 0.35, v), ha="center", textcoords="offset points",
                        xytext=(0, 3), fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(range(2), modes)
    ax.set_ylabel("put -> processed (ms, log scale)")
    ax.set_title("Enhanced fan-out vs polling latency (release build)")
    ax.legend(fontsize=8)
    save(fig, "fanout.png", f"{f['command']}, {f['date']}")


def dashboard():
    path = os.path.join(DATA, "dashboard.json")
    if not os.path.exists(path):
        print("docs/plots/data/dashboard.json missing: dashboard.png left as it is", file=sys.stderr)
        return
    d = load("dashboard.json")
    panels = [p for p in d["panels"] if p["series"]]
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(15, 3.1 * rows), squeeze=False)
    t0 = min(float(v[0][0]) for p in panels for s in p["series"] for v in [s["values"]] if v)
    for ax, panel in zip([a for row in axes for a in row], panels):
        for s in panel["series"][:8]:
            legend = s["legend"] or ""
            for key, value in s["metric"].items():
                legend = legend.replace("{{" + key + "}}", value)
            xs = [float(v[0]) - t0 for v in s["values"]]
            ys = [float(v[1]) if v[1] not in ("NaN", "+Inf", "-Inf") else float("nan") for v in s["values"]]
            ax.plot(xs, ys, label=legend[:40], linewidth=1)
        ax.set_title(panel["title"][:60], fontsize=9)
        ax.set_xlabel("seconds into the run", fontsize=7)
        ax.set_ylabel(panel["unit"], fontsize=7)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6, loc="upper left")
    for ax in [a for row in axes for a in row][len(panels):]:
        ax.axis("off")
    fig.suptitle("Leasehold dashboard queries on the live test's Prometheus (operator/tests/prometheus_live.rs)")
    save(fig, "dashboard.png", "LEASEHOLD_DASHBOARD_DATA=docs/plots/data/dashboard.json LEASEHOLD_DASHBOARD_SECONDS=90 "
         "cargo test -p leasehold-operator --test prometheus_live; make plots")


def spread(b):
    s = b.get("spread")
    if not s:
        print("no spread data in benchmarks.json: spread.png left as it is", file=sys.stderr)
        return
    runs = [r for r in s["runs"] if r.get("ordering", "key") == "key"]
    shapes = list(dict.fromkeys(r["shape"] for r in runs))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    colors = {"count": OTHER, "load": WORKER}
    for j, balance in enumerate(("count", "load")):
        xs = [i + (j - 0.5) * 0.35 for i in range(len(shapes))]
        mine = [next((r for r in runs if r["shape"] == sh and r["balance"] == balance), None) for sh in shapes]
        ratios = [r["busiest_over_best"] if r else 0 for r in mine]
        ax.bar(xs, ratios, 0.35, color=colors[balance], label=f"lease.balance: {balance}")
        for x, r in zip(xs, mine):
            if r:
                settled = r["settled_after_s"]
                label = f"{r['busiest_over_best']:.2f}\n{r['moves']:.0f} mv"
                label += f"\n{settled:.0f} s" if settled is not None else "\nnever"
                ax.annotate(label, (x, r["busiest_over_best"]), textcoords="offset points", xytext=(0, 3),
                            ha="center", fontsize=6.5)
        processed = [r["processed_per_s"] if r else 0 for r in mine]
        bx.bar(xs, processed, 0.35, color=colors[balance], label=f"{balance}: processed")
        for x, r in zip(xs, mine):
            if r:
                bx.hlines(r["produced_per_s"], x - 0.17, x + 0.17, colors=KCL, linestyles="dashed")
    ax.axhline(1.15, color=KCL, linestyle="dotted", linewidth=1)
    ax.set_xticks(range(len(shapes)), [f"{sh} stream" for sh in shapes])
    ax.set_ylim(0, 2.3)
    ax.set_ylabel("busiest worker / best achievable (end of run)")
    ax.set_title("Spread of a skewed stream, 4 workers (dotted: 1.15)")
    ax.legend(fontsize=8, loc="upper right")
    bx.set_xticks(range(len(shapes)), [f"{sh} stream" for sh in shapes])
    bx.set_ylabel("records/s over the run's last 40 s")
    bx.set_title("Group's records/s (dashed: the producer's)")
    bx.legend(fontsize=8, loc="lower right")
    save(fig, "spread.png", f"{s['command']}, {s['date']}")


def main():
    b = load("benchmarks.json")
    failover(b)
    rebalance(b)
    scale(b)
    throughput(b)
    fanout(b)
    spread(b)
    dashboard()


if __name__ == "__main__":
    main()
