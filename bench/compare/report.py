#!/usr/bin/env python3
"""The tables of bench/compare/run.sh (one run) and quiet_window.sh (several runs into one raw
file): medians per scenario, tag and implementation, the dtr/PyTorch ratios, MFU against the two
peaks (the SGEMM peak measured in the run and the theoretical FMA peak of `dtr-bench cpu-peak`),
the sequence-length scaling table, dtr's per-op-family profile, the real recipe's row and the
GEMM table; printed and written as <out>.md and <out>.json. Standard library only (the FLOP
formula comes from torch_llama_lora.model_flops, the same for both implementations)."""
import argparse
import json
import math
import os
import statistics
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_llama_lora import model_flops  # noqa: E402  (no torch import at module level)

SCEN = {"lora": "LoRA r8", "full": "full FT", "dp": "dp 2x1 LoRA", "dp4": "dp 4x1 LoRA", "gemma3": "Gemma3 LoRA",
        "qwen3": "Qwen3 LoRA"}
# Families (run.sh gemma3 / qwen3, families.sh): the model is the dtr row's config, the FLOPs the
# PyTorch row's (torch_family_lora.model_flops on the config.json both sides built), checked
# against dtr's own count like the Llama's.
FAMILIES = ("gemma3", "qwen3")
WORLD = {"dp": 2, "dp4": 4}
# Targets of issue 24 (tokens/s ratio, MFU against the measured SGEMM peak).
TARGETS = {"lora": (1.5, 0.85), "full": (1.4, 0.80), "dp": (1.8, None)}
COMM_TARGET = 0.05  # exposed FSDP communication per step, dp 2 and 4
MODEL = dict(hidden=576, intermediate=1536, heads=9, kv_heads=3, vocab=49152, lora_rank=8)


def shape_of(r, a):
    """The row's own shape (recorded by run.sh), else the command line's."""
    s = r.get("shape") or {}
    return {k: s.get(k, getattr(a, k)) for k in ("layers", "seq", "batch", "steps", "warmup", "threads")}


def attention_flops(sh, world):
    """The attention term of model_flops: 3 x 4 L B S^2 H D (forward + 2x backward)."""
    return 12 * sh["layers"] * sh["batch"] * world * sh["seq"] ** 2 * MODEL["hidden"]


