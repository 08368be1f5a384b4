"""Serving a REALM model (`realm-hf serve`): a Gradio page and API over the answering service; Gradio is optional."""

from .app import RequestGuard, answers_html, build_app, require_gradio, served_hosts
from .service import RealmQAService, WriteRefused

__all__ = [
    "RealmQAService",
    "RequestGuard",
    "WriteRefused",
    "answers_html",
    "build_app",
    "require_gradio",
    "served_hosts",
]
