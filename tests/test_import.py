"""What `import realm_hf` loads: the Auto registration and the models, not the retrieval stack (faiss, datasets), which
loads on first use. Deterministic, unlike a timing assertion; `bench/cli_startup.py` prints the times."""

import json
import os
import subprocess
import sys

from tests.support.paths import REPO

SRC = os.path.join(REPO, "src")

_PROBE = """
import json, sys
import realm_hf
from transformers import AutoConfig, AutoModelForQuestionAnswering, AutoTokenizer
loaded = lambda: sorted(m for m in ("datasets", "faiss", "pandas", "realm_hf.retrieval.retriever") if m in sys.modules)
report = {"at_import": loaded(), "registered": type(AutoConfig.for_model("realm")).__name__}
from realm_hf import RealmRetriever, ShardedRealmRetriever  # the lazy names resolve
report["names"] = [RealmRetriever.__name__, ShardedRealmRetriever.__name__, realm_hf.RealmSearchOutput.__name__]
report["after_use"] = loaded()
report["in_dir"] = all(name in dir(realm_hf) for name in realm_hf.__all__)
print(json.dumps(report))
"""


def test_import_registers_the_auto_classes_without_the_retrieval_stack():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["at_import"] == []  # faiss, datasets (and pandas through it) cost seconds a saved model's load pays
    assert report["registered"] == "RealmConfig"
    assert report["names"] == ["RealmRetriever", "ShardedRealmRetriever", "RealmSearchOutput"]
    assert "faiss" in report["after_use"] and "realm_hf.retrieval.retriever" in report["after_use"]
    assert report["in_dir"]


def test_unknown_attributes_still_raise():
    import pytest

    import realm_hf

    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        realm_hf.NoSuchThing  # noqa: B018
