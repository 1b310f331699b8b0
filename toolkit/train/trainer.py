"""Train the draft head a recipe names (EAGLE-3, EAGLE-1/2 or MTP) on a frozen target, unrolled for `ttt_steps`
training-time-test steps; the same run as `accelerate launch toolkit/train/{eagle3,eagle,mtp}.py --config ...`,
which distributes it. Any recipe key below can be overridden as key=value.

What differs per head (its build, features, loss and export) is in objectives.py; the entry scripts eagle3.py,
eagle.py and mtp.py pick one.

Online mode runs the target in-process per batch; offline mode (`hidden_states=DIR`) reads the shards of
`toolkit dump-hidden-states`. accelerate owns distribution (single process, CPU ranks over gloo, GPUs,
DeepSpeed ZeRO-2/3 via `accelerate launch --config_file recipes/accelerate/<x>.yaml`).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Iterator

import torch

from toolkit.infer.gemma import soft_cap
from toolkit.train.launch import add_args, make_accelerator  # toolkit train reads this module's add_args and main

__all__ = ["add_args", "main"]


def main(args: argparse.Namespace, head_kind: str | None = None) -> int:
    """Train the head the recipe names (`head:`); an entry script passes its own kind, and a recipe for
    another kind is refused."""
    from tqdm import tqdm
    from transformers import get_scheduler

    from toolkit.infer.loading import load_target
    from toolkit.json_files import read_json
    from toolkit.models import fingerprint, resolve_target
    from toolkit.tokenmap.maps import save_vocab_map
    from toolkit.train import checkpoint as ckpt
    from toolkit.train.config import check_resume
    from toolkit.train.recipe import load_config
    from toolkit.train.evaluate import HeldOutEval
    from toolkit.train.data import (HiddenStateShards, PreparedData, collate, held_out, micro_batches,
                                     prefetch)
    from toolkit.train.head import (check_signature, head_signature, keep_variant, pick_vocabulary, serving_notes,
                                     start_from, take_weights, target_tensors)
    from toolkit.train.health import Health
    from toolkit.train.losses import step_counts
    from toolkit.train.objectives import OBJECTIVES, DraftTrainable
    from toolkit.train.precision import target_dtype
    from toolkit.train.ranks import on_main
    from toolkit.train.tracking import Tracker, Window

    cfg = load_config(args.config, args.overrides, model=args.model, data=args.data, output_dir=args.output_dir,
                      max_steps=args.max_steps, token_map=args.token_map, hidden_states=args.hidden_states,
                      default_head=head_kind)
    objective = OBJECTIVES[cfg.head]
    if head_kind and cfg.head != head_kind:
        raise ValueError(f"the recipe trains an {cfg.head} head: launch {objective.script} (or toolkit train)")
    if args.resume and args.overwrite:  # refused before minutes of loading
        raise ValueError("--resume continues the run in output_dir and --overwrite deletes it: give one of them")
    from toolkit.atomic import check_out_path

    check_out_path("output_dir", cfg.output_dir, folder=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    acc = make_accelerator(cfg)
    acc.print(f"accelerate: {acc.distributed_type.value}, {acc.num_processes} process(es) on {acc.device}, "
              f"mixed precision {acc.mixed_precision}")
    out = Path(cfg.output_dir)
    ckpt.open_output_dir(out, args.resume, args.overwrite)  # a previous run is resumed, replaced or refused

    # --- target, data and draft vocabulary -------------------------------------------------------------
    folder = resolve_target(cfg.model)
    target_hf = read_json(folder / "config.json")
    target_fp = fingerprint(folder)
    device = acc.device
    dtype = target_dtype(cfg.dtype, device, acc.mixed_precision)  # the GPU's half precision; fp32 or bf16 on a CPU
    # held-out evaluation in the dtype `toolkit bench` serves in by default: the GPU's half precision, fp32 on CPU
    eval_dtype = dtype if device.type == "cuda" else torch.float32
    data = PreparedData(cfg.data, cfg.max_len)
    train_rows, held = held_out(cfg, data)  # rows of eval_data, or data's last rows (never trained on)
    offline = cfg.hidden_states is not None
    shards = HiddenStateShards(cfg.hidden_states, cfg.max_len) if offline else None
    if offline:
        shards.check_fits(cfg.hidden_states, data, cfg.data, train_rows, folder)
    acc.print(f"data: {len(train_rows)} training rows of {cfg.data}, {len(held)} "
              + (f"of {cfg.eval_data} for evaluation; " if cfg.eval_data else "held out for evaluation; ")
              + (f"offline, the target's states read from {cfg.hidden_states}" if offline
                 else f"online, the target {cfg.model} run per batch in {str(dtype).removeprefix('torch.')}"))
    from toolkit.infer.config import ModelConfig

    tcfg = ModelConfig.from_folder(folder)
    data.check_ids(tcfg.vocab_size, cfg.model)  # data prepared with another tokenizer, before minutes of loading
    target = load_target(folder, dtype, device).requires_grad_(False) if not offline else None
    parts = target_tensors(folder, ["embed_tokens.weight", "lm_head.weight"])
    # the target runs without a KV cache here: a row beyond its rope's exact length would give wrong features
    # (refused by the forward too, but only when such a batch comes up); a sliding window is attended within
    tcfg.check_sequence(max(data.lengths))
    start = start_from(cfg.head, cfg.init_from, tcfg, parts) if cfg.init_from else None
    if start is not None and cfg.head == "eagle3" and cfg.aux_layers not in (None, start.aux_layers):
        raise ValueError(f"aux_layers {cfg.aux_layers}: init_from {cfg.init_from} fuses layers {start.aux_layers}")
    aux_layers = cfg.aux_layers or (start.aux_layers if start is not None and cfg.head == "eagle3" else None) or (
        shards.index["aux_layer_ids"] if offline else tcfg.default_aux_layers())
    if offline and cfg.head == "eagle3" and aux_layers != shards.index["aux_layer_ids"]:
        raise ValueError(f"aux_layers {aux_layers} differ from the shards' {shards.index['aux_layer_ids']}")
    for note in serving_notes(cfg, aux_layers, tcfg.num_layers):  # what SGLang / vLLM would serve differently
        acc.print(f"WARNING: {note}")
    # counted over every training row once, by the main process, and sent to the others (toolkit/train/ranks.py)
    vocab_ids, d2t, t2d = on_main(lambda: pick_vocabulary(cfg, tcfg, folder, data, train_rows, start))

    # --- the head, optimizer, schedule; resume ---------------------------------------------------------
    head = objective.build(cfg, tcfg, vocab_ids, aux_layers, parts, folder)
    # a CPU copy that exports and evaluations load the gathered weights into
    template = objective.build(cfg, tcfg, vocab_ids, aux_layers, parts, folder)
    if cfg.head == "eagle3":  # a forward variant (the recipe's, or kept from init_from) is exported with the head
        if start is not None:
            keep_variant(cfg, [head, template], start)
        for note in head.variant_notes():
            acc.print(f"WARNING: {note}")
    if start is not None:  # a resumed run then loads its own checkpoint over these
        take_weights(head, start, cfg.init_from)
        acc.print(f"starting from the draft in {cfg.init_from}")
    signature = head_signature(cfg.head, head, target_fp)
    if args.resume:
        check_signature(out / "run.json", signature, folder)
        if (out / "train_config.json").is_file():
            check_resume(read_json(out / "train_config.json"), cfg)
    model = DraftTrainable(head, parts["embed_tokens.weight"], cfg.ttt_steps)
    rows_per_step = cfg.batch_size * cfg.grad_accum * acc.num_processes
    total = cfg.max_steps or max(1, int(cfg.epochs * len(train_rows) / rows_per_step))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=cfg.weight_decay)
    # the schedule counts optimizer steps; accelerate steps it once per process per step, hence the scaling
    span = cfg.schedule_steps or total  # a run may stop inside a longer schedule (and resume into it)
    if span < total:  # past its end a cosine climbs back up (transformers' does not clamp), a linear one sits at 0
        raise ValueError(f"schedule_steps {span} is shorter than the run's {total} steps: give at least {total}, "
                         "or stop the run there (max_steps)")
    sched = get_scheduler(cfg.scheduler, opt, int(cfg.warmup_ratio * span) * acc.num_processes,
                          span * acc.num_processes)
    model, opt, sched = acc.prepare(model, opt, sched)
    progress = ckpt.Progress(rows_per_step, ckpt.launch_of(acc))
    acc.register_for_checkpointing(progress)
    if args.resume and (last := ckpt.latest(out)) is not None:
        ckpt.check_launch(last, rows_per_step, progress.launch)  # processes, ZeRO stage, DeepSpeed precision
        ckpt.load(acc, last)
        acc.print(f"resumed from {last} at step {progress.step}")
    ckpt.replace_output_dir(acc, out, args.overwrite)  # every input checked: the old run may go now
    if acc.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
    tracker = Tracker(acc, out, cfg)  # a tracker that cannot start (wandb without a key) stops the run here
    if acc.is_main_process:
        from toolkit.atomic import write_text

        write_text(out / "run.json", json.dumps(signature, indent=2) + "\n")
        write_text(out / "train_config.json", cfg.to_json() + "\n")
        if cfg.head == "eagle3":
            save_vocab_map(out / f"vocab_map_{len(vocab_ids)}.safetensors", d2t, t2d,
                           {"source": cfg.data, "method": "init_from" if cfg.init_from else "given" if cfg.token_map
                            else "assistant-token frequency"})
    t2d = t2d.to(device)
    lm_w = parts["lm_head.weight"].to(device, dtype) if offline else None
    final_cap = None if tcfg.gemma is None else tcfg.gemma.final_softcap  # offline logits capped as the target's
    export_args = (objective.save, target_hf, cfg.model, target_fp, {"ttt_steps": cfg.ttt_steps,
                                                                      "train_data": cfg.data})
    from toolkit.data.tokenizer import load_tokenizer
    from toolkit.infer.loading import stop_ids as end_of_turn

    stop_ids = end_of_turn(load_tokenizer(model=str(folder)), folder)  # as toolkit bench and serve stop

    run_eval = HeldOutEval(acc, template, held, cfg, folder, stop_ids, eval_dtype,
                           target if dtype == eval_dtype else None)  # the training target serves when it can
    # --- the loop ---------------------------------------------------------------------------------------
    # Data order depends only on (seed, epoch): skipping the micro-batches already consumed resumes exactly.
    batches = micro_batches(data.lengths, train_rows, cfg.batch_size, cfg.seed, acc.process_index,
                            acc.num_processes, skip=progress.step * cfg.grad_accum)
    source = shards if offline else data

    def step_batches_of(micro) -> Iterator[tuple[int, list[dict]]]:  # (epoch, the grad_accum micro-batches of a step)
        while True:
            step = [next(micro) for _ in range(cfg.grad_accum)]
            yield step[-1][0], [collate([source[r] for r in rows]) for _, rows in step]

    steps = prefetch(step_batches_of(batches))  # the next step's rows are read while this one computes
    window = Window()
    scaled = acc.scaler is not None or (acc.mixed_precision == "fp16" and acc.state.deepspeed_plugin is not None)
    health = Health(scaled)  # fp16's loss scaler: native AMP's, or DeepSpeed's own
    uncounted = 0  # this rank's tokens since progress.tokens was last brought up to date (at a log or a save)
    bar = tqdm(total=total, initial=progress.step, disable=not acc.is_main_process, unit="step", desc="train")
    t_start, grad_norm = time.perf_counter(), None
    model.train()
    while progress.step < total:
        epoch, step_batches = next(steps)
        # Each step's loss is a mean over the assistant tokens of the whole optimizer step (every micro-batch,
        # every rank), not a mean of micro-batch means: accelerate divides a micro-batch's loss by grad_accum and
        # DDP averages the ranks, hence the denominators are the counts over their product.
        counts_step = sum(step_counts(b["loss_mask"], cfg.ttt_steps) for b in step_batches).to(device)
        norm = acc.reduce(counts_step, "sum") / (cfg.grad_accum * acc.num_processes)
        for micro, batch in enumerate(step_batches):
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.no_grad():  # the frozen target's features (3 aux layers, or the final normed state)
                if offline:
                    feats, target_logits = objective.features(batch), batch["final_hidden"].to(dtype) @ lm_w.T
                    target_logits = soft_cap(target_logits, final_cap)
                else:
                    target_logits, hs = target(batch["input_ids"], aux_layers=head.aux_layers)
                    feats = torch.cat(hs, -1)
            with acc.accumulate(model):
                key = ((cfg.seed * 1_000_003 + progress.step) * cfg.grad_accum + micro) * acc.num_processes \
                    + acc.process_index
                step_logits, step_hidden = model(objective.inputs(cfg, feats, key), batch["input_ids"],
                                                 batch["valid"])
                loss, losses, accs, counts = objective.loss(cfg, step_logits, step_hidden, feats, target_logits,
                                                            batch["loss_mask"], t2d, norm)
                acc.backward(loss)
                if acc.sync_gradients:
                    grad_norm = acc.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                opt.step()
                if acc.sync_gradients:  # fp16: the scaler's skips counted; too many in a row stop the run
                    health.after_step(opt)
                lr = sched.get_last_lr()[0]  # the rate this step trained at (sched.step moves to the next one)
                sched.step()
                opt.zero_grad()
            window.add(loss, losses, accs, counts, int(batch["valid"].sum()))
            uncounted += int(batch["valid"].sum())
        progress.step += 1
        bar.update(1)
        # A wall-clock budget ends the run early, as if this step were the last; the ranks agree (max of clocks)
        # so that every one of them takes the same collectives below.
        out_of_time = cfg.max_minutes is not None and bool(acc.reduce(torch.tensor(
            float(time.perf_counter() - t_start > cfg.max_minutes * 60), device=device), "max"))
        final = progress.step == total or out_of_time
        logging, saving = progress.step % cfg.log_every == 0 or final, progress.step % cfg.save_every == 0 or final
        if logging or saving:  # every rank takes this collective at the same steps; a checkpoint holds the count
            progress.tokens += int(acc.reduce(torch.tensor(uncounted, device=device), "sum"))
            uncounted = 0
        if logging:
            rec = window.record(acc, epoch, lr=lr, grad_norm=float(grad_norm) if grad_norm is not None else None,
                                tokens=progress.tokens, peak_memory_gb=ckpt.peak_memory_gb(device))
            health.check(rec, progress.step)  # a nan loss stops the run (fp16: the skips are logged)
            tracker.log(progress.step, rec)
            bar.set_postfix(loss=f"{rec['loss']:.3f}", tau=f"{rec['simulated_tau']:.2f}",
                            tok_s=f"{rec['tokens_per_second']:.0f}")
            window = Window()
        if saving:
            last = ckpt.save(acc, model, template, out, progress.step, cfg.keep_checkpoints, export_args)
        if (cfg.eval_every and progress.step % cfg.eval_every == 0) or final:
            run_eval(model, progress.step, tracker)
        if out_of_time:
            acc.print(f"max_minutes {cfg.max_minutes:g} reached at step {progress.step} of {total}; --resume "
                      "continues the run")
            break
    bar.close()
    if acc.is_main_process:
        ckpt.publish_draft(ckpt.latest(out), out)
        steps = f"{progress.step} step{'' if progress.step == 1 else 's'}"
        print(f"done: {steps}; draft in {out / 'draft'} (toolkit bench --draft {out / 'draft'} "
              f"--prompts ...)", file=sys.stderr)
    tracker.finish()
    acc.wait_for_everyone()
    return 0