def summarise(rows, a, peak):
    """[(scenario, tag, {impl: summary})] in first-seen order, plus the sanity checks."""
    keys = []
    for r in rows:
        k = (r["scenario"], r.get("tag", ""))
        if k not in keys:
            keys.append(k)
    ln_v = math.log(MODEL["vocab"])
    theo = (peak.get("theoretical") or {}).get("peak_gflops")
    out, checks = [], []
    for s, tag in keys:
        world = WORLD.get(s, 1)
        res = {}
        mine = [r for r in rows if r["scenario"] == s and r.get("tag", "") == tag]
        fam = None
        if s in FAMILIES:  # (flops, vocab) of the family's config
            ref = next((r for r in mine if r["impl"] == "pytorch"), mine[0])
            fam = (ref["model_flops_per_step"], next((r["config"]["vocab"] for r in mine if r["impl"] == "dtr"), None),
                   ref.get("attention_flops_per_step", 0))
        ln_v = math.log(fam[1]) if fam and fam[1] else math.log(MODEL["vocab"])
        for impl in ("dtr", "pytorch"):
            rs = [r for r in rows if r["scenario"] == s and r.get("tag", "") == tag and r["impl"] == impl]
            if not rs:
                continue
            sh = shape_of(rs[0], a)
            flops = fam[0] if fam else model_flops(SimpleNamespace(full_ft=(s == "full"), **MODEL, **sh), world)
            att = fam[2] if fam else attention_flops(sh, world)
            step = statistics.median(r["step_ms_median"] for r in rs)
            gfs = flops / (step / 1e3) * 1e-9
            mid = sorted(rs, key=lambda r: r["step_ms_median"])[len(rs) // 2]  # the median rep
            d = dict(scenario=s, tag=tag, impl=impl, note=rs[0].get("note", ""), reps=len(rs), shape=sh, world=world,
                     step_ms=step, tokens_per_s=statistics.median(r["tokens_per_s"] for r in rs),
                     model_gflops_per_s=gfs, mfu=gfs / peak["peak_gflops"], mfu_theoretical=gfs / theo if theo else None,
                     attention_flop_share=att / flops, attention_flops=att, flops=flops,
                     peak_rss_mib=statistics.median(r["peak_rss_mib"] for r in rs),
                     step_ms_all=[round(r["step_ms_median"], 1) for r in rs], load_all=[r.get("load") for r in rs],
                     phases={k: statistics.median((r["phases"].get(k) or 0.0) for r in rs)
                             for k in ("forward_ms", "backward_ms", "optimizer_ms", "comm_exposed_ms",
                                       "comm_exposed_last_rank_ms", "comm_waiting_for_slower_rank_ms")},
                     op_families_ms=mid.get("op_families_ms"), op_families=mid.get("op_families"),
                     floor=mid.get("floor"))
            if impl == "dtr":
                cfg = rs[0].get("config", {})
                d["params_total"], d["params_trainable"] = cfg.get("params"), cfg.get("trainable_params")
                d["model_config"] = cfg
                d["loss"], d["final_loss"] = rs[0].get("initial_loss"), rs[0].get("loss")  # dtr: last step only
                own = rs[0].get("model_flops_per_step")
                if own is not None and abs(own - flops) > 1e-6 * flops:
                    checks.append(f"WARN {s} {tag}: dtr reports model_flops_per_step {own:.4g}, the formula gives {flops:.4g}")
            else:
                d["params_total"], d["params_trainable"] = rs[0]["params_total"], rs[0]["params_trainable"]
                d["loss"], d["final_loss"] = rs[0]["initial_loss"], rs[0]["final_loss"]
            res[impl] = d
        if len(res) == 2:
            dd, t = res["dtr"], res["pytorch"]
            name = f"{s}{' ' + tag if tag else ''}"
            same = (dd["params_total"], dd["params_trainable"]) == (t["params_total"], t["params_trainable"])
            checks.append(f"{'ok  ' if same else 'FAIL'} {name}: params dtr {dd['params_total']} / trainable "
                          f"{dd['params_trainable']}, PyTorch {t['params_total']} / {t['params_trainable']}")
            for impl, x in res.items():
                if x["loss"] is not None:
                    ok = abs(x["loss"] - ln_v) < 0.5
                    checks.append(f"{'ok  ' if ok else 'FAIL'} {name}: {impl} initial loss {x['loss']:.4f} vs ln(vocab) {ln_v:.4f}")
            n_steps = dd["shape"]["warmup"] + dd["shape"]["steps"]
            ok = abs(dd["final_loss"] - t["final_loss"]) < 0.25
            checks.append(f"{'ok  ' if ok else 'FAIL'} {name}: loss after {n_steps} steps dtr {dd['final_loss']:.4f}, "
                          f"PyTorch {t['final_loss']:.4f}")
        out.append((s, tag, res))
    return out, checks


def label(s, tag, sh):
    txt = SCEN[s] + (f" {tag}" if tag else "")
    return txt


def main_table(table, has_theo):
    hdr = ["scenario", "impl", "layers / seq x batch", "step ms (median)", "tokens/s", "model GFLOP/s", "MFU (SGEMM)"]
    hdr += ["MFU (FMA peak)"] if has_theo else []
    hdr += ["peak RSS MiB", "fwd/bwd/opt/comm ms", "step ms per rep", "load"]
    md = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    txt, ratios = [], []
    for s, tag, res in table:
        for impl in ("dtr", "pytorch"):
            if impl not in res:
                continue
            r = res[impl]
            sh = r["shape"]
            cells = [label(s, tag, sh), impl + (f" ({r['note']})" if r["note"] else ""),
                     f"{sh['layers']} / {sh['seq']} x {sh['batch']}" + (f" x {r['world']} ranks" if r["world"] > 1 else ""),
                     f"{r['step_ms']:.0f}", f"{r['tokens_per_s']:.0f}", f"{r['model_gflops_per_s']:.1f}", f"{100 * r['mfu']:.1f}%"]
            cells += [f"{100 * r['mfu_theoretical']:.1f}%"] if has_theo else []
            cells += [f"{r['peak_rss_mib']:.0f}", "/".join(f"{v:.0f}" for v in r["phases"].values()),
                      " ".join(f"{x:.0f}" for x in r["step_ms_all"]), " ".join(str(x) for x in r["load_all"])]
            md.append("| " + " | ".join(cells) + " |")
            txt.append("  ".join(cells))
        if len(res) == 2:
            d, t = res["dtr"], res["pytorch"]
            rt, rm = d["tokens_per_s"] / t["tokens_per_s"], d["peak_rss_mib"] / t["peak_rss_mib"]
            ratios.append(dict(scenario=s, tag=tag, tokens_per_s_ratio=rt, rss_ratio=rm, dtr_mfu=d["mfu"],
                               pytorch_mfu=t["mfu"], dtr_mfu_theoretical=d["mfu_theoretical"]))
            line = f"dtr/PyTorch {label(s, tag, d['shape'])}: tokens/s x{rt:.2f}, peak RSS x{rm:.2f}"
            if not tag and s in TARGETS:
                tr, tm = TARGETS[s]
                line += f"   target x{tr}: {'MET' if rt >= tr else 'NOT MET'}"
                if tm is not None:
                    line += f"; MFU >= {100 * tm:.0f}%: {'MET' if d['mfu'] >= tm else 'NOT MET'} ({100 * d['mfu']:.1f}%)"
            if s.startswith("dp"):
                step = d["step_ms"]
                c = d["phases"]["comm_exposed_ms"]
                line += (f"   comm exposed {c:.0f} ms = {100 * c / step:.1f}% of the step "
                         f"(target < {100 * COMM_TARGET:.0f}%: {'MET' if c < COMM_TARGET * step else 'NOT MET'})")
                last, skew = d["phases"]["comm_exposed_last_rank_ms"], d["phases"]["comm_waiting_for_slower_rank_ms"]
                if last or skew:
                    line += (f"; of it not hidden on any rank {last:.0f} ms = {100 * last / step:.1f}%, "
                             f"waiting for a slower rank {skew:.0f} ms")
            txt.append("  " + line)
            md.append(f"| {label(s, tag, d['shape'])} | **dtr/PyTorch** | | | **x{rt:.2f}** | | |" + (" |" if has_theo else "")
                      + f" x{rm:.2f} | | | |")
            md_notes.append(line)
    return md, txt, ratios


md_notes = []


def seq_table(table):
    """Rows tagged seq*: tokens/s and peak RSS of both, attention's share of dtr's step (measured)
    beside its share of the model FLOPs (formula)."""
    rows = [(s, tag, res) for s, tag, res in table if tag.startswith("seq") and "dtr" in res]
    if not rows:
        return [], []
    hdr = ["seq x batch", "dtr tokens/s", "PyTorch tokens/s", "dtr/PyTorch", "dtr MFU (SGEMM)", "dtr peak RSS MiB",
           "PyTorch peak RSS MiB", "RSS dtr/PyTorch", "attention share of dtr's step", "attention share of model FLOPs"]
    md = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for s, tag, res in rows:
        d, t = res["dtr"], res.get("pytorch")
        fam = d.get("op_families_ms") or {}
        att = fam.get("attention")
        cells = [f"{d['shape']['seq']} x {d['shape']['batch']}", f"{d['tokens_per_s']:.0f}",
                 f"{t['tokens_per_s']:.0f}" if t else "-", f"x{d['tokens_per_s'] / t['tokens_per_s']:.2f}" if t else "-",
                 f"{100 * d['mfu']:.1f}%", f"{d['peak_rss_mib']:.0f}", f"{t['peak_rss_mib']:.0f}" if t else "-",
                 f"x{d['peak_rss_mib'] / t['peak_rss_mib']:.2f}" if t else "-",
                 f"{100 * att / d['step_ms']:.1f}%" if att is not None else "-", f"{100 * d['attention_flop_share']:.1f}%"]
        md.append("| " + " | ".join(cells) + " |")
    return md, ["  ".join(c.strip() for c in l.strip("|").split("|")) for l in md[:1] + md[2:]]


def floor_of(d, peak, per_rank):
    """The floor step of dtr's row (ms, rank 0's op profile): GEMM + attention FLOPs at the run's
    SGEMM peak, every other op family's bytes at the run's triad bandwidth (both per rank: dp ranks
    x 1 thread share the machine); train-step's own figures where the run has no triad. None
    without the per-family bytes / FLOPs (an older dtr-bench)."""
    fams, own = d.get("op_families"), d.get("floor") or {}
    if not fams:
        return None
    pk = peak["peak_gflops"] * 1e9 / per_rank
    tri = ((peak.get("theoretical") or {}).get("triad_gb_per_s") or 0) * 1e9 / per_rank or own.get("triad_bytes_per_s")
    per = {}
    for k, f in fams.items():
        if f.get("bound") == "sgemm_peak":
            per[k] = 1e3 * f["flops"] / pk
        else:
            per[k] = 1e3 * f["bytes"] / tri if tri else 0.0
    return dict(per_family_ms=per, step_ms=sum(per.values()), peak_flops=pk, triad_bytes_per_s=tri)


def profile_table(table, peak):
    """dtr's per-op-family ms per step (median rep) of the untagged scenarios: where the step goes,
    and two bounds: the GEMM family's own rate (matmul FLOPs = model FLOPs - attention, over the
    gemm ms; the op profile is rank 0's, i.e. per rank under dp) against the SGEMM peak, and the
    MFU the step would have if everything outside the GEMMs took no time. Then the floor
    (floor_of): each family's own limit in ms beside its measured ms, the floor step, the MFU it
    implies and the dtr/PyTorch tokens/s ratio it implies (PyTorch's measured step / the floor)."""
    cols = [(s, tag, res["dtr"]) for s, tag, res in table if "dtr" in res and res["dtr"].get("op_families_ms")
            and not tag]
    torch_ms = {s: res["pytorch"]["step_ms"] for s, tag, res in table if "pytorch" in res and not tag}
    if not cols:
        return []
    fams = []
    for _, _, d in cols:
        for k in sorted(d["op_families_ms"], key=lambda k: -d["op_families_ms"][k]):
            if k not in fams:
                fams.append(k)
    hdr = ["op family (dtr, ms per step / % of step)"] + [label(s, tag, d["shape"]) for s, tag, d in cols]
    md = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for k in fams:
        cells = [k]
        for _, _, d in cols:
            v = d["op_families_ms"].get(k)
            fl = floor_of(d, peak, d["world"] if d["world"] > 1 else 1)
            lim = fl["per_family_ms"].get(k) if fl else None
            cells.append("-" if v is None else f"{v:.0f} ({100 * v / d['step_ms']:.1f}%)"
                         + (f", floor {lim:.0f}" if lim is not None else ""))
        md.append("| " + " | ".join(cells) + " |")
    rate, bound = ["GEMM family GFLOP/s (% of SGEMM peak)"], ["MFU if only the GEMMs took time"]
    for s, _, d in cols:
        g = d["op_families_ms"].get("gemm")
        per_rank = d["world"] if d["world"] > 1 else 1
        att = d["attention_flops"]
        if not g or not d.get("flops"):
            rate.append("-"), bound.append("-")
            continue
        gf = (d["flops"] - att) / per_rank / (g / 1e3) * 1e-9  # the op profile is rank 0's
        peak_rank = peak["peak_gflops"] / per_rank  # dp: ranks x 1 thread share the machine's peak
        rate.append(f"{gf:.1f} ({100 * gf / peak_rank:.1f}%)")
        bound.append(f"{100 * d['mfu'] * d['step_ms'] / g:.1f}%")
    md.append("| " + " | ".join(rate) + " |")
    md.append("| " + " | ".join(bound) + " |")
    fstep, fmfu, fratio = ["floor step ms (measured step / floor)"], ["MFU at the floor"], ["dtr/PyTorch at the floor"]
    for s, _, d in cols:
        per_rank = d["world"] if d["world"] > 1 else 1
        fl = floor_of(d, peak, per_rank)
        if not fl or fl["step_ms"] <= 0:
            fstep.append("-"), fmfu.append("-"), fratio.append("-")
            continue
        fstep.append(f"{fl['step_ms']:.0f} (x{d['step_ms'] / fl['step_ms']:.2f})")
        fmfu.append(f"{100 * d['flops'] / per_rank / (fl['step_ms'] / 1e3) / fl['peak_flops']:.1f}%")
        fratio.append(f"x{torch_ms[s] / fl['step_ms']:.2f}" if s in torch_ms else "-")
    if len(fstep) > 1 and any(c != "-" for c in fstep[1:]):
        md += ["| " + " | ".join(r) + " |" for r in (fstep, fmfu, fratio)]
    return md


def recipe_rows(path):
    """dtr-train's metrics.jsonl of the real recipe (quiet_window.sh): median tokens/s and step
    time over the steps after the first (which pays the first-touch allocations), max RSS."""
    if not path or not os.path.exists(path):
        return None
    ms = [json.loads(l) for l in open(path) if l.strip().startswith("{")]
    ms = [m for m in ms if "tokens_per_s" in m]
    if len(ms) < 2:
        return None
    timed = ms[1:]
    return dict(steps=len(ms), timed_steps=len(timed), tokens_per_s=statistics.median(m["tokens_per_s"] for m in timed),
                step_ms=1e3 * statistics.median(m["step_time_s"] for m in timed),
                mfu=statistics.median(m["mfu"] for m in timed) if all("mfu" in m for m in timed) else None,
                peak_rss_mib=max(m.get("peak_rss_bytes", 0) for m in ms) / 2**20,
                peak_live_mib=max(m.get("peak_mem_bytes", 0) for m in ms) / 2**20,
                first_loss=ms[0].get("loss"), last_loss=ms[-1].get("loss"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--raw", required=True)
    p.add_argument("--peak", required=True, help="JSON from run.sh's peak measurement")
    p.add_argument("--out", required=True, help="path without extension")
    p.add_argument("--command", default="")
    p.add_argument("--gemm", help="dtr-bench gemm output to include (run.sh writes <raw>.gemm.txt)")
    p.add_argument("--recipe", help="dtr-train metrics.jsonl of the real recipe")
    p.add_argument("--recipe-desc", default="")
    for k, v in (("threads", os.cpu_count()), ("layers", 8), ("seq", 256), ("batch", 4), ("steps", 5), ("warmup", 1)):
        p.add_argument("--" + k, type=int, default=v, help="shape of rows that do not record their own")
    a = p.parse_args()
    peak = json.loads(a.peak)
    rows = [json.loads(l) for l in open(a.raw) if l.strip()]
    table, checks = summarise(rows, a, peak)
    theo = peak.get("theoretical") or {}
    md_notes.clear()
    md, txt, ratios = main_table(table, bool(theo))
    pk = (f"SGEMM peak {peak['peak_gflops']:.1f} GFLOP/s at {a.threads} threads = {peak['peak_source']} "
          f"(torch.mm 2048^3 {peak['torch_mm_gflops']:.1f}, dtr-bench gemm 1024^3 {peak['dtr_gemm_best_gflops']:.1f})")
    if theo:
        pk += (f". Theoretical FMA peak {theo['peak_gflops']:.1f} GFLOP/s = {theo['derivation']}; the measured FMA "
               f"loop on all cores reached {theo['fma_loop_gflops']:.1f}; the SGEMM peak is "
               f"{100 * peak['peak_gflops'] / theo['peak_gflops']:.1f}% of it")
        if theo.get("triad_gb_per_s"):
            pk += (f". Memory bandwidth (STREAM triad, all cores) {theo['triad_gb_per_s']:.1f} GB/s: the limit of the "
                   f"memory-bound ops (an op moving B bytes takes at least B / that)")
    cfg = ("Model: SmolLM2-135M shape (hidden 576, intermediate 1536, heads 9/3, vocab 49152, tied), LoRA r 8 alpha 16; "
           "each row's layers / seq x batch (per rank) in the table; dp: ranks x 1 thread")
    if table and all(s in FAMILIES for s, _, _ in table):
        cfg = "LoRA r 8 alpha 16; each row's layers / seq x batch in the table"
    for s, _, res in table:
        c = res["dtr"].get("model_config") if "dtr" in res and s in FAMILIES else None
        if c:
            cfg += (f"; {SCEN[s]}: {c.get('model_type')}, hidden {c.get('hidden')}, intermediate {c.get('intermediate')}, "
                    f"heads {c.get('heads')}/{c.get('kv_heads')}, head_dim {c.get('head_dim')}, vocab {c.get('vocab')} "
                    f"(config of {os.path.basename(c.get('model') or '?')})")
    sq_md, sq_txt = seq_table(table)
    prof = profile_table(table, peak)
    rec = recipe_rows(a.recipe)
    out = [cfg, pk] + txt
    if sq_txt:
        out += ["", "sequence-length scaling (tokens per step equal):"] + sq_txt
    if prof:
        out += ["", "dtr per-op-family profile (ms per step):"] + ["  ".join(c.strip() for c in l.strip("|").split("|"))
                                                                  for l in prof[:1] + prof[2:]]
    rec_line = None
    if rec:
        rec_line = (f"real recipe ({a.recipe_desc}): {rec['tokens_per_s']:.0f} tokens/s, step {rec['step_ms']:.0f} ms "
                    f"(median of {rec['timed_steps']} steps after the first)"
                    + (f", MFU {100 * rec['mfu']:.1f}% (dtr-train's own peak)" if rec["mfu"] is not None else "")
                    + f", peak RSS {rec['peak_rss_mib']:.0f} MiB (max over ranks), live peak {rec['peak_live_mib']:.0f} MiB, "
                    f"loss {rec['first_loss']:.3f} -> {rec['last_loss']:.3f}")
        out += ["", rec_line]
    gemm = open(a.gemm).read().rstrip() if a.gemm and os.path.exists(a.gemm) else None
    if gemm:
        out += ["", gemm]
    out += [""] + checks
    print("\n".join(out))
    with open(a.out + ".md", "w") as f:
        f.write(f"Command: `{a.command}`\n\n{cfg}. {pk}; MFU = model GFLOP/s / that peak.\n\n" + "\n".join(md) + "\n\n")
        f.write("\n".join("- " + n for n in md_notes) + "\n")
        if sq_md:
            f.write("\n**Sequence-length scaling** (LoRA, tokens per step equal):\n\n" + "\n".join(sq_md) + "\n")
        if prof:
            f.write("\n**dtr's step by op family** (median rep; `(outside ops)` = autograd, hooks, comm):\n\n"
                    + "\n".join(prof) + "\n")
        if rec_line:
            f.write("\n**Real recipe**: " + rec_line + "\n")
        if gemm:
            f.write("\n**GEMM** (`dtr-bench gemm`, same run):\n\n```\n" + gemm + "\n```\n")
        f.write("\n" + "\n".join("- " + c for c in checks) + "\n")
    with open(a.out + ".json", "w") as f:
        json.dump(dict(command=a.command, config=cfg, peak=peak, rows=[r for _, _, res in table for r in res.values()],
                       ratios=ratios, recipe=rec, checks=checks), f, indent=1)
    print(f"written: {a.out}.md, {a.out}.json")


if __name__ == "__main__":
    main()
