"""A draft folder: what it holds (an EAGLE-3 head in any of the layouts we read, an EAGLE-1/2 head, an MTP module
or a target that ships MTP layers), which target it drafts for (recorded in its config.json, checked by
fingerprint against a --model given), and the head loaded for that target."""
from __future__ import annotations

import json
from pathlib import Path


from toolkit.embedded import DEFAULT_MODEL
from toolkit.infer.weight_files import read_safetensors, weight_files


def recorded_target(draft: str) -> dict:
    """What a draft folder records of its target (config.json "toolkit": target, target_fingerprint, ...; a
    speculators folder's verifier, as vLLM takes it)."""
    path = Path(draft) / "config.json"
    if not path.is_file():
        raise ValueError(f"--draft {draft}: {no_draft_there(draft)}")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("toolkit") or {}, dict):
        what = f"a {type(cfg).__name__}" if not isinstance(cfg, dict) else f"toolkit: {cfg['toolkit']!r}"[:60]
        raise ValueError(f"{path}: a draft's config.json is a JSON object (its \"toolkit\" entry one too); this one "
                         f"holds {what}")
    verifier = ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    return cfg.get("toolkit") or ({"target": verifier} if verifier else {})


def draft_target(draft: str, model: str | None) -> Path:
    """The target folder for `draft`: `model` when given (refused if the draft records another target),
    else the one the draft records, else the embedded default."""
    from toolkit.models import fingerprint, resolve_target, same_target

    recorded = recorded_target(draft)
    cfg = json.loads((Path(draft) / "config.json").read_text())
    if not recorded and model is None and _ships_mtp(cfg):
        # a target with its own MTP layers drafts for itself; an MTP-only export has no body to be the target
        if not _holds_target_body(Path(draft), cfg):
            archs = ", ".join(cfg.get("architectures") or []) or "no architectures"
            raise ValueError(f"--draft {draft} holds MTP layers only ({archs}), not a target to draft for (a "
                             "target that ships MTP layers holds its embed_tokens too and names no *NextN "
                             "architecture); pass --model with the target's folder")
        recorded = {"target": str(draft)}
    if model is None and recorded.get("target"):
        try:
            folder = resolve_target(recorded["target"])
        except ValueError:
            raise ValueError(f"the draft {draft} records its target as {recorded['target']!r}, which is neither "
                             "a folder here, a reachable hub id nor a built-in alias; pass --model with that "
                             "target's folder") from None
    else:
        folder = resolve_target(model or DEFAULT_MODEL)
    if recorded.get("target_fingerprint") and not same_target(recorded["target_fingerprint"], folder):
        given = f"--model {model}" if model else f"the target it records, {recorded.get('target')} ({folder}),"
        raise ValueError(f"{given} is not the target the draft {draft} was trained for: the draft records "
                         f"{recorded.get('target')} with fingerprint {recorded['target_fingerprint']}, this "
                         f"target's is {fingerprint(folder)} (config.json or the weights differ)")
    return folder


def _ships_mtp(cfg: dict) -> bool:
    """True for a folder (its config.json) holding MTP layers: our MTP drafts and targets such as MiMo or
    DeepSeek-V3."""
    return bool(cfg.get("text_config", cfg).get("num_nextn_predict_layers")) or \
        (cfg.get("toolkit") or {}).get("head") == "mtp"


def _holds_target_body(folder: Path, cfg: dict) -> bool:
    """Whether a folder that ships MTP layers holds its target too (its embedding or lm_head, under the names
    load_target reads), rather than the MTP layers alone, as SGLang's export_deepseek_nextn.py writes them
    (architectures *NextN, num_hidden_layers 1, the layer renumbered model.layers.0)."""
    if any(a.endswith("NextN") for a in cfg.get("architectures") or []):
        return False
    for f in weight_files(folder):
        with read_safetensors(f, "weights") as sf:
            if {k.removeprefix("model.") for k in sf.keys()} & {"embed_tokens.weight", "lm_head.weight"}:
                return True
    return False


def no_draft_there(folder: str | Path) -> str:
    """Why `folder` is no draft folder, in words a user can act on: it does not exist, or it is a training run
    (whose export is draft/), or it has no config.json."""
    folder = Path(folder)
    if not folder.exists():
        return "no such folder (give a draft checkpoint folder)"
    if (folder / "draft" / "config.json").is_file():  # a training run's folder: its export is draft/
        return f"no config.json there; {folder / 'draft'} is a draft (a training run exports there)"
    return "no config.json there (give a draft checkpoint folder)"


def draft_kind(folder: str | Path) -> str:
    """What a draft folder holds, from its config.json: "eagle3" (LlamaForCausalLMEagle3 and the other names),
    "mtp" (our MTP drafts, or a target that ships MTP layers) or "eagle" (EAGLE-1/2, the rest)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"draft {folder}: {no_draft_there(folder)}")
    from toolkit.json_files import read_json

    cfg = read_json(path, "draft config")
    if not isinstance(cfg, dict):
        raise ValueError(f"draft {folder}: config.json holds {type(cfg).__name__}, not a JSON object of the head's "
                         "settings")
    archs = cfg.get("architectures") or []
    from toolkit.infer.eagle3_config import is_eagle3, refuse_other_speculators

    if is_eagle3(cfg):  # ours / SGLang's, vLLM's and speculators' names (infer/eagle3_config.py)
        return "eagle3"
    refuse_other_speculators(cfg, folder)
    if _ships_mtp(cfg):
        return "mtp"
    # EAGLE-1/2 heads have one decoder layer (SafeAILab's configs name plain LlamaForCausalLM); a config with
    # several layers and no draft marker is a target, given where a draft was expected
    if cfg.get("num_hidden_layers", 1) > 1 and not cfg.get("toolkit") and not any("Eagle" in a for a in archs):
        raise ValueError(f"draft {folder}: this is a target model ({', '.join(archs) or cfg.get('model_type')}, "
                         f"{cfg['num_hidden_layers']} layers), not a draft folder; give it as --model and a draft "
                         "(EAGLE-3, EAGLE-1/2 or MTP folder) as --draft")
    return "eagle"


def load_draft(folder: str, target, token_map: str | None):
    """An EAGLE-3 head (architectures LlamaForCausalLMEagle3), an MTP module (our MTP drafts, or a target's own
    MTP layers) or an EAGLE-1/2 head, for `target`."""
    from toolkit.infer.drafts import load_eagle3
    from toolkit.infer.eagle2 import load_eagle2
    from toolkit.infer.mtp import load_mtp

    kind = draft_kind(folder)
    if kind == "eagle3" and token_map is not None:
        raise ValueError("--token-map applies to EAGLE-1/2 and MTP heads; an EAGLE-3 head carries its own d2t")
    from toolkit.infer.prepare import fuse_projections, readout_layout

    dtype, device = target.embed_tokens.weight.dtype, target.embed_tokens.weight.device
    if kind == "eagle3":
        head = load_eagle3(folder, target.config, dtype, device, lm_head=target.lm_head.weight)
    elif kind == "mtp":
        head = load_mtp(folder, target, token_map, dtype)
    else:
        head = load_eagle2(folder, target, token_map, dtype)
    readout_layout(head.lm_head)
    fuse_projections(head)  # inference only: q/k/v and gate/up as one GEMM each, as in the target
    return head
