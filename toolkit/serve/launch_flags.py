"""SGLang's and vLLM's speculative launch flags, read by `toolkit serve` and `toolkit run-batch`, so that a launch
line brought from either server runs here as it did there:

    python -m sglang.launch_server --model-path M --speculative-algorithm EAGLE3 \\
        --speculative-draft-model-path D --speculative-num-steps 5 --speculative-eagle-topk 8 \\
        --speculative-num-draft-tokens 32                              ->  toolkit serve --model-path M ...
    vllm serve M --speculative-config '{"method": "eagle3", "model": "D", "num_speculative_tokens": 3}'
                                                                      ->  toolkit serve M --speculative-config ...

SGLang's plain renames (--speculative-num-steps for --num-steps, --model-path for --model, --context-length for
--max-seq-len, ...) are the same options' second names (engine_args.add_args). What is more than a rename is
here: the algorithm or method, which must name the kind of draft the folder holds (the error says which it
holds); NEXTN / MTP without a draft path drafts with the target's own MTP layers, as both servers do; NGRAM /
ngram is prompt lookup alone; vLLM's num_speculative_tokens k is a chain of k. What neither our engine serves
(a separate draft LM, Medusa, a static token tree, lossy acceptance thresholds) is refused by name.
"""
from __future__ import annotations

import argparse
import json
import sys

from toolkit.serve import vllm_config
from toolkit.serve.vllm_config import set_once

SGLANG_KINDS = {"EAGLE": ("eagle", "mtp"), "EAGLE3": ("eagle3",), "NEXTN": ("mtp",)}  # SGLang serves MTP as EAGLE too
KIND_WORDS = {"eagle": "an EAGLE-1/2 head", "eagle3": "an EAGLE-3 head", "mtp": "MTP layers"}


def add_args(p: argparse.ArgumentParser) -> None:
    # the rest of a launch line that changes nothing here, or one thing that is checked
    p.add_argument("--tensor-parallel-size", "--tp-size", "--tp", "-tp", type=int, default=1, metavar="1",
                   help="vLLM's / SGLang's: one device serves here, so 1 (more is refused)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="taken from vLLM / SGLang lines; this engine runs no code from a model repository either way "
                        "(it reads config.json as data)")
    p.add_argument("--gpu-memory-utilization", "--mem-fraction-static", type=float, default=None, metavar="U",
                   help="vLLM's / SGLang's: the target's KV cache takes what keeps memory in use within U (0..1] of "
                        "the device's once the model is loaded (the draft's cache and activations come on top): "
                        "each sequence's length is sized from it, capped by --max-seq-len")
    p.add_argument("--enable-prefix-caching", action="store_true", help="vLLM's: prefix caching, on by default here")
    p.add_argument("--disable-log-stats", dest="log_every", action="store_const", const=0,
                   help="vLLM's: no periodic acceptance / throughput log (--log-every 0)")
    p.add_argument("--disable-log-requests", action="store_true", help="vLLM's: requests are not logged here anyway")
    p.add_argument("--speculative-algorithm", default=None, metavar="EAGLE|EAGLE3|NEXTN|NGRAM",
                   help="SGLang's flag: the kind of draft --speculative-draft-model-path holds (checked); NEXTN "
                        "without a draft path drafts with the target's own MTP layers; NGRAM is prompt lookup alone")
    p.add_argument("--speculative-draft-model-revision", dest="draft_revision", default=None, metavar="REV",
                   help="SGLang's flag (vLLM: \"revision\" in --speculative-config): the branch, tag or commit of a "
                        "draft given as a hub id")
    for which in ("single", "acc"):
        p.add_argument(f"--speculative-accept-threshold-{which}", type=float, default=None, metavar="1.0",
                       help="SGLang's: 1.0 (lossless) is taken; below it SGLang accepts tokens the target would not "
                            "have sampled, which is refused here")
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help="vLLM's flag: {\"method\": \"eagle3\"|\"eagle\"|\"mtp\"|\"ngram\", \"model\": DRAFT, "
                        "\"num_speculative_tokens\": k (a chain of k), \"prompt_lookup_max\" / \"prompt_lookup_min\" "
                        "(ngram), \"disable_by_batch_size\"}")


