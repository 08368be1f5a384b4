"""
The Gradio app of `realm-hf serve`: a page that answers a question with the top answers, their probability and the
source block with the answer highlighted, and the same answers through Gradio's API in the provenance schema. The same
`build_app` runs as a Hub Space's `app.py`.
"""

from __future__ import annotations

import functools
import html
import inspect
import ipaddress
import json
import os
from collections.abc import Sequence
from typing import Any

from ..constants import SERVE_ALLOWED_HOSTS_ENV
from .service import MAX_TOP_K, RealmQAService, WriteRefused

#: The names of this machine's loopback interface: always served.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
#: The largest request body the server reads (a question, a document to add, an upload), in bytes.
MAX_REQUEST_SIZE = 1 << 20
#: The header that carries the write token on an upload (the app itself takes no files).
WRITE_TOKEN_HEADER = "x-realm-write-token"
# Gradio's routes that store a client's files in its temporary folder (served back under `/file=`).
_UPLOAD_ROUTES = ("/upload", "/process_recording")

# Styles inline in the answers' HTML: the page needs no theme or stylesheet of its own (the same app runs as a Space).
_MARK_STYLE = "background:#ffe066;color:#000;padding:0 2px;border-radius:2px"
_CARD_STYLE = "border:1px solid #d0d7de;border-radius:8px;padding:10px 14px;margin:8px 0"
_SOURCE_STYLE = "color:#57606a;font-size:0.9em;margin:4px 0"
_TEXT_STYLE = "margin:6px 0 0 0;padding-left:10px;border-left:3px solid #d0d7de;white-space:pre-wrap"


def require_gradio():
    """The `gradio` module, or an `ImportError` that names the extra to install."""
    try:
        import gradio  # optional dependency: only serving needs it
    except ImportError:
        raise ImportError("Serving needs Gradio, which is not installed: pip install 'realm-hf[serve]'") from None
    return gradio


def highlighted_block_html(text: str, start: int | None, end: int | None) -> str:
    """The block text, HTML-escaped, with `text[start:end]` (the answer) inside `<mark>`."""
    text = text or ""
    if start is None or end is None or not 0 <= start < end <= len(text):
        return html.escape(text)  # no character offsets (a slow tokenizer): the text without a highlight
    return (
        html.escape(text[:start])
        + f'<mark class="realm-answer-span" style="{_MARK_STYLE}">{html.escape(text[start:end])}</mark>'
        + html.escape(text[end:])
    )


_NOTICE_STYLE = "border:1px solid #d4a72c;background:#fff8c5;color:#3b2300;border-radius:8px;padding:8px 12px"
_ERROR_STYLE = "color:#cf222e"


def _untrained_reader_notice() -> str:
    """The notice a page shows above everything when the model's reader was never trained."""
    return (
        f'<div class="realm-untrained-notice" style="{_NOTICE_STYLE}"><b>This model\'s reader was never trained</b> '
        "(<code>config.reader_trained</code> is false, as after <code>init_from_bert</code>): its answers are "
        "arbitrary spans of the retrieved blocks. Fine-tune it first (<code>realm-hf train</code>, "
        "docs/training.md).</div>"
    )


def _error_html(message: str) -> str:
    """An error shown in place of the answers (the previous question's answers are cleared with it)."""
    return f'<p class="realm-error" style="{_ERROR_STYLE}">{html.escape(message)}</p>'


def answers_html(records: list[dict[str, Any]], no_answer_threshold: float | None = None) -> str:
    """
    The answers of one question as HTML cards: rank, answer, its probability, and its source (title, doc_id, block
    id, the block's retrieval score, the block's text with the answer highlighted); for "no answer", why.
    """
    if not records or not records[0].get("answer"):
        best = records[0].get("score", 0.0) if records else 0.0
        if no_answer_threshold and best > 0.0:
            # Declined by the threshold: say how sure the reader was, not a confident-looking answer.
            return (
                '<p class="realm-no-answer">No answer: the best span\'s probability '
                f'<span class="realm-probability">p = {best:.3f}</span> is under this server\'s threshold '
                f"({no_answer_threshold:g}). The retrieved blocks may not answer this question, or the question is "
                "outside the corpus.</p>"
            )
        return '<p class="realm-no-answer">No answer found in the retrieved blocks.</p>'
    cards = []
    for record in records:
        block = record.get("block") or {}
        source = []
        if block.get("title"):
            source.append(f'<span class="realm-title"><b>{html.escape(str(block["title"]))}</b></span>')
        if block.get("doc_id") is not None:
            source.append(f'<span class="realm-doc-id">doc_id {html.escape(str(block["doc_id"]))}</span>')
        if block.get("block_id") is not None:
            source.append(f"block {int(block['block_id'])}")
        if block.get("retrieval_score") is not None:
            source.append(
                f'<span class="realm-retrieval-score">retrieval score {float(block["retrieval_score"]):.2f}</span>'
            )
        cards.append(
            f'<div class="realm-answer" style="{_CARD_STYLE}">'
            f'<div><b>{int(record["rank"])}.</b> <span class="realm-answer-text" style="font-size:1.15em">'
            f"{html.escape(record['answer'])}</span> "
            f'<span class="realm-probability">p = {record["score"]:.3f}</span></div>'
            f'<div class="realm-source" style="{_SOURCE_STYLE}">{" · ".join(source)}</div>'
            f'<div class="realm-block" style="{_TEXT_STYLE}">'
            f"{highlighted_block_html(block.get('text', ''), record.get('start'), record.get('end'))}</div>"
            "</div>"
        )
    return "\n".join(cards)


