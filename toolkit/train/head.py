"""Building a head to train: the target weights it borrows (embedding, lm_head, a decoder layer), EAGLE-3's
draft vocabulary (given, or the most frequent assistant tokens of the training data) and head (lm_head rows
copied from the target, or random as SpecForge starts it; or a trained draft folder to start from), and the
signature a resumed run must match."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from torch import nn

from toolkit.infer.config import ModelConfig
from toolkit.infer.draft_head import draft_config
from toolkit.infer.drafts import Eagle3Head


def target_tensors(folder: str | Path, names: list[str]) -> dict[str, torch.Tensor]:
    """Only the named target weights (embedding, lm_head), read lazily from the safetensors files; a tied
    lm_head is the embedding."""
    from toolkit.infer.hf_names import not_text, our_name
    from toolkit.infer.target_weights import tie_embeddings
    from toolkit.infer.weight_files import read_safetensors, weight_files

    cfg = ModelConfig.from_folder(folder)
    tied = {"embed_tokens.weight", "lm_head.weight"} if cfg.tie_word_embeddings else set()
    found = {}
    for f in weight_files(folder):
        with read_safetensors(f, "target weights") as sf:
            for key in sf.keys():
                short = None if not_text(key) else our_name(cfg.model_type, key)  # a multimodal one's text model
                if short in names or short in tied:  # both halves of a tie: the engine's rule needs both
                    found[short] = sf.get_tensor(key)
    if tied and tie_embeddings(found, Path(folder)):  # as load_target ties them
        found["lm_head.weight"] = found["embed_tokens.weight"]
    found = {k: v for k, v in found.items() if k in names}
    missing = [n for n in names if n not in found]
    if missing:
        raise ValueError(f"target {folder}: weights {missing} not found")
    return found


def target_layer(folder: str | Path, index: int, config: ModelConfig) -> dict[str, torch.Tensor]:
    """The target's decoder layer `index` as a Block state dict (MTP can start from the last one); GPT-OSS's
    MXFP4 experts and an FP8 checkpoint's weights dequantized."""
    from toolkit.infer import fp8, mxfp4
    from toolkit.infer.hf_names import not_text, our_name, our_tensors
    from toolkit.infer.weight_files import read_safetensors, weight_files

    prefix = f"layers.{index}."
    found, pending = {}, fp8.Pending(json.loads((Path(folder) / "config.json").read_text()))
    for f in weight_files(folder):
        with read_safetensors(f, "target weights") as sf:
            for key in sf.keys():
                if not_text(key) or not our_name(config.model_type, key).startswith(prefix):
                    continue
                if not pending.take(sf, key):  # an FP8 weight or scale: dequantized below
                    found.update((ours[len(prefix):], t) for ours, t in our_tensors(config, key, sf.get_tensor(key)))
    for key, t in pending.dequantized(torch.float32, str(folder)).items():
        found.update((ours[len(prefix):], t) for ours, t in our_tensors(config, key, t))
    if not found:
        raise ValueError(f"target {folder}: no weights for layer {index}")
    packed = {k: found.pop(k) for k in list(found) if k.endswith(mxfp4.SUFFIXES)}
    return {**found, **mxfp4.join_packed(packed, torch.float32)}


def draft_vocab(assistant_ids: torch.Tensor | Iterable[torch.Tensor], size: int, vocab_size: int,
                forced: list[int]) -> list[int]:
    """The `size` most frequent assistant-token ids (FR-Spec's rule), the template's special tokens kept;
    assistant_ids: one tensor of ids or an iterator of them (counted chunk by chunk)."""
    from toolkit.tokenmap.maps import check_ids_fit, freq_list

    counts = np.zeros(vocab_size, dtype=np.int64)
    for ids in [assistant_ids] if isinstance(assistant_ids, torch.Tensor) else assistant_ids:
        # an id past the target's vocabulary would lengthen the counts and could be chosen
        check_ids_fit([int(ids.max())] if len(ids) else [], vocab_size, "the training data")
        counts += np.bincount(ids.numpy(), minlength=vocab_size)
    return freq_list(counts, min(size, vocab_size), forced)


