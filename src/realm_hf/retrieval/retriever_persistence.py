"""Saving and loading a RealmRetriever: `save_pretrained`, `from_pretrained`, `from_legacy` and the manifest."""

from __future__ import annotations

import os
from typing import Self

import torch

from . import building
from .serialization import build_manifest, save_retriever


class RealmRetrieverPersistenceMixin:
    """The saving and loading half of [`RealmRetriever`]'s public API (a mixin; see [`RealmRetriever`])."""

    # ---------------------------------------------------------------------------------------------------------------
    # Saving and loading
    # ---------------------------------------------------------------------------------------------------------------

    def manifest(self) -> dict:
        """The manifest `save_pretrained` writes (without file sizes)."""
        return build_manifest(self)

    def save_pretrained(
        self, save_directory: str | os.PathLike, corpus_format: str = "arrow", max_shard_size: str | int = "500MB"
    ) -> None:
        """
        Save the corpus, index, tokenizer and manifest into `save_directory` (see the module docstring for the
        layout). Only the retriever's own entries (`corpus/`, `index.faiss`, `tokenizer/`, `retriever_manifest.json`)
        are touched, so a model's files in the same directory are kept.

        The save is all-or-nothing, even if the process is killed: everything is first written (and flushed to
        disk) in a temporary folder inside `save_directory`, then swapped in under a journal, so the directory holds
        exactly the previous save or exactly this one; an interrupted swap is completed by the next load or save
        (see [`realm_hf.file_utils.staged_save`]). The manifest records the size and sha256 of every file, checked
        on load.

        Args:
            save_directory (`str` or `os.PathLike`): Target directory (created if needed).
            corpus_format (`str`, defaults to `"arrow"`): `"arrow"` (`Dataset.save_to_disk`: memory-mapped on load,
                the choice for large corpora) or `"parquet"` (`corpus/data-XXXXX-of-XXXXX.parquet` shards, compact
                and readable by any Parquet tool, for sharing on the Hub; converted to a memory-mapped Arrow cache on
                load).
            max_shard_size (`str` or `int`, defaults to `"500MB"`): Maximum size of a corpus shard.
        """
        save_retriever(self, save_directory, corpus_format, max_shard_size)

    @classmethod
    def from_pretrained(
        cls,
        pretrained_path_or_repo_id: str | os.PathLike,
        revision: str | None = None,
        embedder: torch.nn.Module | None = None,
        expected_dim: int | None = None,
        expected_num_blocks: int | None = None,
        mmap: bool = True,
        use_gpu: bool = False,
        subfolder: str | None = None,
        repo_type: str | None = None,
        cache_dir: str | None = None,
        token: str | bool | None = None,
        verify_checksums: bool = True,
    ) -> Self:
        """
        Load a retriever saved with [`~RealmRetriever.save_pretrained`] from a local directory or a Hub repository.

        The manifest is checked against the files and the model: a missing/corrupt manifest, index, corpus or
        tokenizer, a file whose size or sha256 differs from the one recorded at save time, a path leading outside
        the directory, or a dimension/block-count mismatch raises an error that says what is wrong and how to fix
        it; an embedder whose weights differ from the corpus's (a stale index) gives a warning.

        Args:
            pretrained_path_or_repo_id (`str` or `os.PathLike`): Local directory, or a Hub repo id (model or dataset
                repo; downloaded with `huggingface_hub.snapshot_download`, which honours `HF_HUB_OFFLINE`).
            revision (`str`, *optional*): Hub revision.
            embedder (`torch.nn.Module`, *optional*): The model's embedder: its projection size
                (`config.retriever_proj_size`) must match the index; a different weight fingerprint warns.
            expected_dim (`int`, *optional*): Required embedding dimension.
            expected_num_blocks (`int`, *optional*): Required number of blocks.
            mmap (`bool`, defaults to `True`): Memory-map the Arrow corpus and the index's flat codes instead of
                reading them into RAM (a 13M-block corpus then costs page cache, not process memory). IVF lists are
                always read into RAM.
            use_gpu (`bool`, defaults to `False`): Move the index to GPU (see [`~RealmRetriever.to_gpu`]).
            subfolder (`str`, *optional*): Folder inside the directory/repo (e.g. `"retriever"`).
            repo_type (`str`, *optional*): `"model"` or `"dataset"`; both are tried when not given.
            cache_dir, token: Passed to `snapshot_download`.
            verify_checksums (`bool`, defaults to `True`): Hash every file of the directory and compare it with the
                sha256 the manifest recorded (streaming, about 1 s per GB on a 2-core AMD EPYC with SHA extensions,
                files in the page cache). `False` checks only the file sizes: for trusted local files, when loading
                time matters. Manifests of older saves record no checksums and are not verified.
        """
        retriever = building.load_pretrained(
            cls,
            pretrained_path_or_repo_id,
            revision,
            embedder,
            expected_dim,
            expected_num_blocks,
            mmap,
            subfolder,
            repo_type,
            cache_dir,
            token,
            verify_checksums,
        )
        # Checked here, so that a stale-index warning names the caller of `from_pretrained`.
        if embedder is not None:
            retriever.check_embedder(embedder)
        if use_gpu:
            retriever.to_gpu()
        return retriever

    @classmethod
    def from_legacy(
        cls,
        legacy_dir: str | os.PathLike,
        tokenizer=None,
        block_emb=None,
        allow_pickle: bool = False,
        index: str = "Flat",
        embedder: torch.nn.Module | None = None,
        train_size: int | None = None,
        use_gpu: bool = False,
    ) -> Self:
        """
        Build a retriever from a legacy `RealmForOpenQA` checkpoint directory (e.g. google/realm-orqa-nq-openqa):
        block texts from `block_records.npy`, block embeddings from the `block_emb` buffer in its weights.

        Block ids are the legacy row indices and the embeddings are the exact legacy vectors, so with `index="Flat"`
        search returns what the legacy brute-force einsum + topk returned. Titles are empty (legacy blocks had none).

        `block_records.npy` is a *pickled* numpy object array: unpickling runs code from the file. It is refused
        unless `allow_pickle=True` or the environment sets `REALM_HF_ALLOW_PICKLE=1`; convert once
        ([`convert_legacy_checkpoint`]) and share the converted, pickle-free retriever instead.

        Args:
            legacy_dir (`str`): The checkpoint directory.
            tokenizer (*optional*): Its tokenizer (loaded from `legacy_dir` with `AutoTokenizer` if not given).
            block_emb (`torch.Tensor` or `np.ndarray`, *optional*): The `[num_block_records, dim]` embeddings, if
                already loaded; otherwise read from `model.safetensors` or `pytorch_model.bin` (`weights_only=True`,
                memory-mapped).
            allow_pickle (`bool`, defaults to `False`): Allow unpickling `block_records.npy` (only for trusted files).
            index (`str`, defaults to `"Flat"`): FAISS factory string (Flat reproduces the legacy exact search).
            embedder (*optional*): The checkpoint's embedder, to record its fingerprint in the manifest.
        """
        return building.from_legacy(
            cls, legacy_dir, tokenizer, block_emb, allow_pickle, index, embedder, train_size, use_gpu
        )
