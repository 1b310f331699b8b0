"""The `toolkit` command. Each subcommand registers its options and calls one module's main(args)."""
from __future__ import annotations

import argparse
import os
import sys


def build_parser() -> argparse.ArgumentParser:
    from toolkit import __version__
    from toolkit.models import add_models_args, models_main
    from toolkit.tokenmap import build

    fmt = argparse.ArgumentDefaultsHelpFormatter
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

    p = sub.add_parser("build-token-map", formatter_class=fmt,
                       help="count tokens and write FR-Spec freq_N.pt + EAGLE-3 vocab_map_N.safetensors",
                       description=build.__doc__.split("\n\n")[0])
    build.add_args(p)
    p.set_defaults(func=build.main)

    from toolkit.infer import bench

    p = sub.add_parser("bench", formatter_class=fmt, help="acceptance length and speed of a draft on prompts",
                       description=bench.__doc__.split("\n\n")[0])
    bench.add_args(p)
    p.set_defaults(func=bench.main)

    from toolkit.data import prepare, regenerate

    p = sub.add_parser("prepare-data", formatter_class=fmt, help="conversations -> input_ids + assistant "
                       "loss_mask, a datasets folder for training", description=prepare.__doc__.split("\n\n")[0])
    prepare.add_args(p)
    p.set_defaults(func=prepare.main)

    p = sub.add_parser("regenerate", formatter_class=fmt, help="replace assistant turns with the target's own "
                       "answers (on-policy data)", description=regenerate.__doc__.split("\n\n")[0])
    regenerate.add_args(p)
    p.set_defaults(func=regenerate.main)

    from toolkit.train import eagle3, hidden_states

    p = sub.add_parser("train", formatter_class=fmt, help="train an EAGLE-3 head (same as toolkit/train/eagle3.py)",
                       description=eagle3.__doc__.split("\n\n")[0])
    eagle3.add_args(p)
    p.set_defaults(func=eagle3.main)

    p = sub.add_parser("dump-hidden-states", formatter_class=fmt, help="write the target's hidden states for "
                       "offline training", description=hidden_states.__doc__.split("\n\n")[0])
    hidden_states.add_args(p)
    p.set_defaults(func=hidden_states.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        if os.environ.get("TOOLKIT_DEBUG"):
            raise
        print(f"toolkit {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"toolkit {args.command}: interrupted; nothing half-written was left behind", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
