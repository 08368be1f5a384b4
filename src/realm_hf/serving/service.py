"""
What `realm-hf serve` does, without the web layer: answers in the provenance schema, and document writes guarded by a
token. The Gradio app (`serving/app.py`) only calls these methods, so the page, the API and a test share one path.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
from typing import Any

from ..constants import SERVE_WRITE_TOKEN_ENV
from ..models.openqa_answers import resolve_no_answer_threshold
from ..pipelines import RealmQuestionAnsweringPipeline
from ..precision import check_int8, parse_dtype

logger = logging.getLogger(__name__)

# The pipeline's default, passed explicitly (as `realm-hf ask` does) so the check and the pipeline agree.
MAX_QUESTION_LENGTH = 64
MAX_TOP_K = 20
# Request fields are bounded before any work: a question is read as at most 64 wordpieces anyway, and a document is
# split and embedded whole (a larger corpus is built with `realm-hf index`, not through the server).
MAX_QUESTION_CHARS = 2_000
MAX_DOCUMENT_CHARS = 200_000
MAX_FIELD_CHARS = 1_000  # a title, a doc_id, the write token


class WriteRefused(PermissionError):
    """A document write without the server's write token (or on a server started without one)."""


class RealmQAService:
    r"""
    A served [`RealmForOpenQA`]: its question-answering pipeline, and its corpus's writes behind a token.

    Answering is safe from many threads at once, also while documents are added or removed: each answer comes from one
    state of the corpus and index (the retriever's search takes everything under its lock, docs/architecture.md).
    Writes change the model's retriever in memory only; they are not saved to the model directory.

    Args:
        model ([`RealmForOpenQA`]): The model, with its retriever attached.
        tokenizer (*optional*): Question tokenizer; defaults to the retriever's.
        write_token (`str`, *optional*): The token that allows adding and removing documents. Without it (and without
            the environment variable `REALM_HF_SERVE_WRITE_TOKEN`), every write is refused.
        top_k (`int`, *optional*, defaults to 3): Answers per question when the caller does not say.
        num_blocks (`int`, *optional*): Blocks retrieved and read per question (default `config.reader_beam_size`).
        dtype (`str` or `torch.dtype`, *optional*, defaults to fp32): Compute dtype of every answer (`"bf16"`,
            `"auto"`, `"int8"` on a CPU, ...; see `RealmForOpenQA.answer`).
        no_answer_threshold (`float`, *optional*): Answer "no answer" when the best span's probability is under this
            (default `config.no_answer_threshold`, else 0.1): a served page shows no confident-looking answer to a
            question its corpus does not answer. 0 answers every question with its best span.
    """

    def __init__(
        self,
        model,
        tokenizer=None,
        write_token: str | None = None,
        top_k: int = 3,
        num_blocks=None,
        dtype=None,
        no_answer_threshold: float | None = None,
    ):
        model.require_retriever()  # says how to attach a corpus when there is none
        self.dtype = parse_dtype(dtype)
        if self.dtype == "int8":
            check_int8(model.device)  # refused when the server starts, not at its first question
        self.model = model
        #: The span probability under which answers are "no answer" (0: never).
        self.no_answer_threshold = resolve_no_answer_threshold(
            model.config, no_answer_threshold, handle_impossible_answer=True
        )
        #: Whether the reader's span head was trained (`config.reader_trained`); the page says so when it was not.
        self.reader_trained = bool(getattr(model.config, "reader_trained", True))
        self.pipeline = RealmQuestionAnsweringPipeline(model=model, tokenizer=tokenizer, device=model.device)
        self.tokenizer = self.pipeline.tokenizer
        self.top_k = check_top_k(top_k)
        self.num_blocks = num_blocks
        if write_token is None:
            write_token = os.environ.get(SERVE_WRITE_TOKEN_ENV) or None
        if write_token is not None and not write_token.strip():
            raise ValueError("The write token is empty: give a non-empty token, or none to refuse every write.")
        self._write_token = write_token

    @property
    def writes_enabled(self) -> bool:
        """Whether the server was started with a write token (writes are refused otherwise)."""
        return self._write_token is not None

    def answer(self, question: str, top_k: int | None = None) -> list[dict[str, Any]]:
        r"""
        The best answers to one question, as `realm-hf ask --json` gives them (docs/provenance.md).

        Returns:
            `list[dict]`: up to `top_k` records, best first, each `{"question", "rank", "answer", "score", "logit",
            "start", "end", "block"}`; one "no answer" record (`answer` `""`, `block` `None`, `score` the best span's
            probability) when the reader finds no span or the best span's probability is under
            `no_answer_threshold` (answers under it are left out).
        """
        top_k = self.top_k if top_k is None else check_top_k(top_k)
        if not isinstance(question, str):
            raise ValueError(f"The question must be a string, got {type(question).__name__}.")
        _check_length("The question", question, MAX_QUESTION_CHARS)
        # The pipeline checks the question (`user_text.check_questions`, the rule every entry point shares).
        kwargs = {
            "top_k": top_k,
            "max_question_length": MAX_QUESTION_LENGTH,
            "no_answer_threshold": self.no_answer_threshold,
        }
        if self.num_blocks is not None:
            kwargs["num_blocks"] = self.num_blocks
        if self.dtype is not None:
            kwargs["dtype"] = self.dtype
        answers = self.pipeline(question, **kwargs)
        answers = answers if isinstance(answers, list) else [answers]
        # As `realm-hf ask`: the spans found, or the one "no answer" record.
        answers = [a for a in answers if a.get("answer")] or answers[:1]
        return [{"question": question, "rank": rank, **answer} for rank, answer in enumerate(answers, 1)]

    def check_token(self, token: str | None) -> None:
        """Raise [`WriteRefused`] unless `token` is the server's write token (compared in constant time)."""
        if self._write_token is None:
            logger.warning("Refused a document write: this server has no write token.")
            raise WriteRefused(
                "Writes are disabled on this server: start it with --write-token (or the environment variable "
                f"{SERVE_WRITE_TOKEN_ENV}) to allow adding and removing documents."
            )
        if token is not None and not isinstance(token, str):
            logger.warning("Refused a document write: the token sent is a %s, not a string.", type(token).__name__)
            raise WriteRefused(f"Refused: the write token must be a string, got {type(token).__name__}.")
        if not token or not self.token_matches(token):
            logger.warning("Refused a document write: missing or wrong write token.")
            raise WriteRefused("Refused: missing or wrong write token.")

    def token_matches(self, token) -> bool:
        """Whether `token` is the server's write token (compared in constant time); `False` on a server without one."""
        if self._write_token is None or not isinstance(token, str) or len(token) > MAX_FIELD_CHARS:
            return False
        return hmac.compare_digest(token.encode("utf-8", "surrogatepass"), self._write_token.encode("utf-8"))

    def add_document(self, token: str | None, text: str, title: str = "", doc_id: str = "") -> dict[str, Any]:
        r"""
        Split, embed and index one document (with the embedder that fills the model's index: the document embedder if
        the model has one, else the shared embedder). Needs the write token.

        Returns:
            `dict` with `doc_id` (the one given, or the one the corpus assigned) and `block_ids` (the new blocks).
        """
        self.check_token(token)
        if text is not None and not isinstance(text, str):
            raise ValueError(f"The document's text must be a string, got {type(text).__name__}.")
        if not text or not text.strip():
            raise ValueError("The document's text is empty: give the text to add.")
        _check_length("The document's text", text, MAX_DOCUMENT_CHARS)
        title = _optional_field("title", title)
        doc_id = _optional_field("doc_id", doc_id)
        document = {"title": title.strip(), "text": text.strip()}
        if doc_id.strip():
            document["doc_id"] = doc_id.strip()
        model = self.model
        embedder = model.index_embedder
        block_ids = model.retriever.add_documents([document], embedder, device=model.device, show_progress=False)
        added_doc_id = model.retriever.store.blocks(block_ids[:1])[0].get("doc_id")
        logger.info("Added document %r: blocks %s.", added_doc_id, block_ids)
        return {"doc_id": _plain(added_doc_id), "block_ids": [int(b) for b in block_ids]}

    def remove_document(self, token: str | None, doc_id: str) -> dict[str, Any]:
        r"""
        Remove every block of the document `doc_id` from the corpus and the index. Needs the write token.

        Returns:
            `dict` with `doc_id` and `block_ids` (the removed blocks). Raises `ValueError` if the corpus has no such
            document.
        """
        self.check_token(token)
        if not _optional_field("doc_id", doc_id).strip():
            raise ValueError("No doc_id given: name the document to remove.")
        doc_id = doc_id.strip()
        retriever = self.model.retriever
        key: Any = doc_id
        features = retriever.corpus.features
        if "doc_id" not in features:
            raise ValueError(
                "This corpus has no doc_id column (it was built without document ids), so documents cannot be removed "
                "by doc_id; rebuild it with `realm-hf index --id-column ...` to serve removals."
            )
        # The corpus may hold integer doc_ids (assigned when documents came without one); the page sends text.
        if "doc_id" in features and getattr(features["doc_id"], "dtype", "string") != "string":
            # Only the integer's own spelling: `int()` also reads "0_5", "+4", " 4" and "٣", which would remove
            # another document than the one named.
            if not re.fullmatch(r"-?(0|[1-9][0-9]*)", doc_id):
                raise ValueError(
                    f"No document with doc_id {doc_id!r}: this corpus's doc_ids are integers, written in ASCII digits "
                    "(e.g. '42')."
                )
            key = int(doc_id)
        removed = retriever.remove_documents([key])
        if not removed:
            raise ValueError(f"No document with doc_id {doc_id!r} in the corpus: nothing removed.")
        logger.info("Removed document %r: blocks %s.", doc_id, removed)
        return {"doc_id": doc_id, "block_ids": [int(b) for b in removed]}


def check_top_k(top_k) -> int:
    """`top_k` as an int in [1, MAX_TOP_K], or a `ValueError` naming the range (the page sends floats)."""
    if isinstance(top_k, float) and top_k.is_integer():
        top_k = int(top_k)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
        raise ValueError(f"top_k must be an integer from 1 to {MAX_TOP_K}, got {top_k!r}.")
    return top_k


def _check_length(what: str, text: str, limit: int) -> None:
    if len(text) > limit:
        raise ValueError(f"{what} is {len(text):,} characters long; this server takes at most {limit:,}.")


def _optional_field(name: str, value) -> str:
    """A title or doc_id sent by a client: a string of at most `MAX_FIELD_CHARS` (`None`: empty)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {type(value).__name__}.")
    _check_length(name, value, MAX_FIELD_CHARS)
    return value


def _plain(value):
    # numpy scalars from the corpus become JSON-ready Python values.
    return value.item() if hasattr(value, "item") else value


__all__ = [
    "MAX_DOCUMENT_CHARS",
    "MAX_FIELD_CHARS",
    "MAX_QUESTION_CHARS",
    "MAX_QUESTION_LENGTH",
    "MAX_TOP_K",
    "RealmQAService",
    "WriteRefused",
    "check_top_k",
]
