"""The engine's Triton kernels compile for the GPUs it is tuned for (sm_90 with the H100's and the H200's GEMV
configs in bf16, sm_80 in fp16) on this machine without a GPU, none spills registers, every kernel in
toolkit/infer/kernels is among them, with programmatic dependent launch nothing but a GEMV's weights is touched
before a kernel's wait (the H200 case), and a chain's draft step (greedy or sampled) launches only our own kernels
(toolkit/infer/kernels/aot.py). The interpreter's tests check the numbers; these check what only a compiler can
refuse. Each run is its own process: the compiler needs TRITON_INTERPRET unset, which the other kernel tests set.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # as the other kernel tests: this process interprets (Triton not imported here)
    os.environ.setdefault("TRITON_INTERPRET", "1")
spec = importlib.util.find_spec("triton")  # found, not imported: the subprocesses compile
if spec is None:
    pytest.skip("Triton is not installed", allow_module_level=True)
TOOLS = Path(spec.origin).parent / "backends" / "nvidia" / "bin"
if not ((TOOLS / "ptxas").is_file() and (TOOLS / "cuobjdump").is_file()):
    pytest.skip("this Triton ships no CUDA toolchain (ptxas, cuobjdump)", allow_module_level=True)

KERNELS_DIR = Path(__file__).parents[3] / "toolkit" / "infer" / "kernels"


def compiler_env() -> dict:
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def all_kernels() -> set[str]:
    """Every launched @triton.jit kernel in toolkit/infer/kernels (the jit helpers they call are not launched)."""
    names = set()
    for f in KERNELS_DIR.glob("*.py"):
        names |= set(re.findall(r"@triton\.jit\ndef (_\w+_kernel)\(", f.read_text()))
    return names


@pytest.mark.parametrize("arch,device,dtype,pdl,epilogues", [(90, "NVIDIA H100 80GB HBM3", "bfloat16", "on", "off"),
                                                             (90, "NVIDIA H200", "bfloat16", "on", "on"),
                                                             (80, "NVIDIA A100-SXM4-80GB", "float16", "auto", "auto")])
def test_every_kernel_the_engine_launches_compiles_for_the_gpu_without_spilling(tmp_path, arch, device, dtype, pdl,
                                                                               epilogues):
    out = tmp_path / "aot.json"
    p = subprocess.run([sys.executable, "-m", "toolkit.infer.kernels.aot", "--arch", str(arch), "--device", device,
                        "--dtype", dtype, "--pdl", pdl, "--epilogues", epilogues, "--json", str(out)],
                       env=compiler_env(), capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    report = json.loads(out.read_text())
    kernels = report["kernels"]
    assert {k["kernel"] for k in kernels} == all_kernels()
    assert all(k["local_bytes"] == 0 and 0 < k["registers"] <= 255 for k in kernels), kernels
    assert_within_bounds(kernels, arch, getattr(torch, dtype).itemsize)
    # programmatic dependent launch (kernels/pdl.py): every launch has the flag and a wait, before which no kernel
    # stores anything and only a GEMV loads (its first weight tile, which no step writes); without it, no wait
    # where the device's entry keeps PDL to launches over few rows ("pdl_max_rows", the H200's 1), the batch-1
    # decode step's kernels take it and the verify step's row GEMVs (8+ rows) do not
    assert report["pdl"] == (pdl == "on")
    from toolkit.infer.kernels.gemv import tuned_configs

    limit = tuned_configs(device).get("pdl_max_rows") if pdl == "on" else None
    for k in kernels:
        if pdl != "on" or limit is None:
            assert k["pdl"] == (pdl == "on"), k
        elif k["kernel"] == "_rows_kernel":
            assert not k["pdl"], k
        elif "decode" in k["steps"]:
            assert k["pdl"], k
        if k["pdl"]:
            assert k["stores_before_wait"] == 0, k
            gemv = k["kernel"] in ("_gemv_kernel", "_rows_kernel")
            assert (k["loads_before_wait"] > 0) if gemv else k["loads_before_wait"] == 0, k
            if k["kernel"] == "_rows_kernel":  # the first W tile alone, in 16-byte loads: no x (an activation)
                c = k["constexprs"]
                assert k["loads_before_wait"] == c["BLOCK_N"] * c["BLOCK_K"] * 2 // (k["num_warps"] * 32 * 16), k
        else:
            assert k["loads_before_wait"] == k["stores_before_wait"] == -1, k
    steps = report["launches_per_step"]
    # a target decode step: 7 kernels a layer (qkv, RoPE + cache write, attention, merge, o, gate_up, down), 6 with
    # the paired epilogues (RoPE + cache write in the qkv GEMV), and 3 a step (cos / sin, the mask's bound, readout);
    # a verify step of 8 tokens 10 a layer (two norms, qkv, RoPE, attention, merge, o, gate_up, SiLU-mul, down), 8
    # with the epilogues, and 4 a step (the readout's norm too);
    fused = epilogues == "on"
    assert report["epilogues"] is fused
    assert steps["decode (32 layers)"]["triton"] == (6 if fused else 7) * 32 + 3, steps["decode (32 layers)"]
    # less one a layer for each norm the entry folds into the rows kernel ("dotn": qkv's, gate_up's), one the readout's
    entry = tuned_configs(device)
    folded = [entry.get(f"{n}x4096xmany", [""])[0] == "dotn" for n in (6144, 28672, 128256)]
    assert steps["verify 8 (32 layers)"]["triton"] == ((8 if fused else 10) - sum(folded[:2])) * 32 + 4 - folded[2], \
        steps["verify 8 (32 layers)"]
    assert steps["decode (32 layers)"]["torch_ops"] == {"embedding": 1}
    for head in ("eagle3", "eagle2", "mtp"):
        step = steps[f"{head} draft step in a greedy chain"]
        # q/k/v's GEMV may be cuBLAS where the device's sweep found it faster (the H200's EAGLE-3 q/k/v)
        assert set(step["torch_ops"]) <= {"mm"}, (head, step)
        # EAGLE-3: 9 kernels (one GEMV's worth fewer where cuBLAS takes the q/k/v after one kernel for both norms)
        assert step["triton"] + step["torch"] <= (10 if head == "eagle3" else 11), (head, step)
    # a sampled chain's pick is one kernel a step too: the torch ops left are the round's own (slots, masks, the
    # tokens' concatenation, the laws' stack), and the q/k/v GEMMs where cuBLAS was picked
    sampled = steps["eagle3 sampled chain of 6"]["torch_ops"]
    assert sum(n for op, n in sampled.items() if op != "mm") <= 10, sampled
    # a 6 x 10 tree's bookkeeping: the round's fixed parts made once, ~20 small ops a step (it was 218 in all)
    assert steps["eagle3 tree 6 x 10 -> 60"]["torch"] <= 150, steps["eagle3 tree 6 x 10 -> 60"]


def assert_within_bounds(kernels: list, arch: int, size: int) -> None:
    """The bounds kernels/shared_memory.py's `fit` works from hold for what the compiler gave: sm_90's wgmma copy
    of q and its SWAP pipelines, sm_8x's pipelines, sm_75's fp32 operand tiles."""
    from toolkit.infer.kernels.shared_memory import attention_shared_bytes, rows_shared_bytes

    in_shared = arch // 10 in (9, 10)
    for k in kernels:
        c, used = k["constexprs"], k["shared_bytes"] + k["dynamic_shared_bytes"]
        if k["kernel"] == "_rows_kernel":
            bound = rows_shared_bytes(c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], k["num_stages"], size,
                                      arch >= 80, c["SWAP"] and in_shared, c["NORM"], c["PDL"])
            assert used <= bound, (bound, k)
        if k["kernel"] == "_attention_kernel":
            bound = attention_shared_bytes(c["BLOCK_R"], c["BLOCK_S"], c["BLOCK_D"], k["num_stages"], size,
                                           2 * size if in_shared else size if arch >= 80 else max(size, 4))
            assert used <= bound, (bound, k)


BOUNDS = """
import itertools, json, sys, torch
from toolkit.infer.kernels import gemv
from toolkit.infer.kernels.cross_compile import compiled_for, resources
from toolkit.infer.kernels.tree_attention import tree_attention

