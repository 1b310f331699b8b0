"""The engine's Triton kernels compiled ahead of time for a GPU that is not here, and what each costs in registers.

    python -m toolkit.infer.kernels.aot --device "NVIDIA H200"                  # a table (sm_90 for it)
    python -m toolkit.infer.kernels.aot --arch 80 --device "NVIDIA A100-SXM4-80GB" --dtype float16 --json out.json
    python -m toolkit.infer.kernels.aot --device "NVIDIA H200" --epilogues on   # with kernels/epilogues.py's fusion
    python -m toolkit.infer.kernels.aot --device "NVIDIA GeForce RTX 4090" --config gemma-2-9b/config.json

TRITON_INTERPRET=1 runs the kernels' Python on CPU, so it checks their numbers but not that they compile: the
interpreter runs Python, so it takes what the compiler refuses (a loop-carried value that changes type, for one:
tests/infer/kernels/test_aot.py) and knows nothing of registers. Here every Triton launch compiles instead,
with Triton's own compiler and the ptxas it ships, for sm_<arch>, and returns without running (cross_compile.py).
The engine's real steps run on meta tensors (no memory, no device) of a real model's shapes (`drive`): a target
decode step for 1 and 4 sequences, verify steps of 8, 16 and 64 tokens, a prefill, and for each kind of head
(EAGLE-3, EAGLE-1/2, MTP) its first step and greedy chains, for EAGLE-3 also a sampled chain and a 60-token tree,
so what compiles is exactly the set of
specializations a GPU run of that model would make (shapes, dtypes, constexprs, the device's tuned GEMV configs
from gemv_configs.json and its SM count). `resources` reads each cubin's registers, local memory (spills) and
static shared memory with the cuobjdump Triton ships; the compiled kernel's metadata gives its dynamic shared
memory (Triton's pipeline buffers), its PTX the matrix instruction it uses. Meta tensors all sit at address 0,
so pointer arguments are specialized as 16-byte aligned, as the engine's allocations are on a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from toolkit.infer.kernels.cross_compile import ARCH, SMS, before_wait, compiled_for, resources
from toolkit.infer.kernels.launch_counts import per_step, torch_kernel_counter
from toolkit.infer.kernels.shared_memory import OPTIN_BYTES


@dataclass
class Compiled:
    kernel: str          # the @triton.jit function's name
    steps: list          # the engine steps that launch it
    constexprs: dict     # its compile-time arguments (and ints Triton specialized as 1)
    num_warps: int
    registers: int       # per thread
    local_bytes: int     # per thread: > 0 means registers spilled to local memory
    shared_bytes: int    # static shared memory per program
    pdl: bool            # launched with programmatic dependent launch (kernels/pdl.py)
    loads_before_wait: int   # global loads / stores in the PTX before its PDL wait (-1: no wait); only a GEMV's
    stores_before_wait: int  # first weight tile may come before it
    dynamic_shared_bytes: int = 0  # Triton's pipeline buffers per program (the launch's dynamic shared memory)
    mma: str = ""        # the matrix instruction in its PTX: "wgmma" (sm_90's), "mma" (mma.sync) or "" (none)
    num_stages: int = 0  # its software pipeline's depth (the launch's num_stages)


def _heads(c, model, dtype, draft_vocab: int) -> dict:
    """The three kinds of draft head, random, for target config c: EAGLE-3 over a draft_vocab-token vocabulary,
    EAGLE-1/2 and MTP over the target's whole lm_head."""
    from toolkit.infer.draft_head import draft_config
    from toolkit.infer.drafts import random_head
    from toolkit.infer.eagle2 import Eagle2Head
    from toolkit.infer.mtp import MTPHead

    lm_head = model.lm_head.weight
    heads = {"eagle3": random_head(c, list(range(min(draft_vocab, c.vocab_size)))).to(dtype),
             "eagle2": Eagle2Head(draft_config(c), lm_head).to(dtype)}
    if c.llama_layers:  # an MTP block is a layer of the target's kind, which the engine runs for these only
        heads["mtp"] = MTPHead(c, lm_head).to(dtype)
    return heads


