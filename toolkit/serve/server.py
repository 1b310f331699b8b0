"""`toolkit serve`: an OpenAI-compatible speculative server with continuous batching, streaming and
acceptance metrics.

    toolkit serve --draft ./ckpt [--model M] [--port 8000] [--num-steps 5 --topk 1] [--max-batch-size 16]

The target is the one the draft records unless --model names it (a different one is refused). Binds
127.0.0.1 unless --host says otherwise; --port 0 takes a free port (the line "serving ... on URL" names it).
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import socket
import sys

from toolkit.serve import engine_args


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                   help="the target, as `vllm serve MODEL` names it (the same as --model)")
    engine_args.add_args(p)  # what shapes the engine and reads requests, shared with `toolkit run-batch`
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0 exposes the server)")
    p.add_argument("--port", type=int, default=8000, help="0 = any free port")
    p.add_argument("--api-key", nargs="+", default=None, metavar="KEY",
                   help="require `Authorization: Bearer KEY` (any of the keys) on every path but /health, /ping, "
                        "/version and /metrics, as vLLM's flag (default: $TOOLKIT_API_KEY when set, else none)")
    p.add_argument("--allowed-origins", nargs="+", default=None, metavar="ORIGIN",
                   help="web origins browsers may call the API from (CORS), e.g. http://localhost:3000, or * for any "
                        "(default: none, no CORS headers)")
    p.add_argument("--ssl-keyfile", default=None, help="serve HTTPS with this private key (with --ssl-certfile)")
    p.add_argument("--ssl-certfile", default=None, help="serve HTTPS with this certificate chain (with --ssl-keyfile)")
    p.add_argument("--max-queue", type=int, default=256, help="requests waiting for a slot; beyond: HTTP 429")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20, help="larger request bodies get HTTP 413")
    p.add_argument("--shutdown-timeout", type=float, default=5.0, metavar="SECONDS",
                   help="on SIGTERM / Ctrl-C, refuse new requests (503) and give those in flight this long to "
                        "finish; any still running then end with a 503 error (streams: an error event), as vLLM's "
                        "flag (0 = end them at once)")


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if isinstance(e, socket.gaierror):  # the host, not the port
            raise ValueError(f"cannot bind {host}:{port}: --host {host}: {e.strerror}; give an address or a name "
                             "this machine resolves (127.0.0.1, 0.0.0.0, ::1)") from None
        raise ValueError(f"cannot bind {host}:{port}: {e.strerror}; pick another --port (0 = any free one)") from None
    return sock


def base_url(sock: socket.socket, tls: bool = False) -> str:
    """The URL clients use for the bound socket: an IPv6 address goes in brackets (http://[::1]:8000/v1)."""
    host, port = sock.getsockname()[:2]
    return f"http{'s' if tls else ''}://{f'[{host}]' if ':' in host else host}:{port}/v1"


def main(args: argparse.Namespace) -> int:
    for name in ("max_queue", "max_body_bytes"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 0 <= args.shutdown_timeout < float("inf"):
        raise ValueError(f"--shutdown-timeout must be a number of seconds >= 0, got {args.shutdown_timeout}")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535 (0 = any free one), got {args.port}")
    args.api_key = args.api_key or ([os.environ["TOOLKIT_API_KEY"]] if os.environ.get("TOOLKIT_API_KEY") else None)
    if args.api_key and not all(k.strip() for k in args.api_key):
        raise ValueError("--api-key: a key is empty; give non-empty keys (or none to serve without one)")
    for origin in args.allowed_origins or []:  # a browser sends scheme://host[:port], never a path or a space
        if origin != "*" and not re.fullmatch(r"[a-z][a-z0-9+.-]*://[^/\s]+", origin):
            raise ValueError(f"--allowed-origins {origin!r}: give origins as a browser sends them, "
                             "scheme://host[:port] (e.g. http://localhost:3000), or * for any")
    if (args.ssl_keyfile is None) != (args.ssl_certfile is None):
        raise ValueError("--ssl-keyfile and --ssl-certfile go together: give both to serve HTTPS, or neither")
    for flag, path in (("--ssl-keyfile", args.ssl_keyfile), ("--ssl-certfile", args.ssl_certfile)):
        if path is not None and not os.path.isfile(path):
            raise ValueError(f"{flag} {path}: no such file")
    if args.ssl_certfile is not None:  # read as uvicorn will, before minutes of loading
        import ssl

        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
        except (ssl.SSLError, ValueError) as err:
            raise ValueError(f"--ssl-certfile {args.ssl_certfile} / --ssl-keyfile {args.ssl_keyfile}: not a PEM "
                             f"certificate chain and its private key ({err})") from None
    tree, branch = engine_args.check(args, "serve")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    sock = bind(args.host, args.port)  # fail fast, before minutes of loading
    try:
        return serve(args, tree, branch, sock)
    finally:
        sock.close()


def serve(args: argparse.Namespace, tree, branch, sock: socket.socket) -> int:
    import uvicorn

    from toolkit.serve.app import build_app
    from toolkit.serve.auth import guarded
    from toolkit.serve.gate import Gate

    stack = engine_args.build(args, tree, branch, args.max_queue, "serve")
    batcher = stack.served.batcher
    app = Gate(guarded(build_app(stack.served), args.api_key, args.allowed_origins), args.max_body_bytes,
               stack.metrics)
    tls = args.ssl_certfile is not None
    print(f"toolkit serve: serving {stack.description} on {base_url(sock, tls)}", flush=True)  # the URL ends it
    batcher.start()

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal: both end here as a clean stop
    signal.signal(signal.SIGTERM, interrupt)
    try:
        # uvicorn waits for the connections a little past --shutdown-timeout: the 503s of the requests still running
        # then must reach their clients (a step in flight ends first), or uvicorn cancels them without a word
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=args.shutdown_timeout + 30,
                                ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile)
        draining(uvicorn.Server, batcher, args.shutdown_timeout)(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        batcher.stop()
    print("toolkit serve: stopped", file=sys.stderr)
    return 0


def draining(server_class, batcher, timeout: float):
    """uvicorn's Server, whose shutdown first tells the batcher: new requests are refused (503), and those still in
    flight `timeout` s later end with a 503 that says why (vLLM's --shutdown-timeout), so no client is cut off
    without an answer (uvicorn's own timeout cancelled them: a plain-text 500, or a stream cut mid-event)."""
    import asyncio

    class Draining(server_class):
        async def shutdown(self, sockets=None):
            batcher.drain()
            asyncio.get_running_loop().call_later(
                timeout, batcher.abort_all, f"the server is shutting down: the request was still running "
                                            f"--shutdown-timeout {timeout:g} s after the signal")
            await super().shutdown(sockets)

    return Draining

