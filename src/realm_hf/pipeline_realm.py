"""
Question answering with REALM through transformers' `pipeline` API, kept under its old module name: the
implementation is [`realm_hf.pipelines`] (the pipeline class, its inputs, its answers and its registration).
"""

from .pipelines import *  # noqa: F403 - the old module path re-exports the package's public names
from .pipelines import __all__  # noqa: F401