arch, dtype, pdl = int(sys.argv[1]), getattr(torch, sys.argv[2]), sys.argv[3] == "pdl"
out = []
with compiled_for(arch, "untuned", pdl) as (launches, label), torch.device("meta"):
    for kind, (bn, bk, st) in itertools.product(["dot", "dotn", "dots", "dotsn"], [(64, 256, 4), (16, 256, 4),
                                                                                  (128, 256, 4)]):
        x, w = torch.empty(1, 8, 4096, dtype=dtype), torch.empty(32768, 4096, dtype=dtype)
        nw = torch.empty(4096, dtype=dtype)
        gemv.gemv(x, w, "norm", nw, config=(kind, bn, bk, 4, st))
    for d, (hq, t) in itertools.product([64, 128, 256], [(8, 1), (8, 4), (8, 16)]):
        q, kv = torch.empty(1, hq, t, d, dtype=dtype), torch.empty(1, 2, 1100, d, dtype=dtype)
        tree_attention(q, kv, kv, torch.ones(1, t, 1100, dtype=torch.bool))
for fn, _, k in launches:
    if fn.__name__ in ("_rows_kernel", "_attention_kernel"):
        const = {fn.arg_names[i[0]]: v for i, v in k.src.constants.items() if len(i) == 1}
        out.append({"kernel": fn.__name__, "constexprs": const, "num_stages": k.metadata.num_stages,
                    "dynamic_shared_bytes": k.metadata.shared,
                    "shared_bytes": resources(k.asm["cubin"])["shared_bytes"]})
