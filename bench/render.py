#!/usr/bin/env python3
"""Rewrites the generated part of docs/performance.md from bench/out/results.tsv.

Usage: render.py RESULTS_TSV META_FILE SIM_OUTPUT_OR_EMPTY DOC
Only the text between `<!-- bench:begin -->` and `<!-- bench:end -->` is replaced; the prose
around it (the analysis of missed targets) is kept.
"""
import csv
import sys
from collections import OrderedDict

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
SECTIONS = OrderedDict([
    ("launch", "Launch: 1 node, workers run `true`, start to exit"),
    ("rendezvous", "Rendezvous: N agents on 127.0.0.1 until every worker runs"),
    ("failure", "Failure to full stop"),
    ("restart", "Restart after a failure (zero backoff)"),
    ("memory", "Agent peak memory"),
    ("nostart", "A node that never starts"),
    ("logs", "Log throughput"),
    ("check", "`ddprun check` on the examples"),
])


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def fmt(v, unit):
    x = num(v)
    if x is None:
        return v
    if unit == "s":
        return f"{x * 1000:.1f} ms" if x < 1 else f"{x:.3f} s"
    if unit == "MiB":
        return f"{x:.1f} MiB"
    if unit == "MB/s":
        return f"{x:.0f} MB/s"
    if unit == "count":
        return f"{x:.0f}"
    return v


def load(path):
    rows = []
    with open(path, newline="") as f:
        for r in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            if len(r) < 10:
                continue
            keys = ["id", "section", "label", "impl", "median", "min", "max", "runs", "unit", "cmd"]
            rows.append(dict(zip(keys, r[:9] + ["\t".join(r[9:])])))
    return rows


def find(rows, rid, impl=None, label_has=None):
    for r in rows:
        if r["id"] == rid and (impl is None or r["impl"] == impl) and (
                label_has is None or label_has in r["label"]):
            return r
    return None


def summary(rows):
    out = ["| measure | ddprun | torchrun | torchrun / ddprun | target | met |", "|---|---|---|---|---|---|"]

    def line(measure, d, t, target, ok, unit="s"):
        dv, tv = (num(d["median"]) if d else None), (num(t["median"]) if t else None)
        ratio = (f"{tv / dv:.0f}x" if tv / dv >= 10 else f"{tv / dv:.2f}x") if dv and tv else "-"
        out.append(f"| {measure} | {fmt(d['median'], unit) if d else '-'} | "
                   f"{(fmt(t['median'], unit) + ' (' + t['impl'] + ')') if t else '-'} | {ratio} | {target} | "
                   f"{'yes' if ok else 'no' if ok is not None else '-'} |")

    def fastest_torchrun(rid):
        ts = [r for r in rows if r["id"] == rid and r["impl"].startswith("torchrun") and num(r["median"])]
        return min(ts, key=lambda r: num(r["median"])) if ts else None

    for n in (1, 8):
        d, t = find(rows, f"launch-{n}", "ddprun"), fastest_torchrun(f"launch-{n}")
        ok = None
        if d and t:
            ok = num(d["median"]) < 0.05 and num(t["median"]) / num(d["median"]) >= 20
        line(f"launch, 1 node x {n} `true`", d, t, "< 50 ms and >= 20x faster than the faster torchrun", ok)
    for n in (2, 8):
        d, t = find(rows, f"rdzv-{n}-last", "ddprun"), find(rows, f"rdzv-{n}-last", "torchrun")
        line(f"rendezvous, {n} agents (from the last agent's launch)", d, t, "-", None)
    d, t = find(rows, "fail-full", "ddprun"), find(rows, "fail-full", "torchrun")
    rc_d, rc_t = find(rows, "fail-rc", "ddprun"), find(rows, "fail-rc", "torchrun")
    ok = None
    if d and rc_d:
        codes = [c.strip() for c in rc_d["median"].split(";")]
        ok = num(d["max"]) < 0.5 and all(c == "1 / 1" for c in codes)
    line("failure -> every worker and agent stopped", d, t, "< 0.5 s, every agent exits 1", ok)
    out.append(f"| ... agent exit codes node 0 / node 1 | {rc_d['median'] if rc_d else '-'} | "
               f"{rc_t['median'] if rc_t else '-'} | | every agent exits 1 | {'yes' if ok else 'no'} |")
    d = find(rows, "restart-last", "ddprun")
    t = min((r for r in rows if r["id"] == "restart-last" and r["impl"].startswith("torchrun") and num(r["median"])),
            key=lambda r: num(r["median"]), default=None)
    line("failure -> next round's last worker runs", d, t, "-", None)
    mem_d = [r for r in rows if r["section"] == "memory" and r["impl"] == "ddprun" and num(r["median"])]
    mem_d += [r for r in rows if r["id"] == "logs-mem"]
    mem_t = [r for r in rows if r["section"] == "memory" and r["impl"] == "torchrun" and num(r["median"])]
    if mem_d:
        d = max(mem_d, key=lambda r: num(r["max"]))
        t = max(mem_t, key=lambda r: num(r["max"])) if mem_t else None
        line("agent peak memory (largest case)", d, t, "< 15 MB", num(d["max"]) < 15, "MiB")
    d, t = find(rows, "nostart-time", "ddprun"), find(rows, "nostart-time", "torchrun")
    say = find(rows, "nostart-say", "ddprun")
    if d:
        ok = num(d["median"]) is not None and num(d["median"]) < 21 and say and "node 1" in say["median"]
        out.append(f"| node 1 never starts: node 0 gives up | {fmt(d['median'], 's')} | "
                   f"{(fmt(t['median'], 's') + (' s' if num(t['median']) is None else '')) if t else '-'} | - | the rendezvous timeout (20 s), naming the node | "
                   f"{'yes' if ok else 'no'} |")
    base = find(rows, "logs-rate", "straight to files (no launcher)")
    for impl in ('ddprun, logs.console = "all"', 'ddprun, logs.console = "none"', "torchrun --redirects 1 --tee 1"):
        r = find(rows, "logs-rate", impl)
        if base and r and num(r["median"]):
            slow = num(base["median"]) / num(r["median"])
            target = "within 1.5x of straight-to-file" if impl.startswith("ddprun") else "-"
            ok = slow <= 1.5 if impl.startswith("ddprun") else None
            out.append(f"| log throughput, {impl} | {fmt(r['median'], 'MB/s')} | | "
                       f"{slow:.2f}x slower than straight to files ({fmt(base['median'], 'MB/s')}) | {target} | "
                       f"{'yes' if ok else 'no' if ok is not None else '-'} |")
    for r in rows:
        if r["id"] == "check":
            out.append(f"| {r['label']} | {fmt(r['median'], 's')} | | | < 20 ms | "
                       f"{'yes' if num(r['median']) < 0.02 else 'no'} |")
    return out


