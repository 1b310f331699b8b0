"""SpecForge's train_eagle3.py options, as a recipe key or override a user brings over from it: each names the key
that does the same here, or why there is none, so that an unknown key is not met with a near-miss guess
(difflib's `total_steps` -> `ttt_steps`). Keys are taken with SpecForge's dashes or underscores."""
from __future__ import annotations

# SpecForge's name -> (our key or None, what to know)
SPECFORGE = {
    "target_model_path": ("model", ""),
    "train_data_path": ("data", "the folder `toolkit prepare-data --data FILE.jsonl --out DIR` writes"),
    "train_hidden_states_path": ("hidden_states", "the shards `toolkit dump-hidden-states` writes"),
    "draft_model_config": ("draft_config", ""),
    "num_epochs": ("epochs", ""),
    "learning_rate": ("lr", ""),
    "max_length": ("max_len", ""),
    "ttt_length": ("ttt_steps", ""),
    "total_steps": ("schedule_steps", "the schedule's length; max_steps stops the run"),
    "max_num_steps": ("max_steps", "the run stops there; the schedule spans schedule_steps, by default the same"),
    "draft_accumulation_steps": ("grad_accum", ""),
    "ckpt_dir": ("init_from", "a trained draft folder to start from; `--resume` goes on with a run's own "
                              "checkpoint"),
    "resume": (None, "give `--resume` on the command line: it goes on from output_dir's last checkpoint"),
    "eval_interval": ("eval_every", ""),
    "save_interval": ("save_every", ""),
    "log_interval": ("log_every", ""),
    "log_steps": ("log_every", ""),
    "wandb_name": ("wandb_run", ""),
    "wandb_key": (None, "set WANDB_API_KEY in the environment (or `wandb login`)"),

    "chat_template": (None, "give it to `toolkit prepare-data --chat-template` (default: the target's own)"),
    "is_preformatted": (None, "prepare-data renders the chat template itself from messages / conversations rows"),
    "eval_data_path": ("eval_data", "a prepared folder; its first eval_samples rows are answered by the engine"),
    "eval_hidden_states_path": (None, "evaluation runs the target online, with the engine, on eval_data's rows"),
    "embedding_key": (None, "the target's embedding is found by its checkpoint's names"),
    "lm_head_key": (None, "the target's lm_head is found by its checkpoint's names"),
    "tp_size": (None, "the target is loaded whole on each process; data parallelism comes from accelerate launch "
                      "--num_processes, and DeepSpeed ZeRO configs in recipes/ shard the optimizer state"),
    "target_model_backend": (None, "the target runs on this toolkit's own engine (docs/formats.md lists its "
                                   "model types)"),
    "attention_backend": (None, "training-time test attention is blockwise, recomputed for long rows"),
    "sp_ulysses_size": (None, "no sequence parallelism: rows up to max_len fit one device"),
    "sp_ring_size": (None, "no sequence parallelism: rows up to max_len fit one device"),
    "is_vlm": (None, "text targets only (a multimodal checkpoint's text model can be the target)"),
    "build_dataset_num_proc": (None, "give it to prepare-data: `toolkit prepare-data --num-proc N`"),
}


def explain(key: str) -> str | None:
    """What to give here for SpecForge's `key`, or None when it is not one of SpecForge's."""
    name = key.strip().lstrip("-").replace("-", "_")
    if name not in SPECFORGE:
        return None
    ours, note = SPECFORGE[name]
    if ours is None:
        return f"{key} is SpecForge's, not taken here: {note}"
    return f"{key} is SpecForge's; here it is {ours}" + (f" ({note})" if note else "")
