"""
What realm-hf's Trainers save and push, without pickle and with realm-hf's model card.

- Checkpoints ([`RealmCheckpointMixin`], every realm-hf Trainer): the arguments, optimizer, scheduler, gradient-scaler
  and RNG states that transformers' `Trainer` writes with `torch.save` (pickle) go to JSON and safetensors files
  instead (their format and the checks on resume: `training/checkpoint_state.py`), are read back on
  `resume_from_checkpoint`, and the pushes made during training (`hub_strategy`) upload none of the pickled files.
- Pushes and the card ([`RealmModelCardMixin`], the Open-QA, pre-training and ICT Trainers): `push_to_hub` uploads the
  corpus as Parquet, and `create_model_card` writes realm-hf's card, not transformers' draft, for every recipe.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from ..constants import CORPUS_DIR, RETRIEVER_SUBFOLDER
from ..io.atomic import atomic_write_text
from ..io.staged_saves import staged_save
from ..logging_utils import get_logger
from ..models.initialization import hub_id_or_none
from ..models.modeling_base import RealmPreTrainedModel
from .checkpoint_state import (
    OPTIMIZER_STATE,
    RNG_STATE,
    SCALER_STATE,
    SCHEDULER_STATE,
    STATE_SUFFIX,
    check_optimizer_state,
    has_any,
    last_whole_checkpoint,
    load_state,
    rng_states,
    save_state,
    set_rng_states,
    torn_checkpoint_problem,
)

__all__ = [
    "PICKLED_TRAINING_ARGS",
    "RealmCheckpointMixin",
    "TRAINING_ARGS_JSON",
    "hide_background_corpus_warnings",
    "save_training_args_json",
    "RealmModelCardMixin",
    "hub_base_model",
    "last_evaluation",
    "training_results",
]


#: The training arguments a realm-hf Trainer saves beside the model, as JSON: what transformers' Trainer pickles into
#: `training_args.bin` would be pickle in every folder it saves and every repo it pushes.
TRAINING_ARGS_JSON = "training_args.json"
PICKLED_TRAINING_ARGS = "training_args.bin"
# What a Trainer writes into a checkpoint beside the model's own save: not copied into `output_dir` by a push.
_TRAINER_STATE_FILES = ("trainer_state.json", TRAINING_ARGS_JSON)
_TRAINER_STATE_PREFIXES = (OPTIMIZER_STATE, SCHEDULER_STATE, SCALER_STATE, RNG_STATE)


def save_training_args_json(args, output_dir: str) -> str:
    """Write `args` (`TrainingArguments`) as `training_args.json` in `output_dir` (atomically) and remove a pickled
    `training_args.bin` there; returns the JSON file's path."""
    path = os.path.join(output_dir, TRAINING_ARGS_JSON)
    atomic_write_text(path, args.to_json_string())
    pickled = os.path.join(output_dir, PICKLED_TRAINING_ARGS)
    if os.path.isfile(pickled):
        os.remove(pickled)
    return path


logger = get_logger(__name__)

# huggingface_hub's warning for an Arrow/Parquet file committed to a model repo, for the files of a REALM corpus
# (`retriever/corpus/`, in the repo or under a pushed checkpoint's folder).
_CORPUS_DATA_FILE_WARNING = r"It seems that you are about to commit a data file \([^)]*" + re.escape(
    f"{RETRIEVER_SUBFOLDER}/{CORPUS_DIR}/"
)


def hide_background_corpus_warnings() -> None:
    """
    Hide huggingface_hub's "about to commit a data file" warning for the corpus files of a REALM model repo
    (`retriever/corpus/...` only) in uploads that run in the background: `trainer.push_to_hub(blocking=False)` and the
    pushes of `hub_strategy`. Those commits run in huggingface_hub's worker thread after the push call has returned,
    where a `warnings.catch_warnings` block of the caller (not thread-safe either) no longer applies, so a filter
    matching only that path is installed once; the repo holds its corpus on purpose (docs/hub.md).
    """
    if any(f[0] == "ignore" and getattr(f[1], "pattern", None) == _CORPUS_DATA_FILE_WARNING for f in warnings.filters):
        return
    warnings.filterwarnings("ignore", message=_CORPUS_DATA_FILE_WARNING, category=UserWarning)
    logger.info(
        "Corpus data files (Arrow/Parquet under %s/%s/) go to a model repository on purpose: a REALM model repo holds "
        "its corpus and index, so huggingface_hub's 'about to commit a data file' warning is hidden for them.",
        RETRIEVER_SUBFOLDER,
        CORPUS_DIR,
    )


