"""
The model card of realm-hf's Trainers: `create_model_card` (hence `push_to_hub`) writes realm-hf's card, not
transformers' draft, for every recipe (Open-QA, REALM pre-training, the ICT warm start).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from huggingface_hub.utils import HFValidationError, validate_repo_id

from ..models.modeling_base import RealmPreTrainedModel
from ..training.checkpoint_state import (
    TRAINING_ARGS_JSON,
    RealmCheckpointMixin,
    hide_background_corpus_warnings,
    save_training_args_json,
)


class RealmModelCardMixin(RealmCheckpointMixin):
    """
    Gives a [`~transformers.Trainer`] subclass realm-hf's `create_model_card`, which `push_to_hub()` calls, and
    checkpoints and pushes without pickle ([`~realm_hf.training.checkpoint_state.RealmCheckpointMixin`]).

    A Trainer using it may override [`~RealmModelCardMixin.model_card_setup`] to list its recipe (masking, negatives,
    ...) with the training settings.
    """

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        # The arguments are JSON (RealmCheckpointMixin._save); a push uploads the corpus as Parquet.
        super()._save(output_dir, state_dict)
        if not self.args.should_save:
            return
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        model = self.accelerator.unwrap_model(self.model)
        if getattr(self, "_pushing_to_hub", False) and getattr(model, "retriever", None) is not None:
            # What `push_to_hub` uploads: the corpus as Parquet shards, as `model.push_to_hub` writes it (the
            # Trainer's save wrote Arrow). One more save, weights and retriever together, so the manifest binds them.
            if isinstance(model, RealmPreTrainedModel) and not (
                model.retriever is not None and model.retriever.collective
            ):
                model.save_pretrained(output_dir, corpus_format="parquet", model_card=False)

    def _refresh_push_folder(self, checkpoint_folder: str, output_dir: str) -> None:
        # A push during training (`hub_strategy`) uploads the corpus as Parquet too, so that the pushes and the final
        # `push_to_hub` write the same files. The model is the checkpoint's: the push follows its save at once.
        model = self.accelerator.unwrap_model(self.model)
        if not isinstance(model, RealmPreTrainedModel) or getattr(model, "retriever", None) is None:
            return super()._refresh_push_folder(checkpoint_folder, output_dir)
        if model.retriever is not None and model.retriever.collective:
            return super()._refresh_push_folder(checkpoint_folder, output_dir)
        model.save_pretrained(output_dir, corpus_format="parquet", model_card=False)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(output_dir)

    def push_to_hub(self, *args, **kwargs):
        """
        As [`~transformers.Trainer.push_to_hub`], with the corpus uploaded as Parquet shards (as `model.push_to_hub`
        does), the training arguments as JSON, and without huggingface_hub's warning for each corpus file.
        """
        from .repositories import expected_data_files  # local import: hub code is needed only when pushing

        blocking = kwargs.get("blocking", args[1] if len(args) > 1 else True)
        if not blocking:  # the commit runs after this call returns, outside `expected_data_files`
            hide_background_corpus_warnings()
        self._pushing_to_hub = True
        try:
            with expected_data_files():
                return super().push_to_hub(*args, **kwargs)
        finally:
            self._pushing_to_hub = False

    def model_card_setup(self) -> dict[str, Any] | None:
        """The recipe of this Trainer as `{label: value}` rows of the card's Training section, or `None`."""
        return None

    def create_model_card(
        self,
        language: str | None = None,
        license: str | None = None,
        tags: str | list[str] | None = None,
        model_name: str | None = None,
        finetuned_from: str | None = None,
        tasks: str | list[str] | None = None,
        dataset_tags: str | list[str] | None = None,
        dataset: str | list[str] | None = None,
        dataset_args: str | list[str] | None = None,
        **card_kwargs,
    ) -> None:
        r"""
        Write realm-hf's model card (not transformers' draft card) as `README.md` in `args.output_dir`; called by
        `push_to_hub()`. Hand-written text of the README there is kept.

        The card describes the model the Trainer trains (Open-QA, REALM pre-training or the ICT warm start, from the
        model's class) and carries the training arguments, the Trainer's recipe ([`model_card_setup`]), its training
        loss and the last evaluation it logged (`eval_exact_match`, `eval_f1`, `eval_recall@k` for Open-QA; the
        masked-LM or ICT `eval_loss` and any other `eval_` metric for the others). Its evaluation results become
        `model-index` entries when the evaluation set is named: `dataset_tags` (Hub dataset ids, also written as the
        card's `datasets`), `dataset` (display names) and `dataset_args` (configs), as in
        [`~transformers.Trainer.create_model_card`]; without a name they are listed in the card only. `license` and
        `language` are written only when given; `finetuned_from` defaults, as in transformers, to the Hub repo the
        model was loaded from (none for a local directory). `tasks` is accepted for compatibility (the task comes
        from the model); other keyword arguments go to [`~realm_hf.hub.cards.generate_model_card`].
        """
        if not self.is_world_process_zero():
            return
        # Local imports: the card code is needed only when a card is written.
        from .card_content import as_list
        from .cards import write_model_card

        dataset_tags, names, configs = (as_list(value) for value in (dataset_tags, dataset, dataset_args))
        eval_dataset = None
        if dataset_tags or names:
            eval_dataset = {"type": (dataset_tags or names)[0], "name": (names or dataset_tags)[0]}
            if configs:
                eval_dataset["config"] = configs[0]
        model = self.accelerator.unwrap_model(self.model)
        if finetuned_from is None:
            finetuned_from = hub_base_model(model, self.hub_model_id)
        write_model_card(
            self.args.output_dir,
            model=model,
            retriever=getattr(model, "retriever", None),
            eval_results=last_evaluation(self.state.log_history),
            eval_dataset=eval_dataset,
            training_args=self.args,
            base_model=finetuned_from,
            datasets=dataset_tags or None,
            model_id=self.hub_model_id,
            model_name=model_name,
            license=license,
            language=language,
            tags=as_list(tags),
            training_setup=self.model_card_setup(),
            training_results=training_results(self.state.log_history),
            **card_kwargs,
        )


