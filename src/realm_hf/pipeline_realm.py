"""
The module path that saved REALM models name: the `realm_pipeline.py` that [`write_pipeline_module`] writes next to a
saved model imports `RealmQuestionAnsweringPipeline` from here, so this path stays importable for every directory
saved so far (`tests/io/test_auto_map.py`). The implementation is [`realm_hf.pipelines`].
"""

from .pipelines import *  # noqa: F403 - the saved module path re-exports the package's public names
from .pipelines import __all__  # noqa: F401