def apply(args: argparse.Namespace) -> None:
    """Translate the SGLang / vLLM launch flags into ours (args changed in place); sets args.draft_kinds to the
    kinds of draft the algorithm or method accepts (None: any), checked by check_kind once the folder is found."""
    args.draft_kinds = None
    args.eager_draft = False  # vLLM's drafter enforce_eager: the draft runs eagerly, the target from graphs
    args.chain_from_draft = None  # which flag left the chain to the draft's config.json (vLLM's default)
    tag = getattr(args, "model_tag", None)  # vLLM's `vllm serve MODEL`
    if tag is not None:
        if args.model not in (None, tag):
            raise ValueError(f"the model is given twice, as {tag} and --model {args.model}: give it once")
        args.model = tag
    vllm_config.speculators_model(args)
    if args.tensor_parallel_size != 1:
        raise ValueError(f"--tensor-parallel-size {args.tensor_parallel_size}: one device serves here; give 1 (or "
                         "leave it out), and a model that fits one device")
    u = args.gpu_memory_utilization
    if u is not None and not 0 < u <= 1:
        raise ValueError(f"--gpu-memory-utilization {u}: give the share of the device's memory to use, in (0, 1]")
    if args.enable_prefix_caching and args.prefix_cache_rows == 0:
        raise ValueError("--enable-prefix-caching and a switch that turns prefix caching off are both given: give one")
    for flag in ("accept_threshold_single", "accept_threshold_acc"):
        value = getattr(args, f"speculative_{flag}")
        if value is not None and value != 1.0:
            raise ValueError(f"--speculative-{flag.replace('_', '-')} {value}: below 1 SGLang accepts draft tokens the "
                             "target would not have sampled (lossy); toolkit verifies losslessly only, so give 1.0 "
                             "or leave it out")
    if args.speculative_algorithm is not None and args.speculative_config is not None:
        raise ValueError("--speculative-algorithm is SGLang's and --speculative-config vLLM's way to ask for the "
                         "same thing: give one")
    asked = ("--speculative-algorithm" if args.speculative_algorithm is not None else
             "--speculative-config" if args.speculative_config is not None else None)
    if asked and args.no_speculation:  # it was served without speculation, the flag silently dropped
        raise ValueError(f"{asked} asks for speculation and --no-speculation serves the target alone: give one")
    if args.speculative_algorithm is not None:
        _sglang(args, args.speculative_algorithm.upper())
    if args.speculative_config is not None:
        vllm_config.read(args, args.speculative_config)


def _sglang(args, algorithm: str) -> None:
    flag = f"--speculative-algorithm {args.speculative_algorithm}"
    if algorithm == "NGRAM":  # SGLang's n-gram drafts from earlier text; ours looks within the sequence
        if args.draft is not None:
            raise ValueError(f"{flag} drafts by n-gram lookup and takes no draft model; drop "
                             "--speculative-draft-model-path / --draft")
        # SGLang's default for NGRAM: the match window size (--speculative-ngram-max-match-window-size), else 12
        tokens = args.num_draft_tokens or args.lookup_max_ngram or 12
        args.num_draft_tokens = args.num_steps = args.topk = None  # SGLang derives them for NGRAM from its trie
        args.no_speculation = True
        set_once(args, "lookup", tokens - 1, flag)
        if args.lookup_max_ngram is None:
            args.lookup_max_ngram = 12  # SGLang's speculative_ngram_max_match_window_size default
        return
    if algorithm not in SGLANG_KINDS:
        served = ", ".join([*SGLANG_KINDS, "NGRAM"])
        raise ValueError(f"{flag}: toolkit serves {served}" + (
            " (STANDALONE's separate draft language model is not served: train an EAGLE-3 head for the target "
            "with toolkit/train/eagle3.py)" if algorithm == "STANDALONE" else ""))
    args.draft_kinds = SGLANG_KINDS[algorithm]
    if args.draft is None:
        if "mtp" not in args.draft_kinds:
            raise ValueError(f"{flag} needs the draft: give --speculative-draft-model-path (or --draft)")
        args.draft = args.model  # the target's own MTP layers, as SGLang's NEXTN loads them
        if args.draft is None:
            raise ValueError(f"{flag} without a draft path drafts with the target's own MTP layers: give the "
                             "target (--model-path / --model)")


SGLANG_WIDE = ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM")  # SGLang's (5, 4, 8) targets


