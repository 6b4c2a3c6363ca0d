#!/usr/bin/env python3
"""The table of bench/compare/run.sh: medians per scenario and implementation, the dtr/PyTorch
ratios and the sanity checks, printed and written as <out>.md and <out>.json. Standard library
only (the FLOP formula comes from torch_llama_lora.model_flops, the same for both)."""
import argparse
import json
import math
import os
import statistics
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_llama_lora import model_flops  # noqa: E402  (no torch import at module level)

SCEN = {"lora": "LoRA r8", "full": "full FT", "dp": "dp 2x1 LoRA"}
TARGET_RATIO, TARGET_MFU = 1.3, 0.60


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--raw", required=True)
    p.add_argument("--peak", required=True, help="JSON from run.sh's peak measurement")
    p.add_argument("--out", required=True, help="path without extension")
    p.add_argument("--command", default="")
    for k in ("threads", "layers", "seq", "batch", "steps", "warmup"):
        p.add_argument("--" + k, type=int, required=True)
    a = p.parse_args()
    peak = json.loads(a.peak)
    rows = [json.loads(l) for l in open(a.raw) if l.strip()]
    shape = dict(layers=a.layers, hidden=576, intermediate=1536, heads=9, kv_heads=3, vocab=49152, seq=a.seq,
                 batch=a.batch, lora_rank=8)
    ln_v = math.log(shape["vocab"])
    table, checks = [], []
    for s in [k for k in SCEN if any(r["scenario"] == k for r in rows)]:
        world = 2 if s == "dp" else 1
        flops = model_flops(SimpleNamespace(full_ft=(s == "full"), **shape), world)
        res = {}
        for impl in ("dtr", "pytorch"):
            rs = [r for r in rows if r["scenario"] == s and r["impl"] == impl]
            if not rs:
                continue
            step = statistics.median(r["step_ms_median"] for r in rs)
            tps = statistics.median(r["tokens_per_s"] for r in rs)
            gfs = flops / (step / 1e3) * 1e-9
            res[impl] = dict(scenario=s, impl=impl, note=rs[0].get("note", ""), reps=len(rs), step_ms=step,
                             tokens_per_s=tps, model_gflops_per_s=gfs, mfu=gfs / peak["peak_gflops"],
                             peak_rss_mib=statistics.median(r["peak_rss_mib"] for r in rs),
                             step_ms_all=[round(r["step_ms_median"], 1) for r in rs],
                             load_all=[r.get("load") for r in rs],
                             phases={k: statistics.median((r["phases"].get(k) or 0.0) for r in rs)
                                     for k in ("forward_ms", "backward_ms", "optimizer_ms", "comm_exposed_ms")})
            # Sanity: parameter counts, loss near ln(vocab), the implementation's own FLOP count.
            if impl == "dtr":
                cfg = rs[0].get("config", {})
                res[impl]["params_total"], res[impl]["params_trainable"] = cfg.get("params"), cfg.get("trainable_params")
                res[impl]["loss"] = rs[0].get("initial_loss")  # None: dtr reports the last step's loss only
                res[impl]["final_loss"] = rs[0].get("loss")
                own = rs[0].get("model_flops_per_step")
                if own is not None and abs(own - flops) > 1e-6 * flops:
                    checks.append(f"WARN {s}: dtr reports model_flops_per_step {own:.4g}, the formula gives {flops:.4g}")
            else:
                res[impl]["params_total"], res[impl]["params_trainable"] = rs[0]["params_total"], rs[0]["params_trainable"]
                res[impl]["loss"], res[impl]["final_loss"] = rs[0]["initial_loss"], rs[0]["final_loss"]
        if len(res) == 2:
            d, t = res["dtr"], res["pytorch"]
            same = (d["params_total"], d["params_trainable"]) == (t["params_total"], t["params_trainable"])
            checks.append(f"{'ok  ' if same else 'FAIL'} {s}: params dtr {d['params_total']} / trainable "
                          f"{d['params_trainable']}, PyTorch {t['params_total']} / {t['params_trainable']}")
            for impl, r in res.items():
                if r["loss"] is None:
                    continue
                ok = abs(r["loss"] - ln_v) < 0.5
                checks.append(f"{'ok  ' if ok else 'FAIL'} {s}: {impl} initial loss {r['loss']:.4f} vs ln(vocab) {ln_v:.4f}")
            # Same lr, steps and init scale on different random tokens: the last losses agree roughly.
            ok = abs(d["final_loss"] - t["final_loss"]) < 0.25
            checks.append(f"{'ok  ' if ok else 'FAIL'} {s}: loss after {a.warmup + a.steps} steps dtr "
                          f"{d['final_loss']:.4f}, PyTorch {t['final_loss']:.4f}")
        table.append((s, res))

    hdr = ["scenario", "impl", "step ms (median)", "tokens/s", "model GFLOP/s", "MFU", "peak RSS MiB", "fwd/bwd/opt/comm ms", "step ms per rep"]
    lines, md = [], ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    fmt = "{:<12} {:<14} {:>10} {:>9} {:>9} {:>6} {:>9}  {:<22} {}"
    lines.append(fmt.format("scenario", "impl", "step ms", "tok/s", "GFLOP/s", "MFU", "RSS MiB", "fwd/bwd/opt/comm ms", "step ms per rep"))
    ratios = []
    for s, res in table:
        for impl in ("dtr", "pytorch"):
            if impl not in res:
                continue
            r = res[impl]
            name = impl + (f" ({r['note']})" if r["note"] else "")
            cells = [SCEN[s], name, f"{r['step_ms']:.0f}", f"{r['tokens_per_s']:.0f}", f"{r['model_gflops_per_s']:.1f}",
                     f"{100 * r['mfu']:.1f}%", f"{r['peak_rss_mib']:.0f}", "/".join(f"{v:.0f}" for v in r["phases"].values()), " ".join(f"{x:.0f}" for x in r["step_ms_all"])]
            lines.append(fmt.format(*cells))
            md.append("| " + " | ".join(cells) + " |")
        if len(res) == 2:
            d, t = res["dtr"], res["pytorch"]
            rt, rm = d["tokens_per_s"] / t["tokens_per_s"], d["peak_rss_mib"] / t["peak_rss_mib"]
            ratios.append(dict(scenario=s, tokens_per_s_ratio=rt, rss_ratio=rm, dtr_mfu=d["mfu"], pytorch_mfu=t["mfu"]))
            txt = f"dtr/PyTorch {SCEN[s]}: tokens/s x{rt:.2f}, peak RSS x{rm:.2f}"
            if s == "lora":
                txt += (f"   targets: tokens/s >= x{TARGET_RATIO} {'MET' if rt >= TARGET_RATIO else 'NOT MET'}, "
                        f"MFU >= {100 * TARGET_MFU:.0f}% {'MET' if d['mfu'] >= TARGET_MFU else 'NOT MET'} "
                        f"({100 * d['mfu']:.1f}%)")
            lines.append("  " + txt)
            md.append(f"| {SCEN[s]} | **dtr/PyTorch** | | **x{rt:.2f}** | | | x{rm:.2f} | | |")
    cfg = (f"layers {a.layers}, hidden 576, intermediate 1536, heads 9/3, vocab 49152, seq {a.seq}, batch {a.batch} "
           f"(per rank), LoRA r 8 alpha 16, {a.steps} timed steps after {a.warmup} warm-up, {a.threads} threads "
           f"(dp: 2 ranks x 1 thread)")
    pk = (f"SGEMM peak {peak['peak_gflops']:.1f} GFLOP/s at {a.threads} threads = {peak['peak_source']} "
          f"(torch.mm 2048^3 {peak['torch_mm_gflops']:.1f}, dtr-bench gemm 1024^3 {peak['dtr_gemm_best_gflops']:.1f})")
    out = "\n".join([cfg, pk] + lines + checks)
    print(out)
    with open(a.out + ".md", "w") as f:
        f.write(f"Command: `{a.command}`\n\n{cfg}. {pk}; MFU = model GFLOP/s / that peak.\n\n" + "\n".join(md) +
                "\n\n" + "\n".join("- " + c for c in checks) + "\n")
    with open(a.out + ".json", "w") as f:
        json.dump(dict(command=a.command, config=cfg, peak=peak, rows=[r for _, res in table for r in res.values()],
                       ratios=ratios, checks=checks), f, indent=1)
    print(f"written: {a.out}.md, {a.out}.json")


if __name__ == "__main__":
    main()
