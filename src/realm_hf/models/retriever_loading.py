"""
The one loader of the retriever that belongs to a REALM checkpoint, the same for every model that owns one
([`~realm_hf.models.retriever_owner.RetrieverOwnerMixin`]: `RealmForOpenQA`, `RealmForPreTraining`):

- a local directory: its `retriever/` folder (after completing an interrupted save into it);
- a Hub repo id: its `retriever/` folder, downloaded through the huggingface_hub cache and pinned to one commit;
- a legacy checkpoint: its `block_emb` buffer (with its pickled `block_records.npy` only when allowed);
- otherwise the corpus the model's config references (`config.retriever_repo_id`, a dataset repo).

Every retriever found is checked against the model: its embedding size, the weights it was saved with, and, when the
model trains its own document embedder, that embedder's fingerprint (a stale index warns).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NamedTuple

from huggingface_hub import hf_hub_download, snapshot_download, try_to_load_from_cache
from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

from ..constants import LEGACY_BLOCK_RECORDS, MANIFEST_NAME, RETRIEVER_SUBFOLDER
from ..io.consistent_reads import consistent_read
from ..io.paths import check_inside
from ..io.staged_saves import recover_interrupted_save
from ..logging_utils import get_logger
from ..text.tokenizer_calls import check_vocabulary

if TYPE_CHECKING:
    from .configuration_realm import RealmConfig

logger = get_logger(__name__)

# `from_pretrained` keywords that say where and how to fetch from the Hub (the rest are transformers' own).
HUB_KWARGS = ("revision", "cache_dir", "token", "local_files_only")


class CheckpointRetriever(NamedTuple):
    """What [`load_checkpoint_retriever`] found: the retriever, or `None` and, for a legacy checkpoint whose block
    texts were not unpickled, its block embeddings."""

    retriever: object | None
    legacy_block_emb: object | None = None


def load_checkpoint_retriever(
    model,
    path,
    allow_pickle: bool = False,
    verify_checksums: bool = True,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    local_files_only: bool = False,
) -> CheckpointRetriever:
    r"""
    Find the corpus that belongs to the checkpoint `model` was just loaded from (`path`, a local directory or a Hub
    repo id): see the module docstring for the order. What `from_pretrained` of every REALM model that owns a
    retriever calls.

    Args:
        model: The freshly loaded model (its `config`, and its `document_embedder` if it trains one).
        path (`str` or `os.PathLike`): What the weights were loaded from.
        allow_pickle (`bool`, *optional*, defaults to `False`): Legacy checkpoints only: unpickle their
            `block_records.npy` (only for files you trust).
        verify_checksums (`bool`, *optional*, defaults to `True`): Compare the sha256 of the files with those the
            retriever's manifest recorded (sizes are always compared).
        revision, cache_dir, token, local_files_only: As given to `from_pretrained`, for a Hub repo.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        retriever = load_retriever_from_hub(
            model,
            path,
            revision=revision,
            cache_dir=cache_dir,
            token=token,
            local_files_only=local_files_only,
            verify_checksums=verify_checksums,
        )
        return CheckpointRetriever(retriever)
    retriever_dir = prepare_local_load(path)
    if retriever_dir is not None:
        return CheckpointRetriever(
            load_retriever_for_model(model, retriever_dir, model_dir=path, verify_checksums=verify_checksums)
        )
    from ..retrieval.legacy import load_legacy_block_emb  # local import: retrieval pulls in faiss and datasets

    block_emb = load_legacy_block_emb(path)
    if block_emb is not None:
        return _legacy_retriever(path, block_emb, allow_pickle)
    # No corpus in the directory: the config may name one. Hub repo ids only: a local model's config may not point
    # realm-hf at another corpus on disk unasked.
    retriever = load_referenced_retriever(
        model,
        cache_dir=cache_dir,
        token=token,
        local_files_only=local_files_only,
        allow_local_reference=False,
        referenced_by=path,
    )
    return CheckpointRetriever(retriever)


