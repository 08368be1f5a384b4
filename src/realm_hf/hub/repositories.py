"""
Hub publishing for REALM: one model repo that holds everything, or a model repo plus a dataset repo. Loading is
`realm_hf.models.retriever_loading`'s (one loader for local directories and Hub repos, `download_retriever`,
`load_retriever_from_hub`, `load_referenced_retriever`).

Layouts:

- **One repo** (the default): `model.save_pretrained(dir)` / [`push_to_hub`] of a `RealmForOpenQA` or
  `RealmForPreTraining` write the weights (safetensors), config, tokenizer and model card at the root and the corpus
  (`corpus/`: Arrow locally, Parquet shards when pushed), FAISS index (`index.faiss`), the corpus tokenizer and
  `retriever_manifest.json` under `retriever/`. `from_pretrained(repo_id, revision=...)` of either fetches the
  weights through transformers and the `retriever/` folder through `load_retriever_from_hub`.
- **Model + dataset repo**: [`push_corpus_to_hub`] shares a corpus and its index as a dataset repo (one corpus can
  serve several models); [`set_retriever_reference`] records it in the model config (`retriever_repo_id`,
  `retriever_revision`, `retriever_repo_type`, `retriever_subfolder`), and loading follows that reference when the
  model repo has no `retriever/` folder (`load_referenced_retriever`).

Every download goes through `huggingface_hub` and its cache, so `HF_HUB_OFFLINE=1` (or `local_files_only=True`)
loads from the cache alone and fails with a clear error when the files are not there.

The model card (the same one `save_pretrained` and the Trainer write) and what transformers does with a REALM repo
when `realm_hf` is not imported are described in docs/hub.md.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from typing import Any

from huggingface_hub import HfApi
from huggingface_hub.errors import EntryNotFoundError

from ..constants import CORPUS_DIR, RETRIEVER_SUBFOLDER, TOKENIZER_DIR
from ..logging_utils import get_logger
from .cards import write_corpus_card, write_model_card

logger = get_logger(__name__)

# Config fields that point a model at a retriever stored in another repo (or local directory).
REFERENCE_FIELDS = ("retriever_repo_id", "retriever_revision", "retriever_repo_type", "retriever_subfolder")


def set_retriever_reference(
    config,
    repo_id: str | None,
    revision: str | None = None,
    repo_type: str = "dataset",
    subfolder: str | None = None,
) -> None:
    r"""
    Point a model config at a retriever stored elsewhere (a dataset repo from [`push_corpus_to_hub`] or a local
    directory). The fields are saved in `config.json`; `from_pretrained` follows a Hub repo id when the model
    directory or repo has no `retriever/` folder. A local directory is never followed by `from_pretrained` (a model's
    config may not make realm-hf read another corpus on disk unasked): load it with
    [`~realm_hf.models.retriever_loading.load_referenced_retriever`]. `repo_id=None` removes the reference.

    Args:
        config ([`RealmConfig`]): The model's config (`model.config`).
        repo_id (`str`): Dataset repo id (or local directory) of the corpus and index.
        revision (`str`, *optional*): Pin a branch, tag or (best) commit, so the model always gets the index it was
            trained or evaluated with.
        repo_type (`str`, *optional*, defaults to `"dataset"`): Repo type of `repo_id`.
        subfolder (`str`, *optional*): Folder of the retriever inside that repo (root by default).
    """
    if repo_id is None:
        for field in REFERENCE_FIELDS:
            if hasattr(config, field):
                delattr(config, field)
        return
    config.retriever_repo_id = repo_id
    config.retriever_revision = revision
    config.retriever_repo_type = repo_type
    config.retriever_subfolder = subfolder


# --------------------------------------------------------------------------------------------------------------------
# Publishing
# --------------------------------------------------------------------------------------------------------------------


def _existing_readme(api: HfApi, repo_id: str, repo_type: str, revision: str | None) -> str | None:
    try:
        path = api.hf_hub_download(repo_id, "README.md", repo_type=repo_type, revision=revision)
    except (EntryNotFoundError, OSError):  # a new repo or branch: nothing to keep
        return None
    with open(path, encoding="utf-8") as f:
        return f.read()


def push_to_hub(
    model,
    repo_id: str,
    *,
    tokenizer=None,
    commit_message: str | None = None,
    commit_description: str | None = None,
    private: bool | None = None,
    token: str | bool | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    max_shard_size: int | str | None = "50GB",
    save_retriever: bool = True,
    tags: list[str] | None = None,
    model_card_kwargs: dict[str, Any] | None = None,
    endpoint: str | None = None,
):
    r"""
    Push a [`RealmForOpenQA`] (or a [`RealmForPreTraining`], [`RealmForInverseClozeTask`]) to one Hub repo: weights, config, tokenizer, corpus +
    FAISS index + manifest under `retriever/`, and a generated model card that keeps the hand-written parts of the
    repo's current README.

    Differs from transformers' `PushToHubMixin.push_to_hub`, which (in transformers 5) overwrites the README written by
    `save_pretrained` with a generic card and uploads folders only one level deep.

    Args:
        model ([`RealmForOpenQA`] or [`RealmForPreTraining`]): The model, with its retriever attached.
        repo_id (`str`): Target repo (created if needed).
        tokenizer (*optional*): Tokenizer to save at the repo root; defaults to the retriever's.
        commit_message, commit_description, private, token, revision, create_pr, max_shard_size: As in
            transformers' `push_to_hub`.
        save_retriever (`bool`, *optional*, defaults to `True`): Upload the corpus and index too (and delete stale
            files under `retriever/` in the repo). Set `False` for a model that references a dataset repo.
        tags (`list[str]`, *optional*): Extra tags for the model card.
        model_card_kwargs (`dict`, *optional*): Passed to [`~realm_hf.hub.cards.generate_model_card`]
            (`eval_results`, `eval_dataset`, `training_args`, `base_model`, `datasets`, `license`, ...; `license` and
            `datasets` are written only when given).
        endpoint (`str`, *optional*): Hub endpoint (defaults to `HF_ENDPOINT`).

    Returns:
        `huggingface_hub.CommitInfo` of the upload.
    """

    api = HfApi(endpoint=endpoint, token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    if revision is not None and not revision.startswith("refs/pr"):
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    existing = _existing_readme(api, repo_id, "model", revision)
    retriever = getattr(model, "retriever", None)
    if tokenizer is None and retriever is not None:
        tokenizer = getattr(retriever, "tokenizer", None)
    card_kwargs = dict(model_card_kwargs or {})
    if tags:
        card_kwargs["tags"] = list(card_kwargs.get("tags") or []) + list(tags)
    card_kwargs.setdefault("model_id", repo_id)
    save_retriever = save_retriever and retriever is not None
    with tempfile.TemporaryDirectory() as tmp_dir:
        # One save, so the retriever's manifest records the sha256 of these weights (checked when the repo is
        # loaded); Parquet shards rather than the local default (Arrow): compact, and readable by any Parquet tool.
        model.save_pretrained(
            tmp_dir,
            save_retriever=save_retriever,
            corpus_format="parquet",
            model_card=False,  # written below: the repo's README holds the hand-written text to keep
            max_shard_size=max_shard_size,
            tokenizer=tokenizer,
        )
        write_model_card(
            tmp_dir,
            model=model,
            retriever=retriever if save_retriever else None,
            existing_readme=existing or "",  # never the card save_pretrained just wrote: it has no hand-written text
            **card_kwargs,
        )
        with expected_data_files():
            return api.upload_folder(
                repo_id=repo_id,
                folder_path=tmp_dir,
                commit_message=commit_message or "Upload REALM model, corpus and index",
                commit_description=commit_description,
                revision=revision,
                create_pr=create_pr,
                # A re-indexed corpus may have other shard names: do not leave the old ones next to the new manifest.
                delete_patterns=[f"{RETRIEVER_SUBFOLDER}/*"] if save_retriever else None,
            )


_DATA_FILE_WARNING = "It seems that you are about to commit a data file"


@contextlib.contextmanager
def expected_data_files():
    """
    Within it, huggingface_hub's "about to commit a data file (...) to a model repository" warning, given once for
    every Arrow/Parquet file of an upload, is not shown: a REALM model repo holds its corpus (`retriever/corpus/`) on
    purpose, so that one repo has everything `from_pretrained` needs (docs/hub.md). It is explained once, at info
    level, instead.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    data_files = 0
    for warning in caught:
        if str(warning.message).startswith(_DATA_FILE_WARNING):
            data_files += 1
        else:  # anything else is shown as it would have been
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    if data_files:
        logger.info(
            "Uploaded %d corpus data file(s) (Arrow/Parquet) to a model repository on purpose: a REALM model repo "
            "holds its corpus and index under retriever/, so that from_pretrained needs that one repo.",
            data_files,
        )


