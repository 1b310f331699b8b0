"""What `toolkit serve` and `toolkit run-batch` share: the options that shape the engine and how requests are read
(draft, tree, batch, cache, templates, parsers, sampling defaults), their checks, and the stack they build: the
target and draft loaded, the engine, its batching thread and the API app's settings (`Served`)."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import torch

from toolkit.cpu_speed import threads_problem
from toolkit.embedded import DEFAULT_MODEL
from toolkit import hub
from toolkit.infer import loading, lookup
from toolkit.serve import launch_flags, vllm_config
from toolkit.serve.reasoning import PARSERS
from toolkit.serve.tool_calls import ALIASES as TOOL_ALIASES
from toolkit.serve.tool_calls import PARSERS as TOOL_PARSERS


def context_length(text: str) -> int:
    """--max-seq-len as vLLM's --max-model-len reads it too: 4096, 32k (x1000), 32K (x1024), and auto / -1 for the
    model's own length (a number past any model's, capped by it)."""
    if text.strip().lower() in ("auto", "-1"):
        return 1 << 40
    units = {"k": 1000, "m": 1000 ** 2, "K": 1024, "M": 1024 ** 2}
    try:
        return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of tokens (4096, 32k, 32K), 0 to size the cache "
                                         "from free memory, or auto / -1 for the model's length") from None


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft", "--speculative-draft-model-path", "--speculative-draft-model", default=None,
                   help="EAGLE-3, EAGLE-1/2 or MTP draft folder or hub id, or a target that ships MTP layers (without "
                        "it: plain decoding)")
    p.add_argument("--model", "--model-path", default=None,
                   help=f"target (default: the one the draft records, else {DEFAULT_MODEL})")
    p.add_argument("--token-map", "--speculative-token-map", default=None,
                   help="FR-Spec freq_N.pt for an EAGLE-1/2 or MTP head (a file, or org/name/freq_N.pt on the hub)")
    p.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="the name requests send as `model` (default: --model, else the draft's recorded target); "
                        "several: each is accepted, the first is the one replies name (as vLLM's flag)")
    p.add_argument("--num-steps", "--speculative-num-steps", type=int, default=None,
                   help="draft depth per round (default 5)")
    p.add_argument("--topk", "--speculative-eagle-topk", type=int, default=None,
                   help="candidates per node (default 1 = chain)")
    p.add_argument("--num-draft-tokens", "--speculative-num-draft-tokens", type=int, default=None,
                   help="tokens verified per round, root included (default: num_steps + 1)")
    p.add_argument("--no-speculation", action="store_true", help="serve the target alone (plain decoding)")
    p.add_argument("--speculative-disable-by-batch-size", type=int, default=None, metavar="N",
                   help="decode without drafting while N or more sequences run (N >= 2, as vLLM's option): under "
                        "load a large verify batch can cost more than speculation saves")
    p.add_argument("--default-chat-template-kwargs", default=None, metavar="JSON",
                   help='template variables for every chat request, e.g. \'{"enable_thinking": false}\' (Qwen3); a '
                        "request's chat_template_kwargs override them key by key (as vLLM's flag)")
    p.add_argument("--reasoning-parser", default=None, metavar="|".join(PARSERS),
                   help="split a chat reply's thinking (<think> ... </think>) into message.reasoning_content, as "
                        "vLLM's flag: qwen3 (thinking when the reply opens with <think>) or deepseek_r1 (thinking "
                        "until </think>: R1, QwQ, Qwen3-Thinking-2507), or gpt_oss (harmony's analysis channel; "
                        "also read as SGLang's gpt-oss and vLLM's openai_gptoss)")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="serve tool_choice auto (and tools sent without tool_choice): the model decides to call, its "
                        "reply is read for calls with --tool-call-parser (vLLM's flags)")
    p.add_argument("--tool-call-parser", default=None, metavar="|".join(TOOL_PARSERS),
                   help="how the model writes tool calls: hermes (<tool_call> blocks: Hermes, Qwen2.5, Qwen3), "
                        "llama3_json (Llama 3.1/3.2 JSON calls), pythonic (Llama 3.2/4: [f(x=1)]) or mistral "
                        "([TOOL_CALLS]), openai (gpt-oss's harmony calls, with --reasoning-parser gpt_oss); "
                        "SGLang's names qwen25, qwen, llama3, gpt-oss are taken too")
    p.add_argument("--chat-template", default=None, metavar="NAME|FILE",
                   help="the chat template over the target's: a .jinja file or a built-in one (llama3, qwen2, chatml, "
                        "chatml-tools: ChatML with tools in the layout --tool-call-parser hermes reads)")
    p.add_argument("--generation-config", default="auto", metavar="auto|vllm|FOLDER",
                   help="sampling values a request that leaves them out gets: auto (default, as vLLM) = the target's "
                        "generation_config.json (temperature, top_p, top_k, min_p, repetition_penalty, "
                        "max_new_tokens), vllm = neutral (T 1, top_p 1), or a folder's generation_config.json")
    p.add_argument("--max-batch-size", "--max-num-seqs", "--max-running-requests", type=int, default=16,
                   help="sequences in the running batch")
    p.add_argument("--max-seq-len", "--max-model-len", "--context-length", type=context_length, default=4096,
                   help="prompt + generation per sequence (capped by the model); 0 = size the KV cache from free "
                        "memory")
    p.add_argument("--prefix-cache-rows", type=int, default=4, metavar="N",
                   help="cache rows beside the batch's that keep finished requests' KV, so a prompt that starts "
                   "alike (a later chat turn, a shared system prompt) prefills only the rest (default 4; 0 = off)")
    p.add_argument("--no-enable-prefix-caching", "--disable-radix-cache", dest="prefix_cache_rows",
                   action="store_const", const=0,
                   help="vLLM's and SGLang's switch: no prefix cache (--prefix-cache-rows 0)")
    p.add_argument("--log-every", type=int, default=50, help="log running tau and tok/s every N steps (0 = off)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    loading.add_args(p)
    lookup.add_args(p, "; with --no-speculation, prompt lookup alone")
    launch_flags.add_args(p)
    p.add_argument("--sample-draft", action="store_true", help="chains (--topk 1), requests with temperature > 0: "
                   "draw the draft tokens from the head's tempered distribution and verify with speculative sampling "
                   "instead of proposing its top-1")


def check(args: argparse.Namespace, command: str):
    """Refuse bad values before minutes of loading; returns the draft tree and the prompt-lookup branch (or None).
    Sets args.template_kwargs (the parsed --default-chat-template-kwargs) and resolves a tool parser's alias."""
    from toolkit.infer.tree import TreeConfig

    launch_flags.apply(args)  # SGLang's / vLLM's launch flags, as ours
    if args.max_batch_size < 1:
        raise ValueError(f"--max-batch-size must be >= 1, got {args.max_batch_size}")
    if args.prefix_cache_rows < 0:
        raise ValueError(f"--prefix-cache-rows must be >= 0 (0 = no prefix cache), got {args.prefix_cache_rows}")
    if args.max_seq_len < 0:
        raise ValueError(f"--max-seq-len must be >= 0 (0 = size the cache from free memory), got {args.max_seq_len}")
    args.reasoning_parser = {"gpt-oss": "gpt_oss", "openai_gptoss": "gpt_oss"}.get(args.reasoning_parser,
                                                                                 args.reasoning_parser)
    if args.reasoning_parser not in (None, *PARSERS):
        raise ValueError(f"--reasoning-parser {args.reasoning_parser}: accepted {', '.join(PARSERS)}")
    args.tool_call_parser = TOOL_ALIASES.get(args.tool_call_parser, args.tool_call_parser)
    if args.tool_call_parser not in (None, *TOOL_PARSERS):
        raise ValueError(f"--tool-call-parser {args.tool_call_parser}: accepted {', '.join(TOOL_PARSERS)} (or SGLang's "
                         f"{', '.join(TOOL_ALIASES)})")
    if args.tool_call_parser == "openai" and args.reasoning_parser != "gpt_oss":
        raise ValueError("--tool-call-parser openai reads gpt-oss's harmony replies, whose channels --reasoning-parser "
                         "gpt_oss splits: give both")
    if args.enable_auto_tool_choice and args.tool_call_parser is None:  # as vLLM refuses it
        raise ValueError(f"--enable-auto-tool-choice needs --tool-call-parser ({'|'.join(TOOL_PARSERS)}): how the "
                         "model writes its calls")
    if args.tool_call_parser and not args.enable_auto_tool_choice:
        print(f"toolkit {command}: --tool-call-parser {args.tool_call_parser} reads tool_choice auto replies, which "
              "only --enable-auto-tool-choice serves; required and named tool choices need neither", file=sys.stderr)
    from toolkit.data.tokenizer import check_template_name

    check_template_name(args.chat_template)  # a bad one fails here, before loading
    if problem := threads_problem(args.threads):
        raise ValueError(problem)
    if (n := args.speculative_disable_by_batch_size) is not None and n < 2:  # as vLLM refuses it ("... is > 1")
        raise ValueError(f"--speculative-disable-by-batch-size {n} (or --speculative-config's disable_by_batch_size): "
                         "give a number of running sequences >= 2, from which on steps decode without drafting, or "
                         "leave it out (--no-speculation never drafts)")
    if args.log_every < 0:
        raise ValueError(f"--log-every {args.log_every}: give a number of steps >= 1, or 0 for no log")
    if args.draft is None and not args.no_speculation:
        raise ValueError("give --draft CKPT, or --no-speculation to run the target alone")
    if args.no_speculation:  # flags that shape drafting would be taken and silently do nothing
        drafting = [flag for flag, given in (("--num-steps", args.num_steps is not None),
                                             ("--topk", args.topk is not None),
                                             ("--num-draft-tokens", args.num_draft_tokens is not None),
                                             ("--token-map", args.token_map is not None),
                                             ("--sample-draft", args.sample_draft)) if given]
        if drafting:
            raise ValueError(f"{', '.join(drafting)} shape{'s' if len(drafting) == 1 else ''} the draft's rounds, "
                             "and --no-speculation runs without a draft: drop one or the other (prompt lookup "
                             "alone takes --lookup)")
    branch = lookup.from_args(args)  # bad flags fail here
    from toolkit.data.tokenizer import template_kwargs

    args.template_kwargs = template_kwargs(args.default_chat_template_kwargs, "--default-chat-template-kwargs")
    if args.generation_config != "auto":  # a bad folder fails here, before loading
        from toolkit.serve.defaults import sampling_defaults

        sampling_defaults(args.generation_config, None)
    # SGLang picks a line's tree from the target when it gives no step count: that waits for the target's config
    auto = launch_flags.sglang_picks_tree(args)
    later = auto or args.chain_from_draft is not None  # vLLM's chain from the draft's config.json: that too
    tree = None if later else launch_flags.tree_config(args, TreeConfig)
    # a hub id: fetched (or found in the HF cache) now, before loading
    args.draft = hub.draft_folder(args.draft, revision=args.draft_revision)
    args.token_map = hub.file(args.token_map, "--token-map")
    if vllm_config.steps_from_draft(args):
        tree = launch_flags.tree_config(args, TreeConfig)
    if args.draft_kinds is not None and not args.no_speculation:  # the algorithm / method named a kind of draft
        from toolkit.infer.draft_folder import draft_kind

        launch_flags.check_kind(args, draft_kind(args.draft))
    if auto:
        from toolkit.infer.draft_folder import draft_target

        launch_flags.sglang_tree(args, draft_target(args.draft, args.model))
        tree = launch_flags.tree_config(args, TreeConfig)
    return tree, branch


