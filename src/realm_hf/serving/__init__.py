"""Serving a REALM model (`realm-hf serve`): a Gradio page and API over the answering service; Gradio is optional."""

from .app import answers_html, build_app, require_gradio
from .service import RealmQAService, WriteRefused

__all__ = ["RealmQAService", "WriteRefused", "answers_html", "build_app", "require_gradio"]
