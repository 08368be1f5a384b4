"""realm-hf's loggers and warnings follow transformers' verbosity, and importing realm-hf changes no global logging."""

import logging
import os
import subprocess
import sys

import pytest


@pytest.fixture
def transformers_verbosity():
    from transformers.utils import logging as transformers_logging

    before = transformers_logging.get_verbosity()
    yield transformers_logging
    transformers_logging.set_verbosity(before)
    logging.getLogger("realm_hf").setLevel(logging.NOTSET)


def ivf_warnings(caplog):
    from realm_hf.retrieval.faiss_build import adjust_factory_for_size

    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        adjust_factory_for_size("IVF64,Flat", 100)  # too few vectors: warns once
        logging.getLogger("realm_hf.retrieval.faiss_build").info("an info record")
    return [r.levelname for r in caplog.records if r.name.startswith("realm_hf")]


def test_realm_hf_loggers_follow_transformers_verbosity(transformers_verbosity, caplog):
    transformers_verbosity.set_verbosity_warning()
    assert ivf_warnings(caplog) == ["WARNING"]
    transformers_verbosity.set_verbosity_error()
    assert ivf_warnings(caplog) == []
    transformers_verbosity.set_verbosity_info()
    assert ivf_warnings(caplog) == ["WARNING", "INFO"]
    # A level set on realm-hf's own logger governs realm-hf alone ...
    logging.getLogger("realm_hf").setLevel(logging.ERROR)
    assert ivf_warnings(caplog) == []
    # ... and one set on a module's logger governs that module.
    transformers_verbosity.set_verbosity_warning()
    logging.getLogger("realm_hf").setLevel(logging.NOTSET)
    index_logger = logging.getLogger("realm_hf.retrieval.faiss_build")
    before = index_logger.level
    index_logger.setLevel(logging.INFO)
    try:
        assert ivf_warnings(caplog) == ["WARNING", "INFO"]
    finally:
        index_logger.setLevel(before)
    assert ivf_warnings(caplog) == ["WARNING"]


def test_realm_hf_warnings_follow_transformers_verbosity(transformers_verbosity):
    import warnings

    from realm_hf.precision import resolve_autocast_dtype

    with pytest.warns(UserWarning, match="no fast fp16"):
        resolve_autocast_dtype("fp16", "cpu", "answering")
    transformers_verbosity.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_autocast_dtype("fp16", "cpu", "answering") is None


def test_import_changes_no_global_logging():
    probe = (
        "import logging\n"
        "root = logging.getLogger()\n"
        "before = (root.level, list(root.handlers))\n"
        "import realm_hf, realm_hf.training\n"
        "from transformers.utils import logging as tl\n"
        "assert (root.level, list(root.handlers)) == before, (root.level, root.handlers)\n"
        "assert tl.get_verbosity() == logging.WARNING\n"
        "assert logging.getLogger('realm_hf').level == logging.NOTSET and not logging.getLogger('realm_hf').handlers\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "TRANSFORMERS_VERBOSITY"}
    # A fresh interpreter (what import does is the question); it imports torch, so it may be slow on a busy machine.
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr
