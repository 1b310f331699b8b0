"""The one-row GEMV kernel (toolkit/infer/kernels/gemv.py) against what the engine ran before it, on a GPU.

    python benchmarks/bench_gemv.py                 # Llama-3.1-8B's decode GEMVs and the EAGLE-3 head's, bf16
    python benchmarks/bench_gemv.py --sweep --write-configs toolkit/infer/kernels/gemv_configs.json
                                                    # try every config, keep each shape's best for this device

For each GEMV of a batch-1 decode step: cuBLAS alone (F.linear), the old sequence of kernels (Triton RMSNorm /
SiLU-mul, then cuBLAS, then the residual add), and the fused kernel, in us and in GB/s of weights streamed.
Each figure is a CUDA-graph replay over enough weight copies (>= 256 MB) that the 50 MB L2 cannot hold them,
median of 15 replays. Correctness: ||fused - reference|| / ||reference|| per shape (bf16 operands: < 1e-2); the
sweep times only the configs within that bound.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
from triton.runtime.errors import OutOfResources

from toolkit.infer.kernels.gemv import gemv, gemv_config, reference_gemv
from toolkit.infer.kernels.layer_ops import rms_norm, silu_mul

# (name, N, K, prologue, residual, epilogue): Llama-3.1-8B's layer and readout (the final norm its prologue, as
# model.py runs it), the EAGLE-3 head's first layer and readout. The epilogue (kernels/epilogues.py) is timed where
# TOOLKIT_EPILOGUES turns it on for this device, as the engine then runs it: q/k/v with RoPE + cache write, gate/up
# with SiLU-mul, and down without its SiLU prologue
SHAPES = [("qkv", 6144, 4096, "norm", False, "rope"), ("o_proj", 4096, 4096, None, True, None),
          ("gate_up", 28672, 4096, "norm", False, "silu"), ("down", 4096, 14336, "silu", True, None),
          ("lm_head", 128256, 4096, "norm", False, None), ("draft_qkv", 6144, 8192, "norm2", False, "rope"),
          ("draft_lm_head", 32000, 4096, "norm", False, None)]
HEADS, KV_HEADS, HEAD_DIM, SLOTS = 32, 8, 128, 1088  # the q/k/v epilogue's heads and cache (1k context)


def rope_write(M: int, dev, dt):
    """A RopeWrite for M tokens of one sequence at positions 1024.. (kernels/epilogues.py)."""
    from toolkit.infer.kernels.epilogues import RopeWrite
    from toolkit.infer.kernels.layer_ops import rope_cos_sin

    pos = torch.arange(1024, 1024 + M, device=dev)[None]
    inv = 1.0 / (500000.0 ** (torch.arange(0, HEAD_DIM, 2, device=dev, dtype=torch.float32) / HEAD_DIM))
    cos, sin = rope_cos_sin(pos, inv, dt)
    cache = [torch.zeros(1, KV_HEADS, SLOTS, HEAD_DIM, device=dev, dtype=dt) for _ in range(2)]
    return RopeWrite(cos, sin, pos, *cache, HEADS, KV_HEADS)


def graph_time(fn, calls: int) -> float:
    """Seconds per call: fn() runs `calls` GEMVs; captured once, replayed 15 times, median."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # warm-up / compile outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / calls)
    return statistics.median(times)


# one-row tiles: BLOCK_N rows x BLOCK_K columns over 4 or 8 warps; 1024 columns give one row's program 128-bit
# loads (8 bf16 a thread over 4 warps, where 512 gives 64-bit). Tiles of more than 64 values a thread are left out:
# they sit at ptxas's 255-register ceiling (python -m toolkit.infer.kernels.aot compiles them: no spills, but no
# room either)
EW = [("ew", bn, bk, w, 1) for bn in (1, 2, 4, 8, 16) for bk in (256, 512, 1024) for w in (4, 8)
      if bn * bk <= 64 * 32 * w]
EW1 = [("ew1",) + cfg[1:] for cfg in EW]  # a norm's statistic from one load of the row
DOT = [("dot", bn, bk, 4, st) for bn in (16, 32, 64) for bk in (128, 256) for st in (3, 4)]
# W as the MMA's first operand: 64-row tiles run on sm_90's wgmma (fewer registers, the buffers in shared memory)
DOTS = [("dots", bn, bk, 4, st) for bn, bk in ((64, 128), (64, 256), (128, 64), (128, 128)) for st in (3, 4)]
# either with an RMSNorm prologue folded in (no norm kernel first): tried where the shape has one
DOTN = [("dotn",) + cfg[1:] for cfg in DOT] + [("dotsn",) + cfg[1:] for cfg in DOTS]
TORCH = [("torch", 0, 0, 0, 0)]  # the prologue's kernel, then cuBLAS (and the residual add)


