"""``serve``: the gRPC planning service (needs the ``grpc`` extra)."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from ..errors import InvalidInputError, MeshplanError
from ..server_cache import DEFAULT_CACHE_ENTRIES
from ._common import UsageError, grpc_extra, pem, readable, secret


def add(sub: Any) -> None:
    """``serve``."""
    sv = sub.add_parser("serve", help="run the gRPC planning service (meshplan.v1.Planner)")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    sv.add_argument("--port", type=int, default=50051, help="0 picks a free port (default 50051)")
    sv.add_argument("--workers", type=int, metavar="N",
                    help="planning calls served at once (default: max(4, cores))")
    sv.add_argument("--queue", type=int, default=64, metavar="N",
                    help="planning calls that may wait for a worker; more get RESOURCE_EXHAUSTED "
                    "(default 64)")
    sv.add_argument("--max-response-bytes", type=int, default=4 * 1024 * 1024, metavar="N",
                    help="larger responses get RESOURCE_EXHAUSTED (default 4 MiB, gRPC's "
                    "default client limit)")
    sv.add_argument("--threads", type=int, metavar="N",
                    help="core threads per planning call (default: MESHPLAN_THREADS when set; else 1 "
                    "when --workers >= cores, which avoids oversubscription; else all cores)")
    sv.add_argument("--max-candidates", type=int, metavar="N", help="refuse larger search spaces (RESOURCE_EXHAUSTED)")
    sv.add_argument("--tls-cert", metavar="PEM", help="certificate chain; with --tls-key, serve TLS")
    sv.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")
    sv.add_argument("--token-file", metavar="F", help="require `authorization: Bearer <token in F>`")
    sv.add_argument("--grace-s", type=float, default=10.0, metavar="S", help="in-flight calls may finish for S seconds on SIGTERM/SIGINT (default 10)")
    sv.add_argument("--cache-size", type=int, default=DEFAULT_CACHE_ENTRIES, metavar="N",
                    help=f"answers kept in the response cache (default {DEFAULT_CACHE_ENTRIES:,}; "
                    "0: no cache)")
    sv.add_argument("--calibration", metavar="FILE",
                    help="calibration overrides for every GPU (TOML or JSON); SIGHUP reloads it")
    sv.add_argument("--metrics-port", type=int, metavar="PORT",
                    help="serve Prometheus metrics on http://HOST:PORT/metrics (0: a free port)")
    sv.add_argument("--metrics-host", default="127.0.0.1",
                    help="address of the metrics endpoint (default: loopback only)")
    sv.add_argument("--log-format", choices=("text", "json"), default="text",
                    help="stderr log lines, one per request: text (default) or json")
    sv.set_defaults(run=_serve)


def _serve(args: argparse.Namespace, out: TextIO) -> int:
    server = grpc_extra("serve", "server")
    ServerConfig, serve = server.ServerConfig, server.serve

    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    config = ServerConfig(
        host=args.host, port=args.port, threads=args.threads, max_candidates=args.max_candidates,
        queue=args.queue, max_response_bytes=args.max_response_bytes,
        token=secret(args.token_file, "token file"), grace_s=args.grace_s,
        tls_cert=None if args.tls_cert is None else pem(args.tls_cert, "TLS certificate"),
        tls_key=None if args.tls_key is None else pem(args.tls_key, "TLS key"),
        cache_size=args.cache_size, metrics_port=args.metrics_port, metrics_host=args.metrics_host,
        calibration=None if args.calibration is None else readable(args.calibration, "--calibration"),
    )
    if args.metrics_port is not None:
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            raise UsageError("--metrics-port needs the metrics extra (missing module "
                             "prometheus_client): pip install 'meshplan[metrics]'") from None
    if args.workers is not None:
        config.workers = args.workers
    try:
        code: int = serve(config, log_format=args.log_format)
        return code
    except ValueError as e:
        raise InvalidInputError(str(e)) from None
    except (OSError, RuntimeError) as e:
        raise MeshplanError(f"cannot serve on {args.host}:{args.port}: {e}") from None