def sglang_picks_tree(args: argparse.Namespace) -> bool:
    """An EAGLE / EAGLE3 / NEXTN line with no --speculative-num-steps: SGLang picks steps, top-k and draft tokens
    for the target (auto_choose_speculative_params), and then takes neither of the other two."""
    if args.draft_kinds is None or args.speculative_algorithm is None or args.num_steps is not None:
        return False
    if args.topk is not None or args.num_draft_tokens is not None:
        raise ValueError(f"--speculative-algorithm {args.speculative_algorithm} without --speculative-num-steps lets "
                         "SGLang pick steps, top-k and draft tokens together: give --speculative-num-steps too, or "
                         "none of the three")
    return True


def sglang_tree(args: argparse.Namespace, target) -> None:
    """The tree SGLang picks for the target folder `target`: (5, 4, 8) for Llama and Grok, else (3, 1, 4)."""
    cfg = json.loads((target / "config.json").read_text())
    arch = ((cfg.get("architectures") or [""])[0])
    args.num_steps, args.topk, args.num_draft_tokens = (5, 4, 8) if arch in SGLANG_WIDE else (3, 1, 4)
    print(f"--speculative-algorithm {args.speculative_algorithm}: steps {args.num_steps}, top-k {args.topk}, draft "
          f"tokens {args.num_draft_tokens}, as SGLang picks them for {arch or 'this target'} (give "
          "--speculative-num-steps to choose)", file=sys.stderr)


def tree_config(args: argparse.Namespace, make):
    """make(steps, topk, draft tokens) (TreeConfig) from the flags; defaults 5 steps, a chain. On an SGLang line a
    chain's draft tokens are steps + 1 whatever was given, as SGLang adjusts them (with its warning)."""
    steps = 5 if args.num_steps is None else args.num_steps
    topk = 1 if args.topk is None else args.topk
    tokens = steps + 1 if args.num_draft_tokens is None else args.num_draft_tokens
    if args.speculative_algorithm is not None and topk == 1 and tokens != steps + 1:
        print(f"--speculative-num-draft-tokens {tokens} is adjusted to --speculative-num-steps + 1 = {steps + 1} "
              "when --speculative-eagle-topk is 1 (as SGLang adjusts it)", file=sys.stderr)
        tokens = steps + 1
    return make(steps, topk, tokens)


def check_kind(args: argparse.Namespace, kind: str) -> None:
    """The draft folder holds `kind` (drafts.draft_kind); refuse it when the algorithm / method asked for another."""
    if args.draft_kinds is not None and kind not in args.draft_kinds:
        asked = (f"--speculative-algorithm {args.speculative_algorithm}" if args.speculative_algorithm else
                 "--speculative-config's method")
        wanted = " or ".join(KIND_WORDS[k] for k in args.draft_kinds)
        sglang = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN"}
        name = sglang[kind] if args.speculative_algorithm else {"mtp": "mtp"}.get(kind, kind)
        raise ValueError(f"{asked} asks for {wanted}, and the draft {args.draft} holds {KIND_WORDS[kind]}: ask for "
                         f"{name}, or give a draft of that kind")


def utilization_len(args: argparse.Namespace, config, max_len: int | None, rows: int, dtype, device) -> int | None:
    """The per-sequence cache length --gpu-memory-utilization allows (None: not given, max_len stands), capped by
    max_len (--max-seq-len) and the model's; refused when the loaded model leaves no room under it."""
    from toolkit.infer.kv_cache import cache_bytes, max_len_for_memory, utilization_budget

    u = args.gpu_memory_utilization
    if u is None:
        return max_len
    budget = utilization_budget(device, u)
    fits = max_len_for_memory(config, max(budget, 0), rows, dtype)
    if fits < 2:
        raise ValueError(f"--gpu-memory-utilization {u}: with the model loaded, {budget / 1e9:.2f} GB is left under "
                         f"that share for a KV cache of {rows} rows ({cache_bytes(config, rows, 1, dtype)} bytes a "
                         "token): raise it, or lower --max-batch-size")
    length = min(fits, max_len or config.max_position_embeddings)
    print(f"--gpu-memory-utilization {u}: {budget / 1e9:.2f} GB for the KV cache of {rows} rows: {length} tokens "
          "each", file=sys.stderr)
    return length