def drive(config, dtype, label: list, context: int = 1024, draft_vocab: int = 32000, layers: int = 2) -> None:
    """The engine's steps for `config` (its first `layers` layers: the rest launch the same kernels) on meta
    tensors under --kernels triton, each named in label[0] before it runs (None: the harness's own setup)."""
    from toolkit.infer.kv_cache import KVCache
    from toolkit.infer.model import Transformer
    from toolkit.infer.prepare import apply_kernels, fuse_projections
    from toolkit.infer.tree import TreeConfig, grow

    c, dev, width, H = replace(config, num_layers=layers), torch.device("meta"), context + 80, config.hidden_size
    with torch.device("meta"):
        model = Transformer(c).to(dtype).eval().fuse()
        heads = _heads(c, model, dtype, draft_vocab)
    for m in (model, *heads.values()):
        fuse_projections(m)
        apply_kernels(m, "triton", require_device=False)  # nothing runs here: every launch only compiles
    with torch.no_grad(), dev:
        for batch, n, name in ((1, 1, "decode"), (4, 1, "decode x4"), (1, 8, "verify 8"), (1, 16, "verify 16"),
                               (1, 64, "verify 64"), (1, 200, "prefill 200")):
            cache = KVCache(c, batch, width + 200, dtype, dev)
            pos = torch.arange(context, context + n)[None].expand(batch, n).contiguous()
            mask, tokens = torch.ones(batch, n, width + 200, dtype=torch.bool), torch.zeros(batch, n, dtype=torch.long)
            label[0] = name
            model(tokens, pos, cache=cache, mask=mask, aux_layers=heads["eagle3"].aux_layers)
            label[0] = None
        for kind, head in heads.items():
            dcache = head.new_cache(width, dtype, dev)
            feature = torch.empty(1, 1, 3 * H if kind == "eagle3" else H, dtype=dtype)
            args = (torch.empty(1, 1, H, dtype=dtype), feature, torch.tensor([[context]]), dcache)
            mask = torch.ones(1, 1, width, dtype=torch.bool)
            label[0] = f"{kind} draft step 0"
            head(*args, mask=mask)
            label[0] = None

            def forward(emb, hidden, positions, slots, mask, head=head, dcache=dcache, **kw):
                return head(emb, hidden, positions, dcache, slots=slots, mask=mask, kv_len=width, **kw)

            root = (torch.tensor([context]), torch.tensor([1]), torch.empty(1, H, dtype=dtype),
                    torch.empty(1, head.d2t.numel(), dtype=torch.float32))
            grows = [("greedy chain of 2", TreeConfig(2, 1, 3), False), ("greedy chain of 8", TreeConfig(8, 1, 9), False)]
            if kind == "eagle3":
                grows += [("sampled chain of 6", TreeConfig(6, 1, 7), True), ("tree 6 x 10 -> 60", TreeConfig(6, 10, 60), False)]
            for name, tree, sample in grows:
                noise = dict(gumbel=torch.empty(1, tree.num_steps, head.d2t.numel()), inv_temp=torch.ones(1)) \
                    if sample else {}
                label[0] = f"{kind} {name}"
                grow(head, model.embed_tokens, forward, *root, tree, mask_len=width, **noise)
                label[0] = None


def compile_engine(config, dtype=torch.bfloat16, arch: int = 90, device_name: str = "NVIDIA H100 80GB HBM3",
                   pdl: bool = False, **drive_kw) -> tuple[list[Compiled], dict]:
    """Every distinct kernel specialization the engine's steps launch for `config`, compiled for sm_<arch>, with
    its resources and the steps that launch it; and per step its launches: {"triton": n, "torch": n (torch ops
    that each launch >= 1 kernel), "torch_ops": {op: n}}."""
    by_kernel, counts = {}, {}
    with compiled_for(arch, device_name, pdl) as (launches, label), torch_kernel_counter(label, counts):
        drive(config, dtype, label, **drive_kw)
    for fn, step, kernel in launches:
        counts.setdefault(step, {"triton": 0, "torch": 0, "torch_ops": {}})["triton"] += 1
        if id(kernel) not in by_kernel:
            names = fn.arg_names
            const = {names[k[0]]: v for k, v in kernel.src.constants.items() if len(k) == 1}
            ptx = kernel.asm["ptx"]
            by_kernel[id(kernel)] = Compiled(fn.__name__, [], const, kernel.metadata.num_warps,
                                             **resources(kernel.asm["cubin"]), pdl=bool(kernel.metadata.launch_pdl),
                                             **dict(zip(("loads_before_wait", "stores_before_wait"), before_wait(ptx))),
                                             dynamic_shared_bytes=kernel.metadata.shared,
                                             num_stages=kernel.metadata.num_stages,
                                             mma="wgmma" if "wgmma." in ptx else "mma" if "mma.sync" in ptx else "")
        if step not in by_kernel[id(kernel)].steps:
            by_kernel[id(kernel)].steps.append(step)
    return list(by_kernel.values()), counts