def section_table(rows, sec):
    out = ["| # | figure | launcher | median | min | max | runs |", "|---|---|---|---|---|---|---|"]
    cmds = OrderedDict()
    k = 0
    for r in rows:
        if r["section"] != sec:
            continue
        k += 1
        cmd = r["cmd"]
        if cmd not in cmds:
            cmds[cmd] = []
        cmds[cmd].append(str(k))
        u = r["unit"]
        out.append(f"| {k} | {r['label']} | {r['impl']} | {fmt(r['median'], u)} | {fmt(r['min'], u)} | "
                   f"{fmt(r['max'], u)} | {r['runs']} |")
    out.append("")
    out.append("Commands (rows):")
    out.append("")
    for cmd, ks in cmds.items():
        if cmd.startswith("see the row above"):
            continue
        out.append(f"* {', '.join(ks)}: `{cmd}`")
    return out


def main():
    results, meta_path, sim_path, doc = sys.argv[1:5]
    rows = load(results)
    meta = open(meta_path).read().strip().splitlines()
    gen = [BEGIN, "", "<!-- generated by bench/run.sh; edit the prose outside these markers -->", ""]
    gen += ["### Machine and versions", ""] + [f"* {m}" for m in meta] + [""]
    gen += ["### Summary", ""] + summary(rows) + [""]
    for sec, title in SECTIONS.items():
        if not any(r["section"] == sec for r in rows):
            continue
        gen += [f"### {title}", ""] + section_table(rows, sec) + [""]
    gen += ["### Simulator scale", ""]
    sim = open(sim_path).read().strip() if sim_path and sim_path != "-" else ""
    if sim:
        body = [sim] if sim.startswith("|") else ["```", sim, "```"]
        gen += ["Output of `bench/sim_scale.sh BUILD_DIR` (run by bench/run.sh; see that script for what it measures):", ""] + body + [""]
    else:
        gen += ["| figure | value |", "|---|---|",
                "| simulator rows (bench/sim_scale.sh) | **not measured yet**: bench/sim_scale.sh does not exist yet |", ""]
    gen += [END]
    text = open(doc).read()
    a, b = text.index(BEGIN), text.index(END) + len(END)
    open(doc, "w").write(text[:a] + "\n".join(gen) + text[b:])


if __name__ == "__main__":
    main()