def _is_trainer_state(name: str) -> bool:
    # Hidden entries too: realm-hf's save journal and staging folders belong to the folder, not to the model.
    return (
        name.startswith(".")
        or name in _TRAINER_STATE_FILES
        or (name.startswith(_TRAINER_STATE_PREFIXES) and name.endswith(STATE_SUFFIX))
    )


class RealmCheckpointMixin:
    """
    Gives a [`~transformers.Trainer`] subclass checkpoints and Hub pushes without pickle.

    transformers' Trainer writes `training_args.bin`, `optimizer.pt`, `scheduler.pt`, `scaler.pt` and `rng_state.pth`
    with `torch.save`, and uploads them with `hub_strategy="checkpoint"` / `"all_checkpoints"` (the arguments with
    every push). With this mixin the arguments go to `training_args.json` and each state to a safetensors file
    (`optimizer.safetensors`, ...; see [`save_state`]), which `resume_from_checkpoint` reads back (a checkpoint in
    transformers' format still resumes through transformers' code). DeepSpeed, FSDP, XLA and SageMaker keep their own
    checkpoint formats.
    """

    def _plain_checkpoints(self) -> bool:
        # The engines that write their own optimizer checkpoints are left to transformers.
        from transformers.utils import is_sagemaker_mp_enabled, is_torch_xla_available  # local: optional probes

        return not (
            self.is_deepspeed_enabled or self.is_fsdp_enabled or is_torch_xla_available() or is_sagemaker_mp_enabled()
        )

    def _issue_warnings_after_load(self, load_result) -> None:
        # A checkpoint holds a tied weight once (safetensors), so a resumed model misses its tied copies (the heads'
        # `decoder.bias`), and transformers warned of "missing keys" that are not: tie them, warn about the rest.
        model = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        tied = tuple(getattr(model, "all_tied_weights_keys", None) or ())
        missing = [key for key in load_result.missing_keys if not any(key == t or key.endswith("." + t) for t in tied)]
        if len(missing) < len(load_result.missing_keys):
            self.model.tie_weights()
        return super()._issue_warnings_after_load(
            SimpleNamespace(missing_keys=missing, unexpected_keys=list(load_result.unexpected_keys))
        )

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        # As the Trainer's, but the arguments go to `training_args.json` (`TrainingArguments.to_json_string`) in place
        # of the pickled `training_args.bin`.
        super()._save(output_dir, state_dict)
        if self.args.should_save:
            save_training_args_json(self.args, output_dir if output_dir is not None else self.args.output_dir)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        if not self._plain_checkpoints():
            return super()._save_optimizer_and_scheduler(output_dir)
        if self.args.should_save:
            save_state(self.optimizer.state_dict(), os.path.join(output_dir, OPTIMIZER_STATE + STATE_SUFFIX))
            save_state(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_STATE + STATE_SUFFIX))

    def _save_scaler(self, output_dir: str) -> None:
        scaler = getattr(self.accelerator, "scaler", None)
        if scaler is None or not self._plain_checkpoints():
            return super()._save_scaler(output_dir)
        if self.args.should_save:
            save_state(scaler.state_dict(), os.path.join(output_dir, SCALER_STATE + STATE_SUFFIX))

    def _rng_state_path(self, folder: str) -> str:
        name = RNG_STATE if self.args.world_size <= 1 else f"{RNG_STATE}_{self.args.process_index}"
        return os.path.join(folder, name + STATE_SUFFIX)

    def _save_rng_state(self, output_dir: str) -> None:
        if not self._plain_checkpoints():
            return super()._save_rng_state(output_dir)
        # A process can get here before process 0 has created the checkpoint folder (as in transformers).
        os.makedirs(output_dir, exist_ok=True)
        save_state(rng_states(), self._rng_state_path(output_dir))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        optimizer = os.path.join(checkpoint, OPTIMIZER_STATE + STATE_SUFFIX) if checkpoint else None
        if checkpoint is None or not self._plain_checkpoints():
            return super()._load_optimizer_and_scheduler(checkpoint)
        if not os.path.isfile(optimizer):
            if has_any(checkpoint, ("optimizer.pt", "optimizer.bin")):
                return super()._load_optimizer_and_scheduler(checkpoint)  # transformers' own format
            self._missing_optimizer_state(checkpoint)
        else:
            # As transformers: the CPU when training on one device, each process's device in distributed training.
            device = self.args.device if self.args.world_size > 1 and self.args.device.type != "cpu" else "cpu"
            state = load_state(optimizer, device)
            check_optimizer_state(self.optimizer, state, optimizer)
            self.optimizer.load_state_dict(state)
        scheduler = os.path.join(checkpoint, SCHEDULER_STATE + STATE_SUFFIX)
        if os.path.isfile(scheduler):
            try:
                self.lr_scheduler.load_state_dict(load_state(scheduler))
            except (KeyError, TypeError, AttributeError) as err:
                raise ValueError(
                    f"{scheduler} does not hold the state of this run's learning-rate scheduler ({type(err).__name__}: "
                    f"{err}): resume from a checkpoint of this run, or delete the file to restart the schedule."
                ) from None

    def _missing_optimizer_state(self, checkpoint: str) -> None:
        # A fresh optimizer (zero moments, the schedule restarted) would resume silently into another run.
        if self.args.save_only_model:
            logger.warning(
                "%s holds no optimizer state (it was saved with save_only_model=True): training resumes with a fresh "
                "optimizer (its moments at zero), so it will not continue the interrupted run exactly.",
                checkpoint,
            )
            return
        raise ValueError(
            f"{checkpoint} holds no optimizer state ({OPTIMIZER_STATE + STATE_SUFFIX} or optimizer.pt): the checkpoint "
            "is incomplete (a save killed before it was written, or a file deleted). Resume from an earlier "
            "checkpoint; to go on with a fresh optimizer on purpose, load the weights with `from_pretrained` and start "
            "a new run (or set save_only_model=True, which resumes with a fresh optimizer and says so)."
        )

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        """
        transformers' `train`, resuming only from a whole checkpoint: with `resume_from_checkpoint=True` the last
        checkpoint in `output_dir` that a kill did not tear (one without `trainer_state.json`, the file a checkpoint
        save writes last, is skipped with a warning naming it); a named checkpoint that is torn is refused with what
        it lacks. The re-index callbacks are told which checkpoint is resumed (its index is restored, not the one of
        `output_dir/checkpoint-<step>`).
        """
        if resume_from_checkpoint is True:
            resume_from_checkpoint = last_whole_checkpoint(self.args.output_dir)
        elif isinstance(resume_from_checkpoint, (str, os.PathLike)):
            resume_from_checkpoint = os.fspath(resume_from_checkpoint)
            problem = torn_checkpoint_problem(resume_from_checkpoint)
            if problem:
                raise ValueError(f"Cannot resume from {resume_from_checkpoint}: {problem}")
        if isinstance(resume_from_checkpoint, str):
            from .callbacks import RealmReindexCallback  # local: the callbacks import the models' embedders

            for callback in self.callback_handler.callbacks:
                if isinstance(callback, RealmReindexCallback):
                    callback.resume_from(resume_from_checkpoint)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        from safetensors import SafetensorError  # local: as safetensors.torch above, the error type only

        try:
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        except (SafetensorError, KeyError, EOFError, RuntimeError) as err:
            detail = str(err).splitlines()[0] if str(err) else ""
            raise ValueError(
                f"The weights in {resume_from_checkpoint} cannot be read ({type(err).__name__}: {detail}): a weights "
                "file (model.safetensors or pytorch_model.bin) is truncated or damaged. Resume from an earlier "
                "checkpoint, or delete this one."
            ) from err

    def _load_scaler(self, checkpoint: str | None) -> None:
        path = os.path.join(checkpoint, SCALER_STATE + STATE_SUFFIX) if checkpoint else None
        if path is None or not os.path.isfile(path) or getattr(self.accelerator, "scaler", None) is None:
            return super()._load_scaler(checkpoint)
        self.accelerator.scaler.load_state_dict(load_state(path))

    def _load_rng_state(self, checkpoint: str | None) -> None:
        path = self._rng_state_path(checkpoint) if checkpoint else None
        if path is None or not os.path.isfile(path):
            return super()._load_rng_state(checkpoint)
        set_rng_states(load_state(path), path)

    def _refresh_push_folder(self, checkpoint_folder: str, output_dir: str) -> None:
        """Put the checkpoint's whole model save (every entry but the training state) into `output_dir`, at once."""
        with staged_save(output_dir) as save:
            names = sorted(name for name in os.listdir(checkpoint_folder) if not _is_trainer_state(name))
            for name in names:
                source, target = os.path.join(checkpoint_folder, name), os.path.join(save.staging, name)
                if os.path.isdir(source):
                    shutil.copytree(source, target)
                else:
                    shutil.copy2(source, target)
            save.replace = names

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """
        As transformers' `_push_from_checkpoint` (upload `output_dir` with the checkpoint's model, and the checkpoint
        folder itself for `hub_strategy="checkpoint"` / `"all_checkpoints"`), with the arguments as JSON, not pickle.
        The checkpoint's whole model save (weights, config, tokenizer, and a REALM model's `retriever/`, whose
        manifest is bound to those weights) replaces the one in `output_dir`, all at once; transformers copies the
        weights and config only, which would leave a retriever saved for other weights beside them.
        """
        # Local imports: the Trainer's Hub helpers (its `hf_api`, looked up at call time as the Trainer does).
        import transformers.trainer as trainer_module
        from transformers.trainer_utils import HubStrategy, SaveStrategy

        if not self.is_world_process_zero() or self.args.hub_strategy == HubStrategy.END:
            return
        # If the last push has not finished, skip this one unless args.hub_always_push (as transformers).
        if not self.args.hub_always_push and self.push_in_progress is not None and not self.push_in_progress.is_done():
            return
        self.callback_handler.on_push_begin(self.args, self.state, self.control)
        hide_background_corpus_warnings()
        output_dir = self.args.output_dir
        self._refresh_push_folder(checkpoint_folder, output_dir)
        save_training_args_json(self.args, output_dir)
        if self.args.save_strategy == SaveStrategy.STEPS:
            commit_message = f"Training in progress, step {self.state.global_step}"
        else:
            commit_message = f"Training in progress, epoch {int(self.state.epoch)}"
        api = trainer_module.hf_api()
        push_jobs = [
            api.upload_folder(
                repo_id=self.hub_model_id,
                folder_path=output_dir,
                commit_message=commit_message,
                token=self.args.hub_token,
                run_as_future=True,
                # As transformers, plus a save being staged while this upload runs in the background.
                ignore_patterns=["_*", f"{trainer_module.PREFIX_CHECKPOINT_DIR}-*", ".realm-hf-*"],
                # A re-saved corpus may have other shard names: no old ones left beside the new manifest.
                delete_patterns=[f"{RETRIEVER_SUBFOLDER}/*"],
                revision=self.args.hub_revision,
            )
        ]
        if self.args.hub_strategy in (HubStrategy.CHECKPOINT, HubStrategy.ALL_CHECKPOINTS):
            in_repo = "last-checkpoint" if self.args.hub_strategy == HubStrategy.CHECKPOINT else checkpoint_folder
            push_jobs.append(
                api.upload_folder(
                    repo_id=self.hub_model_id,
                    folder_path=checkpoint_folder,
                    path_in_repo=os.path.basename(in_repo),
                    commit_message=commit_message + ", checkpoint",
                    token=self.args.hub_token,
                    run_as_future=True,
                    delete_patterns=[f"{RETRIEVER_SUBFOLDER}/*"],
                    revision=self.args.hub_revision,
                )
            )
        if self.push_in_progress is None or self.push_in_progress.is_done():
            self.push_in_progress = trainer_module.PushInProgress(push_jobs)
        else:
            self.push_in_progress.jobs.extend(push_jobs)


class RealmModelCardMixin(RealmCheckpointMixin):
    """
    Gives a [`~transformers.Trainer`] subclass realm-hf's `create_model_card`, which `push_to_hub()` calls, and
    checkpoints and pushes without pickle ([`RealmCheckpointMixin`]).

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
        from ..hub.repositories import expected_data_files  # local import: hub code is needed only when pushing

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
        from the model); other keyword arguments go to [`~realm_hf.hub.cards.generate_model_card`], among them
        `eval_dataset` (`{"name", "type", "split"}`), which names the evaluation set with its split and wins over
        `dataset_tags` / `dataset`.
        """
        if not self.is_world_process_zero():
            return
        # Local imports: the card code is needed only when a card is written.
        from ..hub.card_content import as_list
        from ..hub.cards import write_model_card

        dataset_tags, names, configs = (as_list(value) for value in (dataset_tags, dataset, dataset_args))
        eval_dataset = card_kwargs.pop("eval_dataset", None)  # {"name", "type", "split"}: the held-out set, in full
        if eval_dataset is None and (dataset_tags or names):
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
    if not isinstance(name, str) or name == own_repo:
        return None
    return hub_id_or_none(name)
