"""`realm-hf serve`: a Gradio page and API that answer questions with a REALM model, with provenance."""

from __future__ import annotations

import ipaddress
import sys

from .common import EXIT_OK, CLIError, State, check_dtype_option, check_int8_device, info, load_openqa


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: not known to stay on this machine
        return False


def run(args) -> int:
    from ..serving import build_app, require_gradio  # deferred: it imports the pipeline (torch)
    from ..serving.service import check_top_k

    # Bad options and a missing Gradio fail before the model loads.
    if not 0 <= args.port <= 65535:
        raise CLIError(f"--port must be from 0 to 65535, got {args.port}.")
    if args.concurrency < 1:
        raise CLIError(f"--concurrency must be at least 1, got {args.concurrency}.")
    if args.num_blocks is not None and args.num_blocks < 1:
        raise CLIError(f"--num-blocks must be at least 1, got {args.num_blocks}.")
    try:
        check_top_k(args.top_k)
    except ValueError as err:
        raise CLIError(f"--top-k: {err}") from None
    if args.max_request_size < 1:
        raise CLIError(f"--max-request-size must be a positive number of bytes, got {args.max_request_size}.")
    if args.write_token is not None and not args.write_token.strip():
        raise CLIError("--write-token is empty: give a token, or leave it out to refuse every write.")
    dtype = check_dtype_option(args.dtype)
    require_gradio()
    model = load_openqa(args.model, args.allow_pickle, args.device)
    check_int8_device(dtype, model)
    app = build_app(
        model,
        write_token=args.write_token,
        top_k=args.top_k,
        num_blocks=args.num_blocks,
        no_answer_threshold=args.no_answer_threshold,
        title=args.title,
        concurrency=args.concurrency,
        allowed_hosts=args.allowed_host or (),
        max_request_size=args.max_request_size,
        dtype=dtype,
    )
    writes = "allowed with the write token" if app.realm_service.writes_enabled else "refused (no write token)"
    if not _is_loopback(args.host):
        from ..serving.app import served_hosts

        # Printed even with --quiet: the server is open to other machines.
        print(
            f"warning: serving on {args.host}, reachable from other machines; document writes are {writes}. Requests "
            f"are answered for the host names {', '.join(served_hosts(args.host, args.allowed_host or ()))} "
            "(add others with --allowed-host).",
            file=sys.stderr,
        )
    info(f"Serving {args.model} at http://{args.host}:{args.port} (Ctrl+C stops); document writes are {writes}.")
    threshold = app.realm_service.no_answer_threshold
    if threshold:
        info(f"Answers whose probability is under {threshold:g} show as 'no answer' (--no-answer-threshold 0: never).")
    app.launch(server_name=args.host, server_port=args.port, quiet=State.quiet, share=False)
    return EXIT_OK
