"""vLLM's speculative launch: `--speculative-config` JSON (method, model, num_speculative_tokens, ngram's lookup
sizes, ...) read as our flags, the chain a draft's config.json gives when no length is, and `vllm serve SPECULATOR`
(a speculators folder as the model: it drafts for the verifier it names). Called from launch_flags.apply."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

VLLM_MTP = ("mtp", "deepseek_mtp", "mimo_mtp", "glm4_moe_mtp", "ernie_mtp", "qwen3_next_mtp", "longcat_flash_mtp")
VLLM_SERVED = ("eagle", "eagle3", "ngram", "ngram_gpu", *VLLM_MTP, "(any *_mtp)")
# keys vLLM takes that change nothing here at these values (their defaults), so a copied config with them reads
VLLM_NEUTRAL = {"disable_padded_drafter_batch": False, "parallel_drafting": False, "use_local_argmax_reduction": False,
                "rejection_sample_method": "strict", "draft_sampling_method": "greedy", "max_model_len": None,
                "code_revision": None, "tensor_parallel_size": None}
# keys of vLLM's SpeculativeConfig taken here; the others change what is drafted or how it is accepted
VLLM_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
             "disable_by_batch_size", "revision", "draft_tensor_parallel_size", "enforce_eager", "quantization")


def set_once(args, name: str, value, source: str) -> None:
    """Set args.name from a launch flag; refuse one given twice with two values."""
    old = getattr(args, name)
    if old not in (None, value) and not (name == "lookup" and old == 0):
        raise ValueError(f"{source} sets --{name.replace('_', '-')} {value}, and --{name.replace('_', '-')} {old} "
                         "is given too: give it once")
    setattr(args, name, value)


def read(args, text: str) -> None:
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"--speculative-config {text!r}: not JSON ({err.msg}); give e.g. "
                         '\'{"method": "eagle3", "model": "./ckpt", "num_speculative_tokens": 3}\'') from None
    if not isinstance(cfg, dict):
        raise ValueError(f"--speculative-config {text!r}: a JSON object is expected")
    other = sorted(k for k in cfg if k not in VLLM_KEYS and cfg[k] is not None
                   and not (k in VLLM_NEUTRAL and cfg[k] == VLLM_NEUTRAL[k]))
    if other:
        tree = (" (for a static speculative_token_tree give --topk and --num-draft-tokens: the engine drafts a "
                "dynamic tree)" if "speculative_token_tree" in other else "")
        raise ValueError(f"--speculative-config: {', '.join(other)} not served here{tree}; the keys taken are "
                         f"{', '.join(VLLM_KEYS)}")
    for key, fine in (("draft_tensor_parallel_size", (None, 1)), ("quantization", (None,))):
        if cfg.get(key) not in fine:
            raise ValueError(f"--speculative-config: {key} {cfg[key]!r} is not served (accepted: "
                             f"{' or '.join('null' if v is None else repr(v) for v in fine)}): the draft runs in the "
                             "target's precision on its device")
    method, model, k = cfg.get("method"), cfg.get("model"), cfg.get("num_speculative_tokens")
    if method is None and model in ("ngram", "[ngram]"):
        method = "ngram"
    if method is not None and method.endswith("_mtp"):
        method = "mtp"  # vLLM maps every *_mtp name to its mtp method
    if method is not None and method not in VLLM_SERVED:
        raise ValueError(f"--speculative-config: method {method!r} is not served here (accepted: "
                         f"{', '.join(VLLM_SERVED)}); a separate draft model, Medusa and MLP speculators are not")
    if k is None and method in ("ngram", "ngram_gpu"):
        raise ValueError("--speculative-config: method ngram needs num_speculative_tokens, the tokens looked up per "
                         "step (vLLM's too)")
    if k is not None:
        _chain_length(k, "--speculative-config: num_speculative_tokens")
    source = "--speculative-config"
    if cfg.get("disable_by_batch_size") is not None:
        set_once(args, "speculative_disable_by_batch_size", cfg["disable_by_batch_size"], source)
    if cfg.get("enforce_eager"):
        args.eager_draft = True  # the drafter's enforce_eager, as vLLM's: the target's steps keep their graphs
    if cfg.get("revision") is not None:
        set_once(args, "draft_revision", cfg["revision"], source)
    if method in ("ngram", "ngram_gpu"):
        lo, hi = cfg.get("prompt_lookup_min"), cfg.get("prompt_lookup_max")
        lo, hi = (5, 5) if lo is None and hi is None else (lo or hi, hi or lo)  # vLLM's defaults
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            raise ValueError(f"--speculative-config: prompt_lookup_min {lo!r} and prompt_lookup_max {hi!r} must be "
                             "integers with 1 <= min <= max")
        if args.draft is not None:
            raise ValueError("--speculative-config method ngram takes no draft model; drop --draft")
        args.no_speculation = True
        set_once(args, "lookup", k, source)
        args.lookup_max_ngram, args.lookup_min_ngram = hi, lo
        return
    if model is None and method not in VLLM_MTP:
        raise ValueError(f"--speculative-config: method {method!r} needs \"model\", the draft folder or hub id")
    set_once(args, "draft", model if model is not None else args.model, source)  # MTP: the target's own layers
    if args.draft is None:
        raise ValueError(f"--speculative-config method {method} without \"model\" drafts with the target's own MTP "
                         "layers: give the target (vllm serve's MODEL, or --model)")
    args.draft_kinds = None if method is None else ("mtp",) if method in VLLM_MTP else (method,)
    if k is None:  # vLLM takes the draft config's n_predict: read once the folder is found (steps_from_draft)
        args.chain_from_draft = source
    else:
        _chain(args, k, source)


def _chain_length(k, what: str) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"{what} must be an integer >= 1 (the tokens drafted per step), got {k!r}")
    return k


def _chain(args, k: int, source: str) -> None:
    for name, value in (("num_steps", k), ("topk", 1), ("num_draft_tokens", k + 1)):  # vLLM drafts a chain
        set_once(args, name, value, source)


def draft_chain_length(cfg: dict) -> int | None:
    """The chain length a draft's config.json gives vLLM when num_speculative_tokens is not: a speculators
    proposal's speculative_tokens, n_predict, or the MTP layers declared (num_nextn_predict_layers); None: none."""
    spec = cfg.get("speculators_config") or {}
    methods = spec.get("proposal_methods") or []
    if methods and isinstance(methods[0], dict) and methods[0].get("speculative_tokens") is not None:
        return methods[0]["speculative_tokens"]  # vLLM's extract_vllm_speculative_config takes the first
    text = cfg.get("text_config") or cfg
    return cfg.get("n_predict") or text.get("num_nextn_predict_layers") or None


