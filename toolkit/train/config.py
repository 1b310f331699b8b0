"""Training configuration: a dataclass validated on construction (recipe.py reads it from a recipe YAML plus
`key=value` overrides), and which of its keys a resumed run must keep."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

from toolkit.cpu_speed import threads_problem
from toolkit.seeds import seed_problem


@dataclass
class TrainConfig:
    # what to train on
    model: str = "smollm2-135m-instruct"     # target: folder, alias or hub id
    data: str = ""                           # prepared dataset folder (toolkit prepare-data)
    hidden_states: str | None = None         # offline mode: shards folder (toolkit dump-hidden-states)
    output_dir: str = "runs/eagle3"
    # the head
    head: str = "eagle3"                     # eagle3 | eagle (EAGLE-1/2) | mtp; each has its entry script
    num_layers: int = 1
    draft_intermediate_size: int | None = None  # eagle3 / eagle: the head's MLP width (default the target's
    #                                          intermediate_size; SpecForge gives gpt-oss-20b's head 17280)
    aux_layers: list[int] | None = None      # target layer outputs fused by fc (default [1, L//2-1, L-4])
    token_map: str | None = None             # vocab_map_N.safetensors; else built from the data's assistant tokens
    draft_vocab_size: int = 32000            # used when token_map is absent (capped at the target vocab)
    init_lm_head: str = "target"             # "target": rows of the target's lm_head; "random" (SpecForge)
    init_block: str = "random"               # mtp: "target_last" starts the block from the target's last layer
    init_from: str | None = None             # a trained draft folder (or hub id) to start from (its vocabulary,
    #                                          aux layers)
    draft_config: str | None = None          # eagle3: SpecForge's draft-model-config JSON, read as the head's shape
    #                                          (layers, MLP width, attention heads, draft vocabulary, aux layers)
    regression_weight: float = 1.0           # eagle: smooth-L1 on the next hidden state (EAGLE paper: 1.0)
    token_weight: float = 0.1                # eagle: soft cross-entropy through the frozen lm_head (paper: 0.1)
    feature_noise: float | None = None       # eagle: U(-a, a) noise added to the target features the head
    #                                          reads (EAGLE paper: 0.1, the default for eagle; 0 for the others)
    fc_bias: bool = False                    # eagle: fc with a bias (SafeAILab's default). vLLM's EAGLE-1 fc has
    #                                          none: a head without one serves in SGLang and vLLM alike
    norm_before_residual: bool = False       # eagle3: the first layer's residual taken after hidden_norm
    #                                          (speculators' default): vLLM serves it, SGLang reads no such key
    norm_before_fc: bool = False             # eagle3: an RMSNorm over the 3 aux states before fc (vLLM reads it)
    # training-time test
    ttt_steps: int = 7
    loss_decay: float = 0.8
    # optimisation
    max_len: int = 2048
    batch_size: int = 1                      # sequences per micro-batch per process
    grad_accum: int = 1
    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_ratio: float = 0.02
    scheduler: str = "cosine"                # cosine | linear | constant
    max_grad_norm: float = 0.5
    max_steps: int | None = None             # optimizer steps; default: epochs over the data
    schedule_steps: int | None = None        # the lr schedule's length (warm-up share, decay) when it differs from
    #                                          the run's: stop early in a longer cosine, resume into it unchanged
    epochs: float = 1.0
    max_minutes: float | None = None         # wall-clock budget: stop, save and export at the first step past it
    seed: int = 0
    dtype: str = "auto"                      # target dtype: auto = the GPU's half precision (bf16, fp16 before
    #                                          sm_80), on a CPU bf16 under bf16 autocast, else fp32 (precision.py)
    mixed_precision: str = "auto"            # head autocast: no | bf16 | fp16; auto = a half precision the launch
    #                                          named, else on a CPU by its GEMM rates (cpu_speed.py), on a GPU bf16
    #                                          from sm_80, fp16 with loss scaling before it (precision.py)
    # bookkeeping
    log_every: int = 10
    save_every: int = 500
    keep_checkpoints: int = 2
    eval_every: int = 0                      # 0 = only at the end
    eval_samples: int = 8                    # held back from training; engine tau measured on their prompts
    eval_data: str | None = None             # a prepared folder evaluated on (its first eval_samples rows);
    #                                          then every row of data is trained on
    eval_max_new_tokens: int = 64
    wandb_project: str | None = None         # the trackers' project (default: output_dir's name)
    wandb_run: str | None = None
    report_to: list[str] | None = None       # accelerate's trackers: wandb, tensorboard (under output_dir/runs),
    #                                          mlflow, swanlab, ...; default wandb when wandb_project is set
    threads: int | None = None               # torch CPU threads
    dist_timeout: float | None = None        # minutes a rank waits on the others (torch's default: 10 on GPUs,
    #                                          30 on CPUs); raise it when rank 0's vocabulary count of a big corpus
    #                                          outlasts it
    extra: dict = field(default_factory=dict)  # free-form notes recorded with the run

    def __post_init__(self):
        problems = []
        if self.draft_config:  # first: it fills num_layers, draft_intermediate_size, draft_vocab_size, aux_layers
            from toolkit.train.draft_shape import merge

            problems += merge(self)
        if self.feature_noise is None:
            self.feature_noise = 0.1 if self.head == "eagle" else 0.0
        if not (math.isfinite(self.feature_noise) and 0 <= self.feature_noise <= 10):
            problems.append(f"feature_noise {self.feature_noise}: give the uniform noise's half-width, 0..10 "
                            "(EAGLE paper: 0.1; 0 = none)")
        elif self.feature_noise and self.head != "eagle":
            problems.append(f"feature_noise {self.feature_noise}: EAGLE-1/2's augmentation; an {self.head} head "
                            "trains on clean features (training-time test feeds it its own)")
        if not self.data:
            problems.append("data: give the prepared dataset folder (toolkit prepare-data --out)")
        if self.head not in ("eagle3", "eagle", "mtp"):
            problems.append(f"head {self.head!r}: accepted eagle3, eagle, mtp")
        if self.head != "eagle3" and (self.token_map or self.aux_layers):
            problems.append(f"token_map / aux_layers: an {self.head} head reads the target's final hidden state "
                            "and its full lm_head (serve it with --token-map freq_N.pt to truncate the vocabulary)")
        if self.draft_intermediate_size is not None and (self.head == "mtp" or self.draft_intermediate_size <= 0):
            problems.append(f"draft_intermediate_size {self.draft_intermediate_size}: a positive MLP width for an "
                            "eagle3 / eagle head (an MTP block is the target's own kind)")
        if self.head == "mtp" and self.num_layers != 1:
            problems.append(f"num_layers {self.num_layers}: an MTP module is one decoder block")
        if self.fc_bias and self.head != "eagle":
            problems.append(f"fc_bias: only an eagle head's fc may have a bias ({self.head}'s fc has none in "
                            "SGLang's and vLLM's layouts)")
        if (self.norm_before_residual or self.norm_before_fc) and self.head != "eagle3":
            problems.append(f"norm_before_residual / norm_before_fc: EAGLE-3 variants, not for an {self.head} head")
        if self.init_block not in ("target_last", "random"):
            problems.append(f"init_block {self.init_block!r}: accepted target_last, random")
        if self.regression_weight < 0 or self.token_weight < 0 or self.regression_weight + self.token_weight == 0:
            problems.append("regression_weight and token_weight must be >= 0, not both 0")
        if not 1 <= self.num_layers <= 8:
            problems.append(f"num_layers {self.num_layers}: give 1..8 draft decoder layers (1 is the layout "
                            "SGLang serves; more are extra plain decoder layers)")
        if self.aux_layers is not None and len(self.aux_layers) != 3:
            problems.append(f"aux_layers {self.aux_layers}: give 3 target layer ids (low, mid, high)")
        if self.init_lm_head not in ("target", "random"):
            problems.append(f"init_lm_head {self.init_lm_head!r}: accepted target, random")
        if self.scheduler not in ("cosine", "linear", "constant"):
            problems.append(f"scheduler {self.scheduler!r}: accepted cosine, linear, constant")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            problems.append(f"dtype {self.dtype!r}: accepted auto, float32, bfloat16, float16")
        if self.mixed_precision not in ("auto", "no", "bf16", "fp16"):
            problems.append(f"mixed_precision {self.mixed_precision!r}: accepted auto, no, bf16, fp16")
        for name in ("ttt_steps", "max_len", "batch_size", "grad_accum", "log_every", "save_every",
                     "keep_checkpoints", "draft_vocab_size", "eval_max_new_tokens"):
            if getattr(self, name) < 1:
                problems.append(f"{name} {getattr(self, name)}: must be at least 1")
        if self.max_steps is not None and self.max_steps < 1:
            problems.append(f"max_steps {self.max_steps}: must be at least 1")
        if self.schedule_steps is not None and self.schedule_steps < 1:
            problems.append(f"schedule_steps {self.schedule_steps}: must be at least 1")
        if self.max_minutes is not None and not self.max_minutes > 0:
            problems.append(f"max_minutes {self.max_minutes}: must be > 0 (or null: no time limit)")
        for name, ok, accepted in (("lr", self.lr > 0, "> 0"), ("epochs", self.epochs > 0, "> 0"),
                                   ("loss_decay", 0 < self.loss_decay <= 1, "in (0, 1]"),
                                   ("warmup_ratio", 0 <= self.warmup_ratio < 1, "in [0, 1)"),
                                   ("eval_samples", self.eval_samples >= 0, ">= 0"),
                                   ("eval_every", self.eval_every >= 0, ">= 0 (0: no evaluation)")):
            if not ok:  # each named with its value (one sentence for all four named none of them)
                problems.append(f"{name} {getattr(self, name)}: must be {accepted}")
        if not (math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0):
            problems.append(f"max_grad_norm {self.max_grad_norm}: must be a finite number > 0 (the gradient norm "
                            "clipped to)")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            problems.append(f"weight_decay {self.weight_decay}: must be a finite number >= 0")
        for name in ("lr", "epochs", "regression_weight", "token_weight"):
            if not math.isfinite(getattr(self, name)):
                problems.append(f"{name} {getattr(self, name)}: must be a finite number")
        if self.dist_timeout is not None and not (math.isfinite(self.dist_timeout) and self.dist_timeout > 0):
            problems.append(f"dist_timeout {self.dist_timeout}: give the minutes ranks wait, > 0")
        if self.report_to is not None:
            from accelerate.utils import LoggerType

            known = [t.value for t in LoggerType if t.value != "all"]
            if bad := [t for t in self.report_to if t not in known]:
                problems.append(f"report_to {bad}: accepted {', '.join(known)} (accelerate's trackers), or [] for "
                                "metrics.jsonl alone")
        if problem := threads_problem(self.threads, "threads"):
            problems.append(problem)
        if problem := seed_problem(self.seed, "seed"):
            problems.append(problem)
        if problems:
            raise ValueError("bad training config: " + "; ".join(problems))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)


# what a resumed run must keep: the rows it trains on and their order (data, max_len, eval_samples, eval_data,
# seed), what a step is (batch_size, grad_accum: the data is skipped by steps done x micro-batches per step), what the
# optimizer's saved state restores over the recipe (lr, weight_decay) and the head's parameters and forward
# (fc_bias, norm_before_residual, norm_before_fc) and what it reads (feature_noise). The
# length (max_steps, epochs), the schedule's shape, the clock and the logging cadence may change.
RESUME_FIXED = ("data", "max_len", "eval_samples", "eval_data", "seed", "batch_size", "grad_accum", "lr",
                "weight_decay", "fc_bias", "norm_before_residual", "norm_before_fc", "feature_noise",
                "draft_intermediate_size", "draft_config")


def check_resume(saved: dict, cfg: TrainConfig) -> None:
    """saved: the run's train_config.json. Refuses a resume that changes a RESUME_FIXED key, naming each."""
    now = dataclasses.asdict(cfg)
    saved = {"eval_data": None, "draft_config": None, **saved}  # runs from before these keys had neither
    if saved.get("head") == "eagle" and "fc_bias" not in saved:
        saved = {**saved, "fc_bias": True}  # runs from before the key had an fc bias
    if saved.get("head") == "eagle" and "feature_noise" not in saved:
        saved = {**saved, "feature_noise": 0.0}  # runs from before the key trained on clean features
    diff = [f"{k} was {saved[k]!r}, now {now[k]!r}" for k in RESUME_FIXED if k in saved and saved[k] != now[k]]
    if diff:
        raise ValueError(f"cannot resume {cfg.output_dir}: " + "; ".join(diff) + ". A resumed run keeps its data, "
                         "batch and optimizer settings (it may change max_steps, epochs, max_minutes, the schedule "
                         "and the logging cadence); start a new output_dir or pass --overwrite.")