def push_corpus_to_hub(
    retriever,
    repo_id: str,
    *,
    repo_type: str = "dataset",
    path_in_repo: str | None = None,
    commit_message: str | None = None,
    commit_description: str | None = None,
    private: bool | None = None,
    token: str | bool | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    dataset_card: bool = True,
    card_kwargs: dict[str, Any] | None = None,
    endpoint: str | None = None,
):
    r"""
    Share a corpus and its FAISS index (a [`RealmRetriever`]) as a Hub repo, a dataset repo by default, so that
    several models can use one index. Point a model at it with [`set_retriever_reference`].

    Args:
        retriever ([`RealmRetriever`]): Corpus + index to push (`retriever.save_pretrained` writes the files).
        repo_id (`str`): Target repo (created if needed).
        repo_type (`str`, *optional*, defaults to `"dataset"`): Repo type.
        path_in_repo (`str`, *optional*): Folder in the repo (root by default); give the same as `subfolder` to
            [`set_retriever_reference`].
        dataset_card (`bool`, *optional*, defaults to `True`): Write a README (dataset card) describing the corpus,
            keeping the hand-written parts of an existing one.
        card_kwargs (`dict`, *optional*): Passed to [`~realm_hf.hub.cards.generate_corpus_card`].
        commit_message, commit_description, private, token, revision, create_pr, endpoint: As in [`push_to_hub`].

    Returns:
        `huggingface_hub.CommitInfo` of the upload.
    """

    api = HfApi(endpoint=endpoint, token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True, repo_type=repo_type).repo_id
    if revision is not None and not revision.startswith("refs/pr"):
        api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type=repo_type)
    path_in_repo = (path_in_repo or "").strip("/")
    with tempfile.TemporaryDirectory() as tmp_dir:
        retriever_dir = os.path.join(tmp_dir, path_in_repo) if path_in_repo else tmp_dir
        retriever.save_pretrained(retriever_dir, corpus_format="parquet")
        if dataset_card:
            existing = _existing_readme(api, repo_id, repo_type, revision)
            write_corpus_card(
                tmp_dir,
                retriever,
                repo_id=repo_id,
                subfolder=path_in_repo,
                existing_readme=existing,
                **(card_kwargs or {}),
            )
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=tmp_dir,
            repo_type=repo_type,
            commit_message=commit_message or "Upload REALM corpus and index",
            commit_description=commit_description,
            revision=revision,
            create_pr=create_pr,
            # Stale shards of an earlier push must not survive next to the new manifest.
            delete_patterns=[f"{path_in_repo}/*"] if path_in_repo else [f"{CORPUS_DIR}/*", f"{TOKENIZER_DIR}/*"],
        )


__all__ = [
    "REFERENCE_FIELDS",
    "expected_data_files",
    "push_corpus_to_hub",
    "push_to_hub",
    "set_retriever_reference",
]