def _legacy_retriever(path: str, block_emb, allow_pickle: bool) -> CheckpointRetriever:
    from ..retrieval.legacy import pickle_allowed

    if os.path.exists(os.path.join(path, LEGACY_BLOCK_RECORDS)) and pickle_allowed(allow_pickle):
        from transformers import AutoTokenizer

        from ..retrieval.retriever import RealmRetriever

        tokenizer = AutoTokenizer.from_pretrained(path)
        check_vocabulary(tokenizer, path)
        return CheckpointRetriever(
            RealmRetriever.from_legacy(path, tokenizer=tokenizer, block_emb=block_emb, allow_pickle=True)
        )
    logger.warning(
        "Legacy REALM checkpoint: its %d block embeddings are available as `model.legacy_block_emb`, but its block "
        "texts are in a pickled block_records.npy, which is not loaded by default. Convert once with "
        "`realm-hf convert %s <output_dir>`, or pass `allow_pickle=True` if you trust the file.",
        block_emb.shape[0],
        path,
    )
    # The embeddings stay reachable (memory-mapped, not a model buffer) so a converter or retriever can use them.
    return CheckpointRetriever(None, legacy_block_emb=block_emb)


def prepare_local_load(path) -> str | None:
    """
    Before loading a local model directory: complete a save into it that was interrupted while swapping its files
    in, and return its `retriever/` folder if it has one (refused if a symbolic link leads it out of the directory).
    `None` for a Hub repo id.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        return None
    recover_interrupted_save(path)
    retriever_dir = os.path.join(path, RETRIEVER_SUBFOLDER)
    if not os.path.isdir(retriever_dir):
        return None
    check_inside(path, retriever_dir, "the retriever folder", path)
    return retriever_dir


def load_retriever_for_model(model, path: str, model_dir: str | None = None, verify_checksums: bool = True):
    """
    Load a saved retriever folder for `model`, checking it against the model's embedding size (and the fingerprint
    of the document embedder it trains, if any) and, given the `model_dir` the weights were loaded from, that those
    weights are the ones saved with it.
    """
    from ..retrieval.manifest import check_model_files  # local import: retrieval pulls in faiss and datasets
    from ..retrieval.retriever import RealmRetriever

    # One save: the model files checked are those of the manifest the retriever is then loaded with.
    with consistent_read(path):
        if model_dir is not None:
            check_model_files(path, model_dir, verify_checksums=verify_checksums)
        # The fingerprint (stale-index warning) only means something against a document embedder the model trains
        # itself (not `index_embedder`, which on an Open-QA model without one is the question embedder): otherwise the
        # index came from a separate pre-trained embedder, and only the dimension is checked.
        # A BM25 index saved beside the dense one (hybrid retrieval) comes back in the retriever's store.
        document_embedder = getattr(model, "document_embedder", None)
        if document_embedder is not None:
            return RealmRetriever.from_pretrained(path, embedder=document_embedder, verify_checksums=verify_checksums)
        return RealmRetriever.from_pretrained(
            path, expected_dim=model.config.retriever_proj_size, verify_checksums=verify_checksums
        )


def check_retriever_dim(retriever, config: RealmConfig) -> None:
    """Refuse a retriever whose embeddings are not `config.retriever_proj_size`-dimensional (`None` passes)."""
    dim = getattr(retriever, "embedding_dim", None)
    if dim is None or int(dim) == int(config.retriever_proj_size):
        return
    raise ValueError(
        f"This retriever holds {int(dim)}-d embeddings, but the model's embedder projects to "
        f"{config.retriever_proj_size} dimensions (config.retriever_proj_size): its inner products would be "
        "meaningless. Use the corpus built for this model, or re-embed it with this model's embedder "
        "(`realm_hf.retrieval.embed_corpus(retriever, model.index_embedder)`)."
    )


# --------------------------------------------------------------------------------------------------------------------
# The Hub
# --------------------------------------------------------------------------------------------------------------------


def download_retriever(
    repo_id: str,
    subfolder: str | None = RETRIEVER_SUBFOLDER,
    repo_type: str | None = None,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    local_files_only: bool = False,
) -> str | None:
    r"""
    Download (or find in the cache) the retriever files of a Hub repo and return their local folder.

    Only the files under `subfolder` are fetched (`snapshot_download(allow_patterns=["<subfolder>/*"])`), pinned to
    the commit at which the manifest was found, so that the corpus and index always come from one revision.

    Args:
        repo_id (`str`): Repo id on the Hub.
        subfolder (`str`, *optional*, defaults to `"retriever"`): Folder of the retriever in the repo; `None` or `""`
            for the repo root (a corpus pushed with [`~realm_hf.hub.repositories.push_corpus_to_hub`]).
        repo_type (`str`, *optional*): `"model"` (default) or `"dataset"`.
        revision (`str`, *optional*): Branch, tag or commit.
        cache_dir, token, local_files_only: As in `huggingface_hub.snapshot_download`.

    Returns:
        `str` or `None`: The local retriever folder, or `None` when the repo has no retriever manifest there.

    Raises:
        `OSError`: Offline (`HF_HUB_OFFLINE=1` or `local_files_only=True`) and the retriever is not in the cache.
    """
    subfolder = (subfolder or "").strip("/")
    manifest = f"{subfolder}/{MANIFEST_NAME}" if subfolder else MANIFEST_NAME
    kwargs = {"repo_type": repo_type, "cache_dir": cache_dir}
    try:
        manifest_file = hf_hub_download(
            repo_id, manifest, revision=revision, token=token, local_files_only=local_files_only, **kwargs
        )
    except LocalEntryNotFoundError as err:
        # Offline: a cached "does not exist" marker (left by an earlier online load) means there is no retriever;
        # anything else means we cannot know, and a model without its corpus cannot answer: say so now.
        cached = try_to_load_from_cache(repo_id, manifest, revision=revision, **kwargs)
        if cached is not None and not isinstance(cached, str):
            return None
        where = f"{repo_id}/{manifest}" + (f" at revision {revision}" if revision else "")
        raise OSError(
            f"Cannot load the REALM retriever ({where}): the Hub is not reachable (HF_HUB_OFFLINE=1 or "
            "local_files_only=True) and it is not in the local cache. Load the model once online to cache it, "
            "or pass a retriever explicitly: `RealmForOpenQA.from_pretrained(..., retriever=RealmRetriever."
            "from_pretrained(local_dir))`."
        ) from err
    except EntryNotFoundError:
        return None  # the repo has no retriever there (online answer)

    # .../snapshots/<commit>/<manifest>: pin the snapshot download to that commit.
    snapshot_root = manifest_file[: -len(manifest)].rstrip("/\\")
    commit = os.path.basename(snapshot_root)
    root = snapshot_download(
        repo_id,
        revision=commit if _looks_like_commit(commit) else revision,
        allow_patterns=[f"{subfolder}/*"] if subfolder else None,
        token=token,
        local_files_only=local_files_only,
        **kwargs,
    )
    return os.path.join(root, subfolder) if subfolder else root


def _looks_like_commit(name: str) -> bool:
    return len(name) == 40 and all(c in "0123456789abcdef" for c in name)


def load_retriever_from_hub(
    model,
    repo_id: str,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    local_files_only: bool = False,
    follow_reference: bool = True,
    verify_checksums: bool = True,
):
    r"""
    Load the retriever that belongs to a model repo on the Hub: its `retriever/` folder, or else the dataset repo its
    config references (`config.retriever_repo_id`).

    Called by `from_pretrained(repo_id)` of every REALM model that owns a retriever (through
    [`load_checkpoint_retriever`]).

    Args:
        model: The freshly loaded model (its config may hold a reference).
        repo_id (`str`): The model repo.
        revision, cache_dir, token, local_files_only: As given to `from_pretrained`.
        follow_reference (`bool`, *optional*, defaults to `True`): Follow `config.retriever_repo_id` when the repo
            has no `retriever/` folder.
        verify_checksums (`bool`, *optional*, defaults to `True`): Also compare the sha256 of the weights and the
            retriever's files with those its manifest recorded (sizes are always compared).

    Raises:
        `ValueError`: The repo's weights are not the ones its `retriever/` folder was saved with (its manifest's
            `model_files`, written by `push_to_hub` and `save_pretrained`), e.g. new weights uploaded beside an
            old index.

    Returns:
        [`RealmRetriever`] or `None` (no retriever anywhere: an Open-QA model can still read a given context).
    """
    local = download_retriever(
        repo_id,
        RETRIEVER_SUBFOLDER,
        revision=revision,
        cache_dir=cache_dir,
        token=token,
        local_files_only=local_files_only,
    )
    if local is not None:
        _check_weights_of_repo(local, repo_id, revision, verify_checksums)
        return load_retriever_for_model(model, local, verify_checksums=verify_checksums)
    if follow_reference:
        return load_referenced_retriever(
            model,
            cache_dir=cache_dir,
            token=token,
            local_files_only=local_files_only,
            allow_local_reference=False,
            referenced_by=repo_id,
        )
    return None


def load_referenced_retriever(
    model,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    local_files_only: bool = False,
    allow_local_reference: bool = True,
    referenced_by: str | None = None,
    **unused,
):
    r"""
    Load the retriever named by the model config (`retriever_repo_id` and optionally `retriever_revision`,
    `retriever_repo_type` (default `"dataset"`), `retriever_subfolder`), or return `None` when there is no reference.

    `retriever_repo_id` may also be a local directory (a saved retriever), which is loaded as is, but only when this
    function is called with `allow_local_reference=True` (the default of a direct call: you asked for it).
    `from_pretrained` follows a reference with `allow_local_reference=False` (the model's directory or repo id in
    `referenced_by`): a model's `config.json` may not make realm-hf read another corpus on this machine (an absolute
    path, `../`, or a folder relative to the working directory) without a word from you.

    Raises:
        `OSError`: The reference points at a repo without a retriever manifest, or offline without the files.
    """
    config = model.config
    repo_id = getattr(config, "retriever_repo_id", None)
    if not repo_id:
        return None
    subfolder = getattr(config, "retriever_subfolder", None) or ""
    if not allow_local_reference and _is_local_reference(repo_id):
        kind = "model directory" if referenced_by and os.path.isdir(referenced_by) else "model repo"
        raise ValueError(
            f"The {kind} {referenced_by!r} names a local path as its retriever (config.retriever_repo_id="
            f"{repo_id!r}): a model may not make realm-hf read another corpus on this machine, outside it, without "
            "your say (a downloaded repo may not make realm-hf read outside it). If you trust that path, load it "
            f"yourself: `{type(model).__name__}.from_pretrained(model, retriever=RealmRetriever.from_pretrained(path))`,"
            " or `realm_hf.hub.repositories.load_referenced_retriever(model)`; or remove the reference (`set_retriever_reference("
            "model.config, None)`) and save the model with its corpus in its `retriever/` folder."
        )
    if os.path.isdir(repo_id):
        return load_retriever_for_model(model, os.path.join(repo_id, subfolder) if subfolder else repo_id)
    local = download_retriever(
        repo_id,
        subfolder,
        repo_type=getattr(config, "retriever_repo_type", None) or "dataset",
        revision=getattr(config, "retriever_revision", None),
        cache_dir=cache_dir,
        token=token,
        local_files_only=local_files_only,
    )
    if local is None:
        raise OSError(
            f"The model config references the retriever repo {repo_id!r}, but it holds no "
            f"{MANIFEST_NAME} (subfolder {subfolder!r}). Push one with `realm_hf.hub.repositories.push_corpus_to_hub`."
        )
    return load_retriever_for_model(model, local)


def _is_local_reference(repo_id: str) -> bool:
    """Whether a `retriever_repo_id` names a path of this machine rather than a Hub repo id (`name` or `owner/name`)."""
    return (
        os.path.isabs(repo_id)
        or os.path.exists(repo_id)
        or repo_id.startswith((".", "~"))
        or "\\" in repo_id
        or ".." in repo_id.split("/")
        or repo_id.count("/") > 1
    )


def _check_weights_of_repo(retriever_dir: str, repo_id: str, revision: str | None, verify_checksums: bool) -> None:
    """
    Refuse a repo whose weights are not the ones its `retriever/` folder was saved with. The weights transformers
    fetched for the same commit sit in the same cache snapshot, one level up.
    """
    from ..retrieval.manifest import check_model_files  # local import: retrieval pulls in faiss and datasets

    try:
        check_model_files(retriever_dir, os.path.dirname(os.path.normpath(retriever_dir)), verify_checksums)
    except (OSError, ValueError) as err:
        at = f" at revision {revision!r}" if revision else ""
        raise ValueError(
            f"The weights of {repo_id!r}{at} are not the ones its retriever/ folder (corpus and index) was saved with, "
            f"so its answers would come from an index built for other weights ({err}). Push the model again with "
            "`model.push_to_hub(...)`, which uploads weights and index together; if the repo changed while it was "
            "being downloaded, load it again or pin `revision=` to a commit; or load the weights alone "
            "(`load_retriever=False`) and attach a corpus (`retriever=...`)."
        ) from None


__all__ = [
    "CheckpointRetriever",
    "check_retriever_dim",
    "download_retriever",
    "load_checkpoint_retriever",
    "load_referenced_retriever",
    "load_retriever_for_model",
    "load_retriever_from_hub",
    "prepare_local_load",
]