json.dump(out, sys.stdout)
"""


@pytest.mark.parametrize("arch,dtype,pdl", [(75, "float16", ""), (75, "float32", ""), (86, "float32", ""),
                                            (90, "bfloat16", ""), (90, "bfloat16", "pdl"), (120, "bfloat16", "")])
def test_the_shared_memory_bounds_hold_for_every_rows_variant_and_head_dim(arch, dtype, pdl):
    """Every rows GEMV variant (dot, dotn: the norm folded, dots / dotsn: the products swapped, wgmma's pipeline in
    shared memory on sm_90) at narrow, wide and 128-wide tiles, and attention at head_dim 64 / 128 / 256 over 8 /
    32 / 64 packed rows, compiled where fit put them: under the device's limit and under the bound fit used (a
    first version's bounds were under the compiler's figures for SWAP on sm_90, the folded norm in fp32, and
    attention on sm_75)."""
    from toolkit.infer.kernels.shared_memory import OPTIN_BYTES

    p = subprocess.run([sys.executable, "-c", BOUNDS, str(arch), dtype, pdl], env=compiler_env(), capture_output=True,
                       text=True, timeout=1200)
    assert p.returncode == 0, p.stderr[-3000:]
    kernels = json.loads(p.stdout)
    assert len({json.dumps(k["constexprs"], sort_keys=True) for k in kernels}) >= 12, kernels
    assert all(k["shared_bytes"] + k["dynamic_shared_bytes"] <= OPTIN_BYTES[arch] for k in kernels), kernels
    assert_within_bounds(kernels, arch, getattr(torch, dtype).itemsize)


GEMMA_2_9B = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 3584,
              "intermediate_size": 14336, "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8,
              "head_dim": 256, "vocab_size": 256000, "query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0,
              "final_logit_softcapping": 30.0, "sliding_window": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
              "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 8192}  # its config.json's shapes


@pytest.mark.parametrize("device,dtype,config", [("NVIDIA GeForce RTX 4090", "bfloat16", None),
                                                 ("NVIDIA A10", "float16", GEMMA_2_9B), ("Tesla T4", "float16", None),
                                                 ("Tesla V100-SXM2-32GB", "float16", None)],
                         ids=["llama-3.1-8b-sm89", "gemma-2-9b-sm86", "llama-3.1-8b-sm75", "llama-3.1-8b-sm70"])
def test_every_kernel_fits_the_shared_memory_of_a_smaller_gpu(tmp_path, device, dtype, config):
    """sm_86 / sm_89 parts allow 99 KB of shared memory a block, a T4 (sm_75, float16: no bf16 there) 64 KB, a V100
    (sm_70: no tensor-core tl.dot in Triton, FMA instead) 96 KB, where an H100 allows 227: the untuned default rows tile (4 stages of 16 x 64 x 256: 120 KB) and tree attention at
    head_dim 256 with 64 rows (100 KB) compiled but failed to launch there (`--kernels auto` picks triton on every
    CUDA Llama). Now each fits (aot exits 1 on a kernel over the limit), Gemma 2's soft-capped attention included,
    with the same kernels as on an H100."""
    from toolkit.infer.kernels.cross_compile import ARCH
    from toolkit.infer.kernels.shared_memory import OPTIN_BYTES

    out, args = tmp_path / "aot.json", []
    if config:
        (tmp_path / "config.json").write_text(json.dumps(config))
        args = ["--config", str(tmp_path / "config.json")]
    p = subprocess.run([sys.executable, "-m", "toolkit.infer.kernels.aot", "--device", device, "--dtype", dtype,
                        "--json", str(out), *args], env=compiler_env(), capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    kernels = json.loads(out.read_text())["kernels"]
    arch, size = ARCH[device], getattr(torch, dtype).itemsize
    assert all(k["shared_bytes"] + k["dynamic_shared_bytes"] <= OPTIN_BYTES[arch] and k["local_bytes"] == 0
               for k in kernels)
    assert_within_bounds(kernels, arch, size)
    attention = [k["constexprs"] for k in kernels if k["kernel"] == "_attention_kernel"]
    assert {c["BLOCK_D"] for c in attention} == {256 if config else 128}
    assert {c["SOFTCAP"] for c in attention} == ({True, False} if config else {False})  # target's; heads' plain
    assert any(k["kernel"] == "_rows_kernel" for k in kernels)


FOLDED = """
import json, sys, torch
from toolkit.infer.config import ModelConfig
from toolkit.infer.kernels import aot, gemv

