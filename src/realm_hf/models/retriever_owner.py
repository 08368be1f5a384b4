"""
[`RetrieverOwnerMixin`]: the capability of a REALM model that owns a retriever (a corpus and its index, outside the
weights): attaching it, requiring it, and loading, saving and pushing it with the weights. `RealmForOpenQA` and
`RealmForPreTraining` share it, so both load their corpus the same way, from a local directory or a Hub repo.
"""

from __future__ import annotations

from ..io.consistent_reads import consistent_read
from ..logging_utils import get_logger
from .retriever_loading import HUB_KWARGS, check_retriever_dim, load_checkpoint_retriever

logger = get_logger(__name__)


class RetrieverOwnerMixin:
    r"""
    A model that owns a retriever, as transformers' `PushToHubMixin` is a model that can be pushed: mixed in before
    [`RealmPreTrainedModel`], whose all-or-nothing `_save_directory` and `_card_writer` it needs, with a `config`.

    It owns two attributes: `retriever` (the attached corpus and index, or `None`) and `legacy_block_emb` (the block
    embeddings of a legacy checkpoint whose block texts were not unpickled, or `None`).

    - [`~RetrieverOwnerMixin.set_retriever`] attaches a retriever (its embedding size must match the model's);
      [`~RetrieverOwnerMixin.require_retriever`] returns it or says how to attach one.
    - [`~RetrieverOwnerMixin.from_pretrained`] loads the weights and the corpus saved with them, wherever they are
      (a local `retriever/` folder, a Hub repo's, a legacy `block_emb`, the corpus repo the config references: see
      [`realm_hf.models.retriever_loading.load_checkpoint_retriever`]).
    - [`~RetrieverOwnerMixin.save_pretrained`] saves weights and corpus in one all-or-nothing swap;
      [`~RetrieverOwnerMixin.push_to_hub`] uploads both with realm-hf's model card.
    """

    retriever = None
    legacy_block_emb = None

    def set_retriever(self, retriever) -> None:
        """Attach (or replace, or with `None` detach) the knowledge corpus this model retrieves from; its embedding
        size must be `config.retriever_proj_size`. The model's question embedder becomes the retriever's
        `question_embedder`, so `retriever.search("question text")` retrieves as the model does."""
        check_retriever_dim(retriever, self.config)
        self.retriever = retriever
        if retriever is not None and getattr(self, "query_embedder", None) is not None:
            retriever.question_embedder = self.query_embedder

    def require_retriever(self):
        """
        The attached retriever; raises a `ValueError` that says how to attach one (or, for a legacy checkpoint, how
        to convert it) when there is none.
        """
        if self.retriever is None:
            hint = ""
            if self.legacy_block_emb is not None:
                hint = (
                    " This is a legacy checkpoint: its block embeddings were found, but its block texts are in a pickled"
                    " `block_records.npy`. Convert it once with `realm-hf convert <legacy_dir> <output_dir>` (or load"
                    " with `allow_pickle=True` if you trust the file)."
                )
            name = type(self).__name__
            raise ValueError(
                f"{name} has no retriever: build a corpus with `RealmRetriever.from_documents(...)` and pass it with "
                f"`model.set_retriever(retriever)` or `{name}.from_pretrained(..., retriever=retriever)`." + hint
            )
        return self.retriever

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path,
        *model_args,
        retriever=None,
        load_retriever: bool = True,
        allow_pickle: bool = False,
        verify_checksums: bool = True,
        **kwargs,
    ):
        r"""
        Load the model and, unless `retriever` is given or `load_retriever=False`, the knowledge corpus saved with it:
        from a local directory or a Hub repo id alike (see [`realm_hf.models.retriever_loading.load_checkpoint_retriever`]).

        Besides the usual [`~transformers.PreTrainedModel.from_pretrained`] arguments:

        Args:
            retriever ([`RealmRetriever`], *optional*):
                Corpus to attach instead of the one found with the checkpoint.
            load_retriever (`bool`, *optional*, defaults to `True`):
                Load the saved corpus and index. `False` loads the weights alone (nothing is read, downloaded or
                unpickled for the corpus; `model.retriever` is `None` unless `retriever` is given), e.g. to re-embed
                a corpus, convert weights, or answer from given contexts only.
            allow_pickle (`bool`, *optional*, defaults to `False`):
                For legacy checkpoints only: allow unpickling their `block_records.npy` (only for files you trust).
                Prefer converting once with `realm-hf convert`.
            verify_checksums (`bool`, *optional*, defaults to `True`):
                Compare the sha256 of the corpus, index, tokenizer and weight files with those recorded at save time
                (about 1 s per GB, see [`RealmRetriever.from_pretrained`]); `False` compares sizes only, for trusted
                local files.

        A local directory whose save was interrupted while its files were being swapped in is completed first (see
        [`~RetrieverOwnerMixin.save_pretrained`]); weights and retriever from two different saves are refused.
        """
        # One save: no save into the directory swaps files in between the weights and the retriever being read.
        with consistent_read(pretrained_model_name_or_path, kwargs.get("subfolder")):
            loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
            model = loaded[0] if isinstance(loaded, tuple) else loaded  # output_loading_info=True gives (model, info)
            if retriever is None and load_retriever:
                found = load_checkpoint_retriever(
                    model,
                    pretrained_model_name_or_path,
                    allow_pickle=allow_pickle,
                    verify_checksums=verify_checksums,
                    **{k: v for k, v in kwargs.items() if k in HUB_KWARGS},
                )
                retriever, model.legacy_block_emb = found.retriever, found.legacy_block_emb
        model.set_retriever(retriever)
        return loaded

    def save_pretrained(self, save_directory, *args, save_retriever: bool = True, model_card: bool = True, **kwargs):
        r"""
        Save the weights and config as usual and, when a retriever is attached, the corpus, FAISS index and manifest
        in `save_directory/retriever/`, so that one directory (or Hub repo) holds everything `from_pretrained` needs.

        The save is all-or-nothing, even if the process is killed at any moment: everything is written (and flushed
        to disk) into a temporary folder inside `save_directory` first, then swapped in under a journal, so the
        directory always loads as exactly the previous save or exactly this one (an interrupted swap is completed
        by the next load or save). Only what the save writes is replaced (weights, config, `README.md`,
        `retriever/`, and weight shards of an earlier save it supersedes): your other files in the directory, such
        as a Trainer's `checkpoint-*` folders, are kept. The retriever's manifest records the sha256 of these
        weights, so that weights and index from two different saves are refused at load. `config.num_block_records`
        becomes the attached corpus's size.

        Args:
            save_retriever (`bool`, *optional*, defaults to `True`): Also save the attached retriever. Without it, a
                `retriever/` already in the directory is kept (and now goes with these weights). A retriever sharded
                across processes is never saved here (its save is collective: see docs/sharding.md).
            model_card (`bool`, *optional*, defaults to `True`): Write (or update) the README.md model card; text
                written by hand in an existing card is kept, and transformers' draft Trainer card is replaced.
            tokenizer (*optional*): A tokenizer to save in the same all-or-nothing swap (the pipeline and
                `realm-hf train` pass theirs), so that a crash never leaves weights of one save beside the tokenizer of
                another.
            corpus_format (`str`, *optional*, defaults to `"arrow"`): Format of the saved corpus: `"arrow"`
                (memory-mapped on load) or `"parquet"` (shards any Parquet tool reads; what
                [`~RetrieverOwnerMixin.push_to_hub`] uploads). See [`RealmRetriever.save_pretrained`].
        """
        if hasattr(self.retriever, "__len__"):
            # The attached corpus's size, not the config's default (REALM's 13,353,718 Wikipedia blocks).
            self.config.num_block_records = len(self.retriever)
        retriever = self.retriever if save_retriever else None
        if retriever is not None and retriever.collective:
            # One process saves a model, but every process holds a part of a sharded corpus: its save is collective.
            logger.warning(
                "The model's retriever is sharded across processes: it is not saved with the model. Save it with "
                "`model.retriever.save_pretrained(directory)` on every process (docs/sharding.md)."
            )
            retriever = None
        write_card = self._card_writer(save_directory, retriever) if model_card else None
        self._save_directory(save_directory, args, kwargs, retriever=retriever, write_extra=write_card)

    def push_to_hub(self, repo_id: str, **kwargs):
        r"""
        Push weights, config, tokenizer, the corpus + FAISS index (`retriever/`) and realm-hf's model card to one Hub
        repo, which `from_pretrained(repo_id)` loads back whole. transformers' own `push_to_hub` would replace the card
        with a generic one and cannot upload the nested corpus folder. See [`realm_hf.hub.repositories.push_to_hub`] for the
        arguments (e.g. `tokenizer=`, `private=`, `revision=`, `save_retriever=`).
        """
        from ..hub.repositories import push_to_hub  # local import: the publishing code is needed only to push

        return push_to_hub(self, repo_id, **kwargs)


__all__ = ["RetrieverOwnerMixin"]