def last_evaluation(log_history: Sequence[dict]) -> dict[str, float] | None:
    """The metrics (`eval_...` keys) of the last evaluation in a Trainer's `state.log_history`, or `None`."""
    for entry in reversed(log_history):
        metrics = {key: value for key, value in entry.items() if key.startswith("eval_")}
        if metrics:
            return metrics
    return None


def training_results(log_history: Sequence[dict]) -> dict[str, Any] | None:
    """
    What a Trainer's `state.log_history` says about its training run, as card rows: the mean training loss of the run
    and its steps (from the entry `train()` logs at the end), and the last logged training loss; `None` before any.
    """
    results: dict[str, Any] = {}
    summary = next((entry for entry in reversed(log_history) if "train_loss" in entry), None)
    if summary is not None:
        results["Training loss (mean over the run)"] = float(summary["train_loss"])
    last = next((entry for entry in reversed(log_history) if "loss" in entry), None)
    if last is not None:
        results["Last logged training loss"] = float(last["loss"])
    if summary is not None and summary.get("step") is not None:
        results["Steps"] = int(summary["step"])
    return results or None


def hub_base_model(model, own_repo: str | None = None) -> str | None:
    """
    The Hub repo the model was loaded from (its config's `_name_or_path`), as transformers' Trainer card names its
    base model; `None` for a local directory, a fresh model, or the repo being pushed to.
    """
    name = getattr(getattr(model, "config", None), "_name_or_path", None)
    # A namespaced id only ("org/name"): a bare name is more often a relative path that no longer exists.
    if not isinstance(name, str) or name.count("/") != 1 or os.path.exists(name) or name == own_repo:
        return None
    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    return name


def data_columns(dataset) -> set[str]:
    """The columns (keys) of a Trainer dataset: a `datasets` dataset's columns, or the keys of a list's first dict."""
    columns = getattr(dataset, "column_names", None)
    if columns is not None:
        return set(columns)
    try:
        first = dataset[0]
    except (TypeError, IndexError, KeyError):
        return set()
    return set(first) if isinstance(first, dict) else set()


__all__ = [
    "TRAINING_ARGS_JSON",
    "RealmModelCardMixin",
    "save_training_args_json",
    "data_columns",
    "hub_base_model",
    "last_evaluation",
    "training_results",
]