kind = sys.argv[1]
entry = {k: [kind] + v[1:] if k.endswith("many") else v for k, v in gemv.tuned_configs("NVIDIA H200").items()}
gemv.tuned_configs = lambda name: entry  # the H200's configs, every several-row one with the norm folded in
c = ModelConfig(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
                max_position_embeddings=131072)
rows, counts = aot.compile_engine(c, torch.bfloat16, 90, "NVIDIA H200", bool(entry.get("pdl")))
json.dump({"kernels": [r.__dict__ for r in rows], "counts": counts}, sys.stdout)
"""


@pytest.mark.parametrize("kind", ["dotn", "dotsn"])
def test_the_rows_kernel_with_the_norm_folded_in_compiles_and_a_verify_step_launches_as_decode(kind):
    """"dotn" / "dotsn" configs (kernels/gemv.py): with the H200's tiles, the rows kernels that fold the norm
    compile without spills, on sm_90's wgmma where the operands are swapped and a program has 64 rows of W (mma.sync
    otherwise), and a verify step of 8 launches no more kernels than a decode step (its two norms a layer and the
    readout's gone); the interpreter's tests (test_gemv.py) check their numbers."""
    p = subprocess.run([sys.executable, "-c", FOLDED, kind], env={**compiler_env(), "TOOLKIT_EPILOGUES": "on"},
                       capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads(p.stdout)
    rows = [k for k in report["kernels"] if k["kernel"] == "_rows_kernel"]
    folded = [k for k in rows if k["constexprs"]["NORM"]]
    assert folded and all(k["local_bytes"] == 0 and k["registers"] <= 255 for k in rows), rows
    for k in rows:
        swapped = kind == "dotsn" and k["constexprs"]["BLOCK_N"] >= 64
        assert k["constexprs"]["SWAP"] == (kind == "dotsn") and k["mma"] == ("wgmma" if swapped else "mma"), k
    counts = report["counts"]
    assert counts["verify 8"]["triton"] == counts["decode"]["triton"], counts


BAD_KERNEL = '''
import torch, triton, triton.language as tl

@triton.jit
def _row_sum_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    acc = 0  # an int before the loop, a float inside it: the compiler refuses the change of type
    for k in range(0, N, BLOCK):
        r = k + tl.arange(0, BLOCK)
        acc += tl.sum(tl.load(x_ptr + r, mask=r < N, other=0.0), 0)
    tl.store(y_ptr, acc)

def row_sum(x):
    y = torch.empty(1, dtype=x.dtype, device=x.device)
    _row_sum_kernel[(1,)](x, y, x.numel(), BLOCK=64)
    return y
'''


def test_a_kernel_the_interpreter_runs_but_the_compiler_refuses_is_caught(tmp_path):
    (tmp_path / "bad_kernel.py").write_text(BAD_KERNEL)
    interpreted = subprocess.run(
        [sys.executable, "-c", "import torch, bad_kernel; x = torch.randn(300); "
         "assert torch.allclose(bad_kernel.row_sum(x), x.sum(), atol=1e-4)"],
        cwd=tmp_path, env={**compiler_env(), "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=300)
    assert interpreted.returncode == 0, interpreted.stderr[-2000:]  # the interpreter's numbers are right
    compiled = subprocess.run(
        [sys.executable, "-c", "import torch, bad_kernel\nfrom toolkit.infer.kernels.cross_compile import compiled_for\n"
         "with compiled_for(90, 'NVIDIA H100 80GB HBM3'):\n    bad_kernel.row_sum(torch.empty(300, device='meta'))"],
        cwd=tmp_path, env=compiler_env(), capture_output=True, text=True, timeout=300)
    assert compiled.returncode != 0 and "Loop-carried variable acc" in compiled.stderr, compiled.stderr[-2000:]


def test_pdl_is_refused_before_sm_90():
    p = subprocess.run([sys.executable, "-m", "toolkit.infer.kernels.aot", "--arch", "80", "--pdl", "on"],
                       env=compiler_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "--pdl on needs sm_90 or later" in p.stderr, p.stderr[-2000:]


def test_compiling_is_refused_under_the_interpreter(monkeypatch):
    from toolkit.infer.kernels.cross_compile import compiled_for

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET unset"):
        with compiled_for(90, "NVIDIA H100 80GB HBM3"):
            pass


def test_a_mixture_of_experts_config_and_a_missing_one_are_refused_by_name(tmp_path):
    """Meta tensors carry no values, so a router's expert choice cannot run on them: refused, not a traceback."""
    scout = {"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192, "num_attention_heads": 40,
             "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 48, "vocab_size": 202048,
             "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1}
    (tmp_path / "config.json").write_text(json.dumps(scout))
    p = subprocess.run([sys.executable, "-m", "toolkit.infer.kernels.aot", "--config", str(tmp_path)],  # its folder
                       env=compiler_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "a mixture-of-experts target cannot be driven on meta tensors" in p.stderr, p.stderr
    p = subprocess.run([sys.executable, "-m", "toolkit.infer.kernels.aot", "--config", str(tmp_path / "nothing")],
                       env=compiler_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "nothing: no such file (give an HF config.json or the model folder" in p.stderr