def f32(t):
    return None if t is None else t.float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,8", help="rows per GEMV to time (1: a decode step; 8: a verify step)")
    ap.add_argument("--sweep", action="store_true", help="time every config of EW / DOT and keep the best")
    ap.add_argument("--write-configs", metavar="JSON", help="with --sweep: write the best configs for this device "
                    "into JSON (toolkit/infer/kernels/gemv_configs.json is the one gemv reads)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    from toolkit.infer.kernels import epilogues
    from toolkit.infer.kernels.layer_ops import reference_rope_cache_write, reference_silu_mul

    fused_epilogues = epilogues.enabled(torch.device(dev))
    rows_out, best_configs = [], {}
    for name, N, K, prologue, has_res, epilogue in SHAPES:
        if not fused_epilogues:
            epilogue = None
        elif prologue == "silu":  # gate/up's epilogue computed it
            prologue = None
        copies = max(1, -(-256 * 2 ** 20 // (N * K * 2)))
        ws = [torch.randn(N, K, device=dev, dtype=dt) / K ** 0.5 for _ in range(copies)]
        k1 = K // 2 if prologue == "norm2" else K  # norm2: EAGLE-3's [embedding, hidden] halves, each normed
        nw = torch.randn(k1, device=dev, dtype=dt) if prologue in ("norm", "norm2") else None
        nw2 = torch.randn(K - k1, device=dev, dtype=dt) if prologue == "norm2" else None
        for M in map(int, args.rows.split(",")):
            x = torch.randn(1, M, 2 * K if prologue == "silu" else k1, device=dev, dtype=dt)
            x2 = torch.randn(1, M, K - k1, device=dev, dtype=dt) if prologue == "norm2" else None
            res = torch.randn(1, M, N, device=dev, dtype=dt) if has_res else None
            rope = rope_write(M, dev, dt) if epilogue == "rope" else None
            ep = {"epilogue": epilogue, "rope": rope}
            want = reference_gemv(x.float(), ws[0].float(), prologue, f32(nw), 1e-5, None, f32(res), f32(x2), f32(nw2))
            if epilogue == "silu":
                want = reference_silu_mul(want)
            elif epilogue == "rope":
                want = reference_rope_cache_write(want, rope.cos.float(), rope.sin.float(), rope.slots,
                                                  rope.cache_k.float(), rope.cache_v.float(), HEADS, KV_HEADS)
            got = gemv(x, ws[0], prologue, nw, 1e-5, None, res, x2=x2, norm_w2=nw2, **ep)
            err = float((got.float() - want).norm() / want.norm())

            def old():  # the engine's kernels before the fused GEMV
                for w in ws:
                    a = (rms_norm(x, nw, 1e-5) if prologue == "norm" else silu_mul(x) if prologue == "silu" else
                         torch.cat([rms_norm(x, nw, 1e-5), rms_norm(x2, nw2, 1e-5)], -1) if prologue == "norm2" else x)
                    y = F.linear(a, w)
                    if res is not None:
                        y = res + y
            xin = torch.cat([x, x2], -1) if prologue == "norm2" else x[..., :K].contiguous()
            cublas = graph_time(lambda: [F.linear(xin, w) for w in ws], copies)
            before = graph_time(old, copies)
            fused = graph_time(lambda: [gemv(x, w, prologue, nw, 1e-5, None, res, x2=x2, norm_w2=nw2, **ep)
                                        for w in ws], copies)
            row = {"name": name, "N": N, "K": K, "rows": M, "prologue": prologue, "residual": has_res,
                   "epilogue": epilogue,
                   "rel_err": round(err, 5), "config": gemv_config(N, K, M, x.device),
                   "cublas_us": round(cublas * 1e6, 2), "before_us": round(before * 1e6, 2),
                   "fused_us": round(fused * 1e6, 2), "cublas_gb_s": round(N * K * 2 / cublas / 1e9),
                   "fused_gb_s": round(N * K * 2 / fused / 1e9)}
            if args.sweep:
                best = None
                ews = EW + EW1 if prologue in ("norm", "norm2") else EW
                dots = DOT + DOTS + (DOTN if prologue == "norm" else [])
                for cfg in (ews if M == 1 else dots) + TORCH:
                    if cfg[2] > max(256, K) or (cfg[0].startswith("dot") and N // cfg[1] < 64):
                        continue
                    try:
                        got = gemv(x, ws[0], prologue, nw, 1e-5, None, res, config=cfg, x2=x2, norm_w2=nw2, **ep)
                        cfg_err = float((got.float() - want).norm() / want.norm())
                        if not cfg_err <= 1e-2:  # a config that computes something else is no candidate
                            row.setdefault("sweep", {})[str(cfg)] = f"skipped: relative error {cfg_err:.3g}"
                            continue
                        t = graph_time(lambda: [gemv(x, w, prologue, nw, 1e-5, None, res, config=cfg, x2=x2,
                                                     norm_w2=nw2, **ep) for w in ws], copies)
                    except OutOfResources as e:  # a tile this device's shared memory or registers cannot hold
                        row.setdefault("sweep", {})[str(cfg)] = f"skipped: {e}"
                        continue
                    row.setdefault("sweep", {})[str(cfg)] = round(t * 1e6, 2)
                    if best is None or t < best[1]:
                        best = (cfg, t)
                row["best_config"], row["best_us"] = best[0], round(best[1] * 1e6, 2)
                row["best_gb_s"] = round(N * K * 2 / best[1] / 1e9)
                best_configs[f"{N}x{K}x{1 if M == 1 else 'many'}"] = list(best[0])
            rows_out.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "sweep"}), flush=True)
        del ws
    name = torch.cuda.get_device_name()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": name, "rows": rows_out}, f, indent=1)
    if args.write_configs and best_configs:
        path = Path(args.write_configs)
        table = json.loads(path.read_text()) if path.is_file() else {}
        table[name] = {**table.get(name, {}), **best_configs}
        path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"{'gemv':14s} {'rows':>4s} {'cuBLAS us':>10s} {'before us':>10s} {'fused us':>9s} {'GB/s':>5s} "
          f"{'best':>30s}")
    for r in rows_out:
        print(f"{r['name']:14s} {r['rows']:4d} {r['cublas_us']:10.2f} {r['before_us']:10.2f} {r['fused_us']:9.2f} "
              f"{r['fused_gb_s']:5d} {str(r.get('best_config', '')) + ' ' + str(r.get('best_us', '')):>30s}")


if __name__ == "__main__":
    main()