def build_head(target_cfg: ModelConfig, vocab_ids: list[int], aux_layers: list[int], lm_head: torch.Tensor | None,
               seed: int, num_layers: int = 1, intermediate_size: int | None = None, shape=None,
               **variant) -> Eagle3Head:
    """A fresh head; lm_head rows copied from the target's lm_head [V, H] when given, else torch's default init;
    intermediate_size: its MLP width (None: the target's); shape: a function that gives the layer config its own
    attention shape (draft_shape.draft_layer), None: the target's; variant: norm_before_residual / norm_before_fc."""
    ids = torch.tensor(sorted(vocab_ids))
    torch.manual_seed(seed)
    layer = draft_config(target_cfg, num_layers, intermediate_size)
    head = Eagle3Head(layer if shape is None else shape(layer), target_cfg.hidden_size,
                      ids - torch.arange(len(ids)), aux_layers, **variant)
    if lm_head is not None:
        with torch.no_grad():
            head.lm_head.weight.copy_(lm_head[ids].float())
    return head


def start_from(kind: str, folder: str | Path, target_cfg: ModelConfig, parts: dict) -> nn.Module:
    """A trained draft folder to start training from (`init_from`): our own export, or the public layouts the
    engine serves (SGLang / SafeAILab EAGLE-3, EAGLE-1/2, MTP). For fine-tuning a released head on your own
    data, or extending a finished run with a new schedule. Its kind must be the recipe's `head`."""
    from types import SimpleNamespace

    from toolkit.infer.drafts import load_eagle3
    from toolkit.infer.eagle2 import load_eagle2
    from toolkit.infer.draft_folder import draft_kind
    from toolkit.infer.mtp import load_mtp

    from toolkit import hub

    folder = hub.draft_folder(str(folder), "init_from")  # a released head as a hub id: fetched, or from the HF cache
    found = draft_kind(folder)
    if found != kind:
        raise ValueError(f"init_from {folder}: holds an {found} draft, but the recipe trains an {kind} head")
    if kind == "eagle3":
        return load_eagle3(folder, target_cfg, lm_head=parts["lm_head.weight"])
    # the EAGLE-1/2 and MTP loaders read only these three things of a target (their lm_head is the target's)
    target = SimpleNamespace(config=target_cfg, lm_head=SimpleNamespace(weight=parts["lm_head.weight"]),
                             embed_tokens=SimpleNamespace(weight=parts["embed_tokens.weight"]))
    return (load_mtp if kind == "mtp" else load_eagle2)(folder, target)


def keep_variant(cfg, heads: list[nn.Module], start: nn.Module) -> None:
    """An EAGLE-3 draft trained on from (`init_from`) keeps its forward variant (norm_before_residual /
    norm_before_fc): the recipe may not ask for one the draft was not trained with."""
    from toolkit.infer.eagle3_config import VARIANTS

    asked = [f for f in VARIANTS if getattr(cfg, f) and not getattr(start, f)]
    if asked:
        raise ValueError(f"{', '.join(asked)}: the init_from draft {cfg.init_from} was not trained with it; leave "
                         "it out to train on as the draft computes")
    for h in heads:
        h.take_variant(start)


def take_weights(head: nn.Module, start: nn.Module, folder: str | Path) -> None:
    """Copy a loaded draft's weights into the head being trained; every tensor must fit (same layers, same draft
    vocabulary), or the run is refused with the differences named."""
    mine, theirs = head.state_dict(), start.state_dict()
    diff = [f"{k} {tuple(mine[k].shape) if k in mine else 'absent'} here, "
            f"{tuple(theirs[k].shape) if k in theirs else 'absent'} in the draft"
            for k in sorted(set(mine) | set(theirs))
            if k not in mine or k not in theirs or mine[k].shape != theirs[k].shape]
    if ("fc.bias" in mine) != ("fc.bias" in theirs):  # an EAGLE-1/2 head: say which setting fits the draft
        diff.insert(0, f"the draft's fc has {'a' if 'fc.bias' in theirs else 'no'} bias: train on from it with "
                       f"fc_bias={'true' if 'fc.bias' in theirs else 'false'}")
    if diff:
        raise ValueError(f"init_from {folder}: the draft does not fit the head this recipe builds "
                         f"(num_layers, draft vocabulary, fc_bias?): " + "; ".join(diff[:6]))
    with torch.no_grad():
        for k, v in mine.items():
            v.copy_(theirs[k].to(v.dtype))


