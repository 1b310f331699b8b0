"""What each kind of draft head learns from the frozen target; the training loop (trainer.py) is shared.

- eagle3: fc over three aux layers, TTT soft cross-entropy on a reduced draft vocabulary (losses.ttt_loss).
- eagle (EAGLE-1/2): fc over [embedding, final normed hidden], one decoder layer, read out by the target's
  frozen lm_head; smooth-L1 regression on the next hidden state plus token loss, as the EAGLE paper trains
  it (regression_weight 1.0, token_weight 0.1); ttt_steps > 1 feeds it its own output, like TTT.
- mtp (DeepSeek-V3 / MiMo NextN): eh_proj over [enorm(embedding), hnorm(final normed hidden)], one block of
  the target's own kind, shared_head norm, the target's lm_head; multi-step training feeds the module its own
  output for ttt_steps steps (the loss of step i weighs loss_decay ** i).
Every head sees step 0's feature at row t and predicts token t + 2 (see ttt.py); eagle and mtp read the whole
target vocabulary (an FR-Spec freq_N.pt truncates it at serve time).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.infer.config import ModelConfig
from toolkit.train.losses import ttt_loss
from toolkit.train.ttt import unroll


class DraftTrainable(nn.Module):
    """What accelerate / DDP / DeepSpeed wrap: the head plus the target's frozen embedding; its forward is the
    whole TTT unroll, so wrappers see one forward per micro-batch."""

    def __init__(self, head: nn.Module, embed_weight: torch.Tensor, steps: int):
        super().__init__()
        self.head, self.steps = head, steps
        self.embed = nn.Embedding.from_pretrained(embed_weight.float(), freeze=True)  # the target's, frozen
        # a checkpoint keeps what training changes: the target's frozen copies (the embedding; eagle's and mtp's
        # lm_head) are taken from the target at every start (a resume refuses another target, run.json), so
        # they are left out of the state saved (for an 8B Llama-3 EAGLE-1/2 head 2 GB of each checkpoint) and
        # not asked for when one is loaded (older checkpoints that hold them load as before)
        self.register_state_dict_post_hook(_drop_frozen)
        self.register_load_state_dict_post_hook(_frozen_not_missing)

    def frozen(self, prefix: str = "") -> set[str]:
        return frozen_names(self, prefix)

    def forward(self, feats: torch.Tensor, input_ids: torch.Tensor, valid: torch.Tensor):
        """feats [B, L, F], input_ids/valid [B, L] -> (steps x logits [B, L, N], steps x hidden [B, L, H])."""
        return unroll(self.head, self.embed, feats.to(self.embed.weight.dtype), input_ids, self.steps, valid)


def frozen_names(module: nn.Module, prefix: str = "") -> set[str]:
    """The names of `module`'s parameters that training leaves alone (the target's copies), with `prefix`."""
    return {prefix + n for n, p in module.named_parameters() if not p.requires_grad}


def _drop_frozen(module: DraftTrainable, state: dict, prefix: str, local_metadata) -> None:
    for name in module.frozen(prefix):
        state.pop(name, None)


def _frozen_not_missing(module: DraftTrainable, incompatible) -> None:
    frozen = module.frozen()
    incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if _unwrapped(k) not in frozen]


def _unwrapped(key: str) -> str:
    """A key as the bare module names it: DDP's `module.` and torch.compile's `_orig_mod.` taken off."""
    while key.startswith(("module.", "_orig_mod.")):
        key = key.split(".", 1)[1]
    return key


@dataclass
class Objective:
    name: str                  # the recipe's `head`
    script: str                # the accelerate entry script

    def features(self, offline_batch: dict) -> torch.Tensor:
        """Step 0's input from a dumped-hidden-states batch (online runs take the target's aux_layers)."""
        return offline_batch["final_hidden"]

    def inputs(self, cfg, feats: torch.Tensor, key: int) -> torch.Tensor:
        """Step 0's input as the head sees it in training; the loss keeps the clean feats. key: a seed unique
        to (run seed, step, micro-batch, rank), so that a resumed run draws the same noise."""
        return feats

    def loss(self, cfg, step_logits, step_hidden, feats, target_logits, loss_mask, t2d, norm=None):
        """-> (weighted loss, per-step token losses [K], per-step accuracies [K], counts [2, K] (losses.ttt_loss));
        norm [K]: each step's denominator (losses.step_counts over the optimizer step), None: this batch's rows."""
        return ttt_loss(step_logits, target_logits, loss_mask, t2d, cfg.loss_decay, norm)


class Eagle3(Objective):
    def __init__(self):
        super().__init__("eagle3", "toolkit/train/eagle3.py")

    def features(self, offline_batch):
        return offline_batch["aux"]

    def build(self, cfg, tcfg: ModelConfig, vocab_ids: list[int], aux_layers: list[int], parts: dict, folder):
        from toolkit.train.head import build_head

        lm_head = parts["lm_head.weight"] if cfg.init_lm_head == "target" else None
        shape = None
        if cfg.draft_config:  # SpecForge's draft-model-config: its attention shape over the target's layer
            from toolkit.train import draft_shape

            spec = draft_shape.read(cfg.draft_config)
            shape = lambda layer: draft_shape.draft_layer(spec, layer, tcfg, cfg.draft_config)  # noqa: E731
        return build_head(tcfg, vocab_ids, aux_layers, lm_head, cfg.seed, cfg.num_layers,
                          intermediate_size=cfg.draft_intermediate_size, shape=shape,
                          norm_before_residual=cfg.norm_before_residual, norm_before_fc=cfg.norm_before_fc)

    def save(self, head, folder, *args):
        from toolkit.infer.drafts import save_eagle3

        save_eagle3(head, folder, *args)


class Eagle(Objective):
    def __init__(self):
        super().__init__("eagle", "toolkit/train/eagle.py")

    def build(self, cfg, tcfg, vocab_ids, aux_layers, parts, folder):
        from toolkit.infer.draft_head import draft_config
        from toolkit.infer.eagle2 import Eagle2Head

        torch.manual_seed(cfg.seed)
        return Eagle2Head(draft_config(tcfg, cfg.num_layers, cfg.draft_intermediate_size),
                          parts["lm_head.weight"].float(), fc_bias=cfg.fc_bias)

    def inputs(self, cfg, feats, key):
        # EAGLE's data augmentation: U(-a, a) noise on the target features the head reads, so that at draft
        # depth 2+ it copes with its own predicted features' error; the regression and token targets stay clean
        if cfg.feature_noise == 0:
            return feats
        gen = torch.Generator(device=feats.device).manual_seed(key)
        noise = torch.rand(feats.shape, generator=gen, device=feats.device, dtype=torch.float32)
        return feats + ((noise * 2 - 1) * cfg.feature_noise).to(feats.dtype)

    def loss(self, cfg, step_logits, step_hidden, feats, target_logits, loss_mask, t2d, norm=None):
        token, losses, accs, counts = ttt_loss(step_logits, target_logits, loss_mask, t2d, cfg.loss_decay, norm)
        L = loss_mask.shape[1]
        regression = 0.0
        for i, h in enumerate(step_hidden[:len(losses)]):
            n = L - (i + 2)
            if n <= 0:  # a micro-batch shorter than the unroll: no row to regress at this step (as ttt_loss)
                continue
            rows = loss_mask[:, i + 2:i + 2 + n].bool()            # the same rows the token loss counts
            # step i at row t predicts the target's hidden state at t + i + 1 (whose lm_head gives token t + i + 2)
            err = F.smooth_l1_loss(h[:, :n].float(), feats[:, i + 1:i + 1 + n].float(), reduction="none").mean(-1)
            denominator = rows.sum().clamp_min(1) if norm is None else norm[i].clamp_min(1e-9)
            regression = regression + cfg.loss_decay ** i * (err * rows).sum() / denominator
        return cfg.regression_weight * regression + cfg.token_weight * token, losses, accs, counts

    def save(self, head, folder, *args):
        from toolkit.infer.eagle2 import save_eagle

        save_eagle(head, folder, *args)


class MTP(Objective):
    def __init__(self):
        super().__init__("mtp", "toolkit/train/mtp.py")

    def build(self, cfg, tcfg, vocab_ids, aux_layers, parts, folder):
        from toolkit.infer.mtp import MTPHead
        from toolkit.train.head import target_layer

        if tcfg.mla is not None:  # ttt.py's unrolled attention is the Llama kind's
            raise ValueError("training an MTP head for a DeepSeek (MLA) target is not supported; serving the MTP "
                             "layers it ships is (toolkit serve --draft TARGET_DIR)")
        # SGLang's MiMoMTP block is Qwen2's: it has neither tensor, and its load_weights treats them differently
        if tcfg.qk_norm:  # a name it has no parameter for (not a .bias) is a KeyError there
            print("warning: this target's decoder block has q/k norms (Qwen3), which SGLang's MiMoMTP block lacks: "
                  "the exported head will serve only in this toolkit; SGLang refuses to load the folder (a KeyError "
                  "on self_attn.q_norm.weight) (docs/formats.md section 14)", file=sys.stderr, flush=True)
        elif tcfg.moe is not None and tcfg.moe.sparse(tcfg.num_layers - 1):  # experts it has no parameters for
            print("warning: this target's last decoder block is a mixture of experts, as the MTP block will be; "
                  "SGLang's MiMoMTP block is a dense Qwen2 block: the exported head will serve only in this "
                  "toolkit (docs/formats.md section 14)", file=sys.stderr, flush=True)
        elif tcfg.attention_bias:  # it skips a .bias it has no parameter for
            print("warning: this target's decoder block has an o_proj bias, which SGLang's MiMoMTP block lacks: the "
                  "exported head serves here, but SGLang would drop that bias without a word and serve another "
                  "function (docs/formats.md section 14)", file=sys.stderr, flush=True)
        if tcfg.rotary_dim is not None:  # Qwen2's attention builds its rope over all of head_dim
            print(f"warning: this target rotates {tcfg.rotary_dim} of each head's {tcfg.head_dim} dims "
                  "(partial_rotary_factor), as the MTP block will; SGLang's MiMoMTP block (Qwen2's attention) rotates "
                  "all of them: the exported head serves here as trained, but SGLang would serve another function "
                  "without a word (docs/formats.md section 14)", file=sys.stderr, flush=True)
        torch.manual_seed(cfg.seed)
        head = MTPHead(tcfg, parts["lm_head.weight"].float())
        if cfg.init_block == "target_last":  # start from the target's last decoder layer (else torch's init)
            last = target_layer(folder, tcfg.num_layers - 1, tcfg)
            head.block.load_state_dict({k: v.float() for k, v in last.items()})
        return head

    def save(self, head, folder, *args):
        from toolkit.infer.mtp import save_mtp

        save_mtp(head, folder, *args)


OBJECTIVES = {o.name: o for o in (Eagle3(), Eagle(), MTP())}
