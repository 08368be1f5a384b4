"""
The Gradio app of `realm-hf serve`: a page that answers a question with the top answers, their probability and the
source block with the answer highlighted, and the same answers through Gradio's API in the provenance schema. The same
`build_app` runs as a Hub Space's `app.py`.
"""

from __future__ import annotations

import html
from typing import Any

from .service import MAX_TOP_K, RealmQAService, WriteRefused

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
        dtype (`str` or `torch.dtype`, *optional*, defaults to fp32): Compute dtype of every answer (`"bf16"`,
            `"auto"`, `"int8"` on a CPU; see `RealmForOpenQA.answer`).

    Returns:
        `gradio.Blocks`.
    """
    gr = require_gradio()
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
    with gr.Blocks(title=title, analytics_enabled=False) as app:
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
    return app


__all__ = ["answers_html", "build_app", "highlighted_block_html", "require_gradio"]