@dataclass
class Stack:
    served: object    # app.Served: what build_app serves
    engine: object    # infer.engine.Engine
    metrics: object   # metrics.ServerMetrics
    description: str  # the draft, tree, lookup, batch and cache in words


def build(args: argparse.Namespace, tree, branch, max_queue: int, command: str) -> Stack:
    """Load the target (and draft), probe the draft, build the engine (warmed up) and its batcher (not started)."""
    from toolkit.infer.draft_folder import draft_target, recorded_target
    from toolkit.infer.engine import Engine
    from toolkit.infer.loading import load, probe, stop_ids
    from toolkit.serve.app import Served
    from toolkit.serve.batcher import Batcher
    from toolkit.serve.defaults import sampling_defaults
    from toolkit.serve.metrics import ServerMetrics, draft_positions

    if args.threads:
        torch.set_num_threads(args.threads)
    model = args.model
    if args.draft and args.no_speculation:  # still the draft's target, without the draft
        model = str(draft_target(args.draft, args.model))
    loaded = load(None if args.no_speculation else args.draft, model, args.token_map, args.device, args.dtype,
                  args.kernels, args.fp32_lm_head, args.chat_template)
    head, tok, target = loaded.head, loaded.tok, loaded.target
    if head is not None:
        probe(head, target, tok, tok.apply_chat_template(
            [{"role": "user", "content": "Explain what a hash map is, briefly."}], tokenize=False,
            add_generation_prompt=True, **args.template_kwargs))  # the prompt as a request without its own is read
    max_len = min(args.max_seq_len, target.config.max_position_embeddings) if args.max_seq_len else None
    max_len = launch_flags.utilization_len(args, target.config, max_len, args.max_batch_size + args.prefix_cache_rows,
                                           target.embed_tokens.weight.dtype, target.embed_tokens.weight.device)
    engine = Engine(target, head, tree if head is not None else None, max_len, max_batch=args.max_batch_size,
                    cuda_graphs=False if args.eager else None, compile=args.compile,
                    sample_draft=args.sample_draft and head is not None, lookup=branch,
                    prefix_cache_rows=args.prefix_cache_rows, draft_graphs=not args.eager_draft)
    engine.warm_up()  # --compile: compile every step shape now, not in the first requests
    recorded = recorded_target(args.draft) if args.draft else {}
    names = args.served_model_name or [args.model or recorded.get("target") or DEFAULT_MODEL]
    name = names[0]
    metrics = ServerMetrics(draft_positions(engine) + 1, name)  # the most tokens one verify step emits
    batcher = Batcher(engine, metrics, max_queue, args.log_every, args.speculative_disable_by_batch_size)
    defaults = sampling_defaults(args.generation_config, loaded.folder)
    served = Served(name, tok, frozenset(stop_ids(tok, loaded.folder)), batcher, aliases=tuple(names[1:]),
                    template_kwargs=args.template_kwargs, defaults=defaults, reasoning_parser=args.reasoning_parser,
                    tool_parser=args.tool_call_parser if args.enable_auto_tool_choice else None)
    template = tok.chat_template or ""  # named templates (a dict): tool_use renders a request with tools
    if served.tool_parser and "tools" not in (template.get("tool_use", template.get("default", ""))
                                              if isinstance(template, dict) else template):
        print(f"toolkit {command}: the chat template never reads `tools`, so the model is not shown the functions a "
              "request offers; give --chat-template with a tool-use template (chatml-tools for "
              "--tool-call-parser hermes)", file=sys.stderr)
    spec = (f"draft {args.draft}" + (f" with token map {args.token_map}" if args.token_map else "")
            + f", tree {vars(tree)}") if head is not None else "no speculation"
    if branch is not None:
        spec = ("" if head is None else spec + ", ") + f"prompt lookup {vars(branch)}"
    where = f"batch {engine.max_batch}, context {engine.max_len}, prefix cache rows {args.prefix_cache_rows}"
    print(f"toolkit {command}: a request that names no sampling values gets {defaults.describe()}", file=sys.stderr)
    return Stack(served, engine, metrics, f"{name} ({spec}; {where})")