def steps_from_draft(args: argparse.Namespace) -> bool:
    """A vLLM line without num_speculative_tokens, once args.draft is a folder: the chain its config gives (vLLM's
    default), refused as vLLM refuses it when the config gives none. True when the chain was set here."""
    source = getattr(args, "chain_from_draft", None)
    if source is None or args.no_speculation:
        return False
    path = Path(args.draft).expanduser() / "config.json"
    cfg = json.loads(path.read_text()) if path.is_file() else {}
    k = draft_chain_length(cfg if isinstance(cfg, dict) else {})
    if k is None:
        raise ValueError(f"{source}: num_speculative_tokens is needed, as vLLM needs it, when the draft's config.json "
                         f"({path}) gives no n_predict, speculators speculative_tokens or num_nextn_predict_layers")
    _chain(args, _chain_length(k, f"{path}'s chain length"), source)
    print(f"{source}: num_speculative_tokens {k}, from {path} (as vLLM takes it)", file=sys.stderr)
    return True


def speculators_model(args: argparse.Namespace) -> None:
    """vLLM's `vllm serve SPECULATOR`: a speculators folder (or hub id) given as the model names its verifier as the
    target and itself as the draft, with its first proposal's speculative_tokens as the chain."""
    model = args.model
    if model is None:
        return
    if Path(model).expanduser().is_dir():
        path = Path(model).expanduser() / "config.json"
    else:
        from toolkit import hub

        if not hub.HUB_ID.match(model):
            return
        try:  # only config.json: a target's weights are fetched when it is loaded
            path = Path(hub.file(f"{model}/config.json", "--model"))
        except ValueError:
            return  # not reachable now: the target's loader names what is wrong
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(cfg, dict) or not cfg.get("speculators_model_type"):
        return
    given = [flag for flag, on in (("--draft", args.draft is not None),
                                   ("--speculative-config", args.speculative_config is not None),
                                   ("--speculative-algorithm", args.speculative_algorithm is not None)) if on]
    if given:
        raise ValueError(f"the model {model} is a speculators folder, which names its draft (itself) and its target "
                         f"(the verifier) as vLLM serves it: drop {', '.join(given)}, or give the verifier as the "
                         "model")
    verifier = ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    if not verifier:
        raise ValueError(f"the model {model} is a speculators folder without speculators_config.verifier."
                         "name_or_path: give the target with --model and the folder with --draft")
    args.draft, args.model = model, None  # draft_target takes the verifier
    args.draft_kinds = None
    args.chain_from_draft = f"the speculators model {model}"
    print(f"{model} is a speculators {cfg['speculators_model_type']} folder: it drafts for its verifier {verifier}, "
          "as vLLM serves it", file=sys.stderr)