def _host_name(header: str) -> str:
    """The host of a `Host` header, lower-case, without its port (`[::1]:7860` -> `::1`)."""
    header = header.strip().lower().rstrip(".")
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return host in ("", "*")


def served_hosts(server_name: str | None, allowed_hosts: Sequence[str] = ()) -> tuple[str, ...]:
    """
    The host names a server bound to `server_name` answers to: loopback, the address it is bound to (unless every
    address, `0.0.0.0`), `allowed_hosts`, the names in `REALM_HF_SERVE_ALLOWED_HOSTS` (comma-separated) and, on a Hub
    Space, its `SPACE_HOST`. A name may start with `*.` (any subdomain); `"*"` allows any host (no check).
    """
    names = list(LOOPBACK_HOSTS)
    if server_name and not _is_wildcard(_host_name(server_name)):
        names.append(_host_name(server_name))
    names += [_host_name(n) for n in allowed_hosts]
    names += [_host_name(n) for n in os.environ.get(SERVE_ALLOWED_HOSTS_ENV, "").split(",") if n.strip()]
    if os.environ.get("SPACE_HOST"):
        names.append(_host_name(os.environ["SPACE_HOST"]))
    return tuple(dict.fromkeys(n if n != "" else "*" for n in names))


class RequestGuard:
    r"""
    ASGI middleware in front of the served app: refuses a request whose `Host` header names a host the server does
    not serve (400: a page on another site that re-points its name to this machine, DNS rebinding, cannot read the
    corpus through `/answer`), an upload without the write token in the `X-Realm-Write-Token` header (403: the page
    takes no files, and Gradio would store and serve back any client's), and a request body over `max_request_size`
    bytes (413), before the app reads it. [`build_app`]'s app adds it when launched; mounting the app in your own
    FastAPI app, add it there: `fastapi_app.add_middleware(RequestGuard, hosts=..., service=app.realm_service)`.

    Args:
        app: The ASGI app it guards.
        hosts (`Sequence[str]`): The host names served (see [`served_hosts`]).
        service ([`RealmQAService`]): Whose write token allows uploads.
        max_request_size (`int`, *optional*, defaults to 1 MiB): The largest request body read, in bytes.
    """

    def __init__(self, app, hosts: Sequence[str], service: RealmQAService, max_request_size: int = MAX_REQUEST_SIZE):
        self.app, self.service, self.max_request_size = app, service, int(max_request_size)
        self.any_host = "*" in hosts
        self.hosts = frozenset(h for h in hosts if not h.startswith("*."))
        self.suffixes = tuple(h[1:] for h in hosts if h.startswith("*."))

    def host_allowed(self, header: str | None) -> bool:
        """Whether a request with this `Host` header is served."""
        if self.any_host:
            return True
        host = _host_name(header or "")
        return bool(host) and (host in self.hosts or host.endswith(self.suffixes))

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        if not self.host_allowed(headers.get("host")):
            if scope["type"] == "websocket":
                return await send({"type": "websocket.close", "code": 1008})
            return await _respond(
                send,
                400,
                f"Host {headers.get('host')!r} is not served here. Serving another name (behind a proxy): start the "
                f"server with --allowed-host NAME or {SERVE_ALLOWED_HOSTS_ENV}=NAME.",
            )
        if scope["type"] == "websocket":
            return await self.app(scope, receive, send)
        path = scope.get("path", "").rstrip("/")
        if path.endswith(_UPLOAD_ROUTES) and not self.service.token_matches(headers.get(WRITE_TOKEN_HEADER)):
            return await _respond(send, 403, f"Uploads need the server's write token (header {WRITE_TOKEN_HEADER}).")
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_request_size):
            return await _respond(send, 413, f"The request is larger than {self.max_request_size} bytes.")
        return await self._bounded(scope, receive, send)

    async def _bounded(self, scope, receive, send):
        # A body without Content-Length (chunked) is counted as it arrives; over the limit, the app sees the client
        # leave and the client gets 413.
        read, over, started = 0, False, False

        async def counted_receive():
            nonlocal read, over
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > self.max_request_size:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def tracked_send(message):
            nonlocal started
            if over and not started:
                return  # the 413 below answers instead
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except Exception:
            if not over:
                raise
        if over and not started:
            await _respond(send, 413, f"The request is larger than {self.max_request_size} bytes.")


