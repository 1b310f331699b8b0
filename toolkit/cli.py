"""The `toolkit` command. Each subcommand registers its options and calls one module's main(args)."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default, once: not again where its help already says it ("(default 5)")."""

    def _get_help_string(self, action):
        text = action.help or ""
        return text if "default" in text else super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    from toolkit import __version__
    from toolkit.models import add_models_args, models_main
    from toolkit.tokenmap import build

    fmt = HelpFormatter
    parser = argparse.ArgumentParser(
        prog="toolkit", formatter_class=fmt,
        description="Speculative-decoding draft heads: token maps, training, serving. "
                    "Run `toolkit <command> --help` for a command's options.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", required=True)

    p = sub.add_parser("models", formatter_class=fmt, help="list built-in model aliases and their cache state",
                       description="List built-in model aliases (the embedded default first) and whether "
                                   "they are converted in $TOOLKIT_CACHE.")
    add_models_args(p)
    p.set_defaults(func=models_main)

    from toolkit import quickstart
    from toolkit.data import prepare, regenerate
    from toolkit.infer import bench
    from toolkit.serve import run_batch, server
    from toolkit.train import hidden_states, trainer

    # name, module (with add_args, main and a docstring whose first paragraph describes it), one-line help
    commands = [
        ("quickstart", quickstart, "the whole pipeline on the embedded SmolLM2 in a time budget, with a report"),
        ("build-token-map", build, "count tokens and write FR-Spec freq_N.pt + EAGLE-3 vocab_map_N.safetensors"),
        ("bench", bench, "acceptance length and speed of a draft on prompts"),
        ("serve", server, "OpenAI-compatible speculative server: continuous batching, streaming, metrics"),
        ("run-batch", run_batch, "answer an OpenAI or Anthropic batch file (JSONL) with the engine, no server"),
        ("prepare-data", prepare, "conversations -> input_ids + assistant loss_mask, a datasets folder for training"),
        ("regenerate", regenerate, "replace assistant turns with the target's own answers (on-policy data)"),
        ("train", trainer, "train the draft head a recipe names: eagle3, eagle (EAGLE-1/2) or mtp"),
        ("dump-hidden-states", hidden_states, "write the target's hidden states for offline training"),
    ]
    for name, module, text in commands:
        p = sub.add_parser(name, formatter_class=fmt, help=text, description=module.__doc__.split("\n\n")[0])
        module.add_args(p)
        p.set_defaults(func=module.main)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's kill, `timeout`) unwinds like Ctrl-C, so that temp files are removed on the way."""


def _terminate(signum, frame):
    raise Terminated()


def reported(name: str, run) -> int:
    """run() with the command-line's endings: bad input an `error:` line and 2, Ctrl-C 130 and SIGTERM 143 (both
    unwound, so temp files are removed on the way), never a traceback (TOOLKIT_DEBUG=1 shows it). `name` starts each
    line (`toolkit train`, `eagle3.py`)."""
    main_thread = threading.current_thread() is threading.main_thread()  # only it may set signal handlers
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        return run() or 0
    except (ValueError, OSError, RuntimeError) as err:  # OSError: a path the system refused (full disk, permission)
        if os.environ.get("TOOLKIT_DEBUG"):
            raise
        print(f"{name}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        print(f"{name}: {'terminated' if isinstance(stop, Terminated) else 'interrupted'}; "
              "nothing half-written was left behind", file=sys.stderr)
        return 143 if isinstance(stop, Terminated) else 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    from toolkit.train.launch import parse_with_overrides

    args = parse_with_overrides(build_parser(), argv)
    return reported(f"toolkit {args.command}", lambda: args.func(args))

if __name__ == "__main__":
    sys.exit(main())