def main(argv: list[str] | None = None) -> int:
    from toolkit.infer.config import ModelConfig

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, help="compute capability x 10: 70 (V100), 75 (T4), 80 (A100), 86 (A10, "
                    "RTX 3090), 89 (L4, L40S, RTX 4090), 90 (H100 / H200); default: the device's")
    ap.add_argument("--device", default="NVIDIA H100 80GB HBM3",
                    help=f"whose tuned GEMV configs and SM count to use; known: {', '.join(SMS)}")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--pdl", choices=["auto", "on", "off"], default="auto",
                    help="programmatic dependent launch (kernels/pdl.py); auto: as the engine picks it on that "
                    "device (its gemv_configs.json entry)")
    ap.add_argument("--epilogues", choices=["auto", "on", "off"], default="auto",
                    help="RoPE + cache write and SiLU-mul as GEMV epilogues (kernels/epilogues.py); auto: as the "
                    "engine picks it on that device (its gemv_configs.json entry)")
    ap.add_argument("--config", help="an HF config.json, or the model folder holding it, whose shapes to compile "
                    "(a dense family --kernels triton runs); default: Llama-3.1-8B's")
    ap.add_argument("--json", help="also write the table here")
    args = ap.parse_args(argv)
    os.environ["TOOLKIT_EPILOGUES"] = args.epilogues  # read by row_step at every step
    if args.arch is None:
        if args.device not in ARCH:
            ap.error(f"--arch is needed for {args.device!r} (known devices: {', '.join(ARCH)})")
        args.arch = ARCH[args.device]
    if args.arch not in OPTIN_BYTES:
        ap.error(f"--arch {args.arch}: its shared memory per block is not known; known: {sorted(OPTIN_BYTES)}")
    from toolkit.infer.kernels.gemv import tuned_configs

    epilogues = args.epilogues == "on" or (args.epilogues == "auto"
                                           and bool(tuned_configs(args.device).get("epilogues", False)))

    pdl = args.pdl == "on" or (args.pdl == "auto" and args.arch >= 90
                               and bool(tuned_configs(args.device).get("pdl", False)))
    if pdl and args.arch < 90:
        ap.error(f"--pdl on needs sm_90 or later (programmatic dependent launch); got --arch {args.arch}")
    if args.config:
        path = Path(args.config) / "config.json" if Path(args.config).is_dir() else Path(args.config)
        if not path.is_file():
            ap.error(f"--config {args.config}: no such file (give an HF config.json or the model folder holding it)")
        config = ModelConfig.from_hf(json.loads(path.read_text()))
        if config.mla is not None:
            ap.error(f"{args.config}: --kernels triton does not run DeepSeek's MLA layers")
        if config.moe is not None:  # its routing picks experts from values, which meta tensors do not have
            ap.error(f"{args.config}: a mixture-of-experts target cannot be driven on meta tensors; give a dense one")
        shapes = f"{config.model_type} shapes from {args.config}"
    else:
        config = ModelConfig(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                             num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5,
                             rope_theta=500000.0, max_position_embeddings=131072)
        shapes = "Llama-3.1-8B shapes"
    dtype = getattr(torch, args.dtype)
    rows, counts = compile_engine(config, dtype, args.arch, args.device, pdl, context=args.context)
    one = compile_engine(config, dtype, args.arch, args.device, pdl, context=args.context, layers=1)[1]
    from toolkit.infer.kernels.pdl import max_rows

    with compiled_for(args.arch, args.device, pdl):  # read as the engine reads it on that device
        limit = max_rows(torch.device("meta")) if pdl else None
    print(f"{len(rows)} kernel specializations compiled for sm_{args.arch} ({args.device} configs, {args.dtype}, "
          f"PDL {'off' if not pdl else 'on' if limit is None else f'on launches of <= {limit} rows'}, "
          f"epilogues {'on' if epilogues else 'off'}, "
          f"{shapes}, EAGLE-3 head with a 32k vocabulary, {args.context} context)")
    print(f"{'kernel':<20} {'warps':>5} {'regs':>5} {'spill B':>7} {'smem B':>7} {'dyn smem B':>10} {'mma':>5} "
          f"{'ld/st before wait':>17}  constexprs; steps")
    for r in rows:
        wait = f"{r.loads_before_wait}/{r.stores_before_wait}" if r.pdl else "-"
        print(f"{r.kernel:<20} {r.num_warps:>5} {r.registers:>5} {r.local_bytes:>7} {r.shared_bytes:>7} "
              f"{r.dynamic_shared_bytes:>10} {r.mma or '-':>5} {wait:>17}  {r.constexprs}; {', '.join(r.steps)}")
    launches = per_step(counts, one, config.num_layers)
    print("\nlaunches per step (Triton kernels + torch ops that launch >= 1 kernel each):")
    for step, c in launches.items():
        ops = ", ".join(f"{k} {v}" for k, v in sorted(c["torch_ops"].items(), key=lambda kv: -kv[1]))
        print(f"  {step:<34} {c['triton']:>5} + {c['torch']:<4} {ops}")
    if args.json:
        from toolkit.atomic import write_text

        write_text(Path(args.json), json.dumps({"arch": args.arch, "device": args.device, "dtype": args.dtype, "pdl": pdl,
                                                "pdl_max_rows": limit, "epilogues": epilogues,
                                                "kernels": [asdict(r) for r in rows],
                                                "launches_per_step": launches}, indent=1) + "\n")
    over = [r for r in rows if r.shared_bytes + r.dynamic_shared_bytes > OPTIN_BYTES[args.arch]]
    for r in over:
        print(f"OVER sm_{args.arch}'s {OPTIN_BYTES[args.arch]} bytes of shared memory per block (the launch would "
              f"fail): {r.kernel} {r.constexprs} num_warps {r.num_warps}: {r.shared_bytes + r.dynamic_shared_bytes}")
    return 1 if over or any(r.local_bytes for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