async def _respond(send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@functools.cache
def _guarded_blocks_class(gr):
    class RealmServedBlocks(gr.Blocks):
        """`gradio.Blocks` whose `launch` puts [`RequestGuard`] in front of the app (and Gradio's own upload limit)."""

        def launch(self, *args, **kwargs):
            bound = inspect.signature(gr.Blocks.launch).bind_partial(self, *args, **kwargs).arguments
            server_name = bound.get("server_name") or os.environ.get("GRADIO_SERVER_NAME") or "127.0.0.1"
            hosts = served_hosts(server_name, self.realm_allowed_hosts)
            app_kwargs = dict(kwargs.pop("app_kwargs", None) or {})
            from starlette.middleware import Middleware  # a dependency of gradio, which is optional here

            guard = Middleware(
                RequestGuard, hosts=hosts, service=self.realm_service, max_request_size=self.realm_max_request_size
            )
            app_kwargs["middleware"] = [*app_kwargs.get("middleware", []), guard]
            kwargs.setdefault("max_file_size", self.realm_max_request_size)
            return super().launch(*args, app_kwargs=app_kwargs, **kwargs)

    return RealmServedBlocks


def _page_answers(service: RealmQAService, question, top_k) -> tuple[str, list[dict[str, Any]]]:
    """What the page shows for a question: the answers' HTML and their records, or an error and no records."""
    # An error replaces the previous answers on the page, so that they are not read as this question's.
    try:
        records = service.answer(question, top_k)
    except ValueError as err:
        return _error_html(str(err)), []
    return answers_html(records, service.no_answer_threshold), records


def build_app(
    model,
    tokenizer=None,
    *,
    write_token: str | None = None,
    top_k: int = 3,
    num_blocks: int | None = None,
    no_answer_threshold: float | None = None,
    title: str = "REALM question answering",
    concurrency: int = 4,
    allowed_hosts: Sequence[str] = (),
    max_request_size: int = MAX_REQUEST_SIZE,
    dtype=None,
):
    r"""
    The Gradio app that serves a [`RealmForOpenQA`]: launch it (`app.launch()`), mount it, or save it as a Space's
    `app.py`.

    The page takes a question and shows the top answers, each with its probability, its block's title, `doc_id`,
    block id and retrieval score, and the block's text with the answer highlighted; "no answer", with the best span's
    probability, when that is under `no_answer_threshold`; a notice above everything when the model's reader was
    never trained; an error in place of the previous answers. The API (`gradio_client`) has three endpoints:

    - `/answer` `(question: str, top_k: int)`: the answers as `realm-hf ask --json` gives them (docs/provenance.md);
    - `/add_document` `(token, text, title, doc_id)` and `/remove_document` `(token, doc_id)`: change the corpus in
      memory; refused without the write token given here (or in `REALM_HF_SERVE_WRITE_TOKEN`).

    Args:
        model ([`RealmForOpenQA`]): The model, with its retriever attached.
        tokenizer (*optional*): Question tokenizer; defaults to the retriever's.
        write_token (`str`, *optional*): The token that allows writes; none (and no environment variable): no writes.
        top_k (`int`, *optional*, defaults to 3): Answers per question the page starts with.
        num_blocks (`int`, *optional*): Blocks retrieved and read per question (default `config.reader_beam_size`).
        no_answer_threshold (`float`, *optional*): Answer "no answer" when the best span's probability is under
            this (default `config.no_answer_threshold`, else 0.1); 0 answers every question with its best span.
        title (`str`, *optional*): The page's heading and browser tab title.
        concurrency (`int`, *optional*, defaults to 4): Questions answered at the same time (the model's answering is
            thread-safe; each answer comes from one state of the index, also while documents change).
        allowed_hosts (`Sequence[str]`, *optional*): Host names served besides loopback and the address bound (e.g.
            the public name of a proxy in front; `*.example.org` for subdomains): requests naming another host in
            their `Host` header are refused (see [`RequestGuard`], [`served_hosts`]).
        max_request_size (`int`, *optional*, defaults to 1 MiB): The largest request body the server reads, in bytes.
        dtype (`str` or `torch.dtype`, *optional*, defaults to fp32): Compute dtype of every answer (`"bf16"`,
            `"auto"`, `"int8"` on a CPU; see `RealmForOpenQA.answer`).

    Returns:
        `gradio.Blocks`; its `launch` puts [`RequestGuard`] in front of the app.
    """
    gr = require_gradio()
    if isinstance(max_request_size, bool) or not isinstance(max_request_size, int) or max_request_size < 1:
        raise ValueError(f"max_request_size must be a positive number of bytes, got {max_request_size!r}.")
    if isinstance(allowed_hosts, str):
        allowed_hosts = [allowed_hosts]
    service = RealmQAService(
        model,
        tokenizer,
        write_token=write_token,
        top_k=top_k,
        num_blocks=num_blocks,
        dtype=dtype,
        no_answer_threshold=no_answer_threshold,
    )

    def user_error(err: Exception):
        # The caller's input, not a server fault: the message goes back to the client, no traceback on the console.
        return gr.Error(str(err), print_exception=False)

    def answer(question: str, top_k: int = service.top_k) -> list[dict]:
        """The best answers to `question`, best first, in realm-hf's provenance schema (as `realm-hf ask --json`)."""
        try:
            return service.answer(question, top_k)
        except ValueError as err:
            raise user_error(err) from None

    def add_document(token: str, text: str, title: str = "", doc_id: str = "") -> dict:
        """Add one document to the corpus (needs the server's write token). Returns its doc_id and new block ids."""
        try:
            return service.add_document(token, text, title, doc_id)
        except (WriteRefused, ValueError) as err:
            raise user_error(err) from None

    def remove_document(token: str, doc_id: str) -> dict:
        """Remove a document's blocks from the corpus (needs the server's write token). Returns the removed ids."""
        try:
            return service.remove_document(token, doc_id)
        except (WriteRefused, ValueError) as err:
            raise user_error(err) from None

    def ask_page(question, k):
        return _page_answers(service, question, k)

    def write_page(action, *args):
        # The page shows a refusal in place (not only as a pop-up), so that it stays on screen.
        try:
            result = action(*args)
        except (WriteRefused, ValueError) as err:
            return f'<p class="realm-write-status" style="color:#cf222e">{html.escape(str(err))}</p>'
        return f'<p class="realm-write-status">Done: {html.escape(str(result))}</p>'

    corpus_size = model.retriever.num_blocks
    with _guarded_blocks_class(gr)(title=title, analytics_enabled=False) as app:
        gr.Markdown(f"# {html.escape(title)}\nAnswers from a corpus of {corpus_size:,} blocks, with their source.")
        if not service.reader_trained:
            gr.HTML(_untrained_reader_notice(), elem_id="untrained-notice")
        with gr.Row():
            question = gr.Textbox(label="Question", placeholder="Ask a question", elem_id="question", scale=4)
            k = gr.Slider(1, MAX_TOP_K, value=service.top_k, step=1, label="Answers", elem_id="top-k", scale=1)
        ask = gr.Button("Ask", variant="primary", elem_id="ask")
        answers = gr.HTML(elem_id="answers")
        with gr.Accordion("Answers as JSON (the API's records)", open=False):
            records = gr.JSON(elem_id="records")
        with gr.Accordion("Add or remove documents (needs the write token)", open=False, elem_id="documents"):
            token = gr.Textbox(label="Write token", type="password", elem_id="write-token")
            with gr.Row():
                doc_title = gr.Textbox(label="Title", elem_id="doc-title")
                doc_id = gr.Textbox(label="doc_id (optional when adding)", elem_id="doc-id")
            doc_text = gr.Textbox(label="Text", lines=3, elem_id="doc-text")
            with gr.Row():
                add = gr.Button("Add document", elem_id="add-document")
                remove = gr.Button("Remove document (by doc_id)", elem_id="remove-document")
            status = gr.HTML(elem_id="write-status")

        # The page's own events stay off the API: clients use the typed endpoints below.
        for trigger in (ask.click, question.submit):
            trigger(ask_page, [question, k], [answers, records], api_visibility="private")
        add.click(
            lambda *a: write_page(service.add_document, *a),
            [token, doc_text, doc_title, doc_id],
            status,
            api_visibility="private",
        )
        remove.click(
            lambda *a: write_page(service.remove_document, *a), [token, doc_id], status, api_visibility="private"
        )
        gr.api(answer, api_name="answer")
        gr.api(add_document, api_name="add_document")
        gr.api(remove_document, api_name="remove_document")
    app.queue(default_concurrency_limit=concurrency)
    app.realm_service = service  # for callers (tests, a Space) that want the service behind the page
    app.realm_allowed_hosts = tuple(allowed_hosts)
    app.realm_max_request_size = max_request_size
    return app


__all__ = [
    "LOOPBACK_HOSTS",
    "MAX_REQUEST_SIZE",
    "WRITE_TOKEN_HEADER",
    "RequestGuard",
    "answers_html",
    "build_app",
    "highlighted_block_html",
    "require_gradio",
    "served_hosts",
]
