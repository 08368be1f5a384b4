"""realm-hf: REALM (Retrieval-Augmented Language Model Pre-Training) for the Hugging Face ecosystem."""

__version__ = "0.1.0"

from .configuration_realm import RealmConfig  # noqa: E402

__all__ = ["RealmConfig", "__version__"]