def pick_vocabulary(cfg, tcfg: ModelConfig, folder: Path, data, train_rows: list[int], start: nn.Module | None) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """The head's draft vocabulary -> (target ids, d2t, t2d): EAGLE-1/2 and MTP read the whole target vocabulary;
    EAGLE-3 takes `token_map`, else the `init_from` draft's own, else the FR-Spec rule on the training rows."""
    from toolkit.data.chat import ChatRenderer
    from toolkit.data.tokenizer import load_tokenizer
    from toolkit.infer.loading import stop_ids
    from toolkit.tokenmap.maps import check_vocab_map, load_vocab_map, vocab_map

    if cfg.head != "eagle3":  # EAGLE-1/2 and MTP read out through the target's whole lm_head
        vocab_ids = list(range(tcfg.vocab_size))
        d2t, t2d = vocab_map(vocab_ids, tcfg.vocab_size)
    elif cfg.token_map:
        d2t, t2d = load_vocab_map(cfg.token_map)
        check_vocab_map(d2t, t2d, tcfg.vocab_size, f"token_map {cfg.token_map}")
        vocab_ids = (torch.arange(len(d2t)) + d2t).tolist()
        if start is not None and vocab_ids != (torch.arange(len(start.d2t)) + start.d2t).tolist():
            raise ValueError(f"token_map {cfg.token_map}: differs from the draft vocabulary of init_from "
                             f"{cfg.init_from}; leave token_map out to keep the draft's")
    elif start is not None:  # the started-from head's own draft vocabulary
        vocab_ids = (torch.arange(len(start.d2t)) + start.d2t).tolist()
        d2t, t2d = vocab_map(vocab_ids, tcfg.vocab_size)
    else:  # FR-Spec rule on the training data's assistant tokens, the template's special tokens kept
        tok = load_tokenizer(model=str(folder))  # the template's special tokens and every stop id are kept
        forced = sorted(set(ChatRenderer(tok).template_special_ids()) | stop_ids(tok, folder))
        if cfg.draft_vocab_size > tcfg.vocab_size:
            print(f"note: draft_vocab_size {cfg.draft_vocab_size} is more than the target's {tcfg.vocab_size} ids: "
                  "the draft reads out over the whole vocabulary", file=sys.stderr)
        vocab_ids = draft_vocab(data.assistant_tokens(train_rows), cfg.draft_vocab_size, tcfg.vocab_size, forced)
        d2t, t2d = vocab_map(vocab_ids, tcfg.vocab_size)
    if int(t2d.sum()) == 0 or len(t2d) != tcfg.vocab_size:
        raise ValueError(f"token map {cfg.token_map}: does not fit the target vocabulary ({tcfg.vocab_size})")
    return vocab_ids, d2t, t2d


def head_signature(kind: str, head: nn.Module, target_fingerprint: str) -> dict:
    """What a resumed run must share with the saved one: the head kind, its target, its weight shapes and
    (EAGLE-3) its draft vocabulary."""
    return {"head": kind, "target_fingerprint": target_fingerprint, "aux_layers": list(head.aux_layers),
            "draft_vocab_size": len(head.d2t), "d2t_sum": int(head.d2t.sum()),
            "shapes": {k: list(v.shape) for k, v in head.state_dict().items() if k not in ("d2t", "lm_head.weight")}}


def check_signature(saved_path: Path, now: dict, target_folder: Path | None = None) -> None:
    saved = json.loads(saved_path.read_text())
    if target_folder is not None and saved.get("target_fingerprint") not in (None, now["target_fingerprint"]):
        from toolkit.models import same_target

        if same_target(saved["target_fingerprint"], target_folder):  # recorded by the older rule
            saved["target_fingerprint"] = now["target_fingerprint"]
    diff = {k: (saved.get(k), v) for k, v in now.items() if saved.get(k) != v}
    if diff:
        raise ValueError("cannot resume: the draft/target differ from the saved run: " + "; ".join(
            f"{k} saved {a} now {b}" for k, (a, b) in diff.items()) + ". Use --overwrite to start afresh.")


def serving_notes(cfg, aux_layers: list[int], num_layers: int) -> list[str]:
    """What SGLang or vLLM would serve differently from how this EAGLE-3 head trains: aux layer ids they capture
    otherwise (refused when the recipe asks for them; said when they are a small target's default) and extra
    draft layers, which vLLM loads and SGLang does not serve as trained."""
    if cfg.head != "eagle3":
        return []
    from toolkit.infer.draft_checks import aux_layer_problems

    notes = aux_layer_problems(aux_layers, num_layers)
    if notes and cfg.aux_layers:
        raise ValueError("aux_layers: " + "; ".join(notes))
    if cfg.num_layers > 1:
        notes.append(f"num_layers {cfg.num_layers}: vLLM loads the extra layers (written as layers.{{k}}); SGLang's "
                     "LlamaForCausalLMEagle3 does not serve them as trained; 1 layer is what both serve")
    return notes
