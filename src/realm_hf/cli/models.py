"""Loading the models the commands run: the Open-QA model and the embedder that fills an index."""

from __future__ import annotations

import os

from .common import CLIError, architecture_of, config_of, default_device, require_local_or_hub


def load_openqa(path: str, allow_pickle: bool = False, device: str | None = None, need_retriever: bool = True):
    """A `RealmForOpenQA` in eval mode on `device`, refusing a directory that holds another architecture."""
    # deferred: the cli package imports nothing heavy at module level
    from ..models.modeling_openqa import RealmForOpenQA

    require_local_or_hub(path, "Model")
    if os.path.isdir(path):
        found = architecture_of(config_of(path))
        if found and found != "RealmForOpenQA":
            raise CLIError(f"{path} holds a {found}, not a RealmForOpenQA question-answering model.")
    model = RealmForOpenQA.from_pretrained(path, allow_pickle=allow_pickle)
    if need_retriever:
        model.require_retriever()  # says what to do (convert, allow_pickle, attach a corpus) when there is none
    model.to(default_device(device))
    return model.eval()


def load_without_retriever(model_class, path: str, **kwargs):
    """
    `model_class.from_pretrained(path)` without loading (or unpickling) the corpus saved with it: for commands that
    need the weights only (an embedder to build an index with, a legacy checkpoint without block records).
    """
    return model_class.from_pretrained(path, load_retriever=False, **kwargs)


# The REALM architectures whose embedder can fill an index ("" : a config that names none, read as an embedder).
_EMBEDDER_ARCHITECTURES = (
    "",
    "RealmEmbedder",
    "RealmScorer",
    "RealmForOpenQA",
    "RealmForPreTraining",
    "RealmForInverseClozeTask",
)


def check_embedder_dir(path: str, what: str = "--model") -> None:
    """
    Refuse, from its `config.json` alone, a directory whose model cannot embed an index (another model type, such as
    a BERT or MiniLM checkpoint, or a REALM class without an embedder): before any document is read.
    """
    config = config_of(path)
    model_type = config.get("model_type")
    if model_type not in (None, "realm"):
        raise CLIError(
            f"{what} {path} holds a `{model_type}` model, not a REALM one. Start a REALM model from it first, e.g. "
            "`realm-hf train` with `init_from_bert` in the config, or `realm_hf.init_from_bert(RealmForOpenQA, "
            f"{path!r})`, then save it and index with that directory."
        )
    found = architecture_of(config)
    if found not in _EMBEDDER_ARCHITECTURES:
        raise CLIError(f"{what} {path} holds a {found}, which has no embedder to build an index with.")


def embedder_from_dir(path: str):
    """The embedder that fills an index, from a REALM model directory: (embedder, description)."""
    from ..models.modeling_embedder import RealmEmbedder, RealmScorer  # deferred: see load_openqa
    from ..models.modeling_openqa import RealmForOpenQA

    check_embedder_dir(path)
    found = architecture_of(config_of(path))
    if found == "RealmEmbedder" or not found:
        return RealmEmbedder.from_pretrained(path), "embedder"
    if found == "RealmScorer":
        return RealmScorer.from_pretrained(path).embedder, "scorer's embedder"
    if found == "RealmForOpenQA":
        model = load_without_retriever(RealmForOpenQA, path)
        what = "document embedder" if model.index_embedder is model.document_embedder else "question embedder"
        return model.index_embedder, what
    if found == "RealmForPreTraining":
        from ..models.modeling_pretraining import RealmForPreTraining  # deferred: see load_openqa

        return load_without_retriever(RealmForPreTraining, path).index_embedder, "document embedder"
    if found == "RealmForInverseClozeTask":
        from ..models.modeling_ict import RealmForInverseClozeTask  # deferred: see load_openqa

        return RealmForInverseClozeTask.from_pretrained(path).index_embedder, "ICT document embedder"
    raise CLIError(f"{path} holds a {found}, which has no embedder to build an index with.")
