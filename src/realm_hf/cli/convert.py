"""`realm-hf convert`: a legacy `google/realm-*` checkpoint to safetensors weights + Arrow corpus + FAISS index."""

from __future__ import annotations

import json
import os

from ..constants import MANIFEST_NAME, RETRIEVER_SUBFOLDER
from .common import (
    EXIT_OK,
    CLIError,
    architecture_of,
    atomic_output_dir,
    check_output_dir,
    config_of,
    hub_offline,
    info,
    is_hub_id,
    load_tokenizer,
    load_without_retriever,
    logger,
    reading_weights,
)

_PICKLE_REFUSAL = (
    "{records} is a pickled numpy array: loading it runs Python's pickle, which can execute arbitrary code if the "
    "file was tampered with. realm-hf never unpickles by default. If you trust this checkpoint (e.g. an official "
    "google/realm-* download), re-run with --allow-pickle: the output is pickle-free (safetensors weights, "
    "Arrow/Parquet corpus, FAISS index) and safe to share."
)


def _resolve_source(source: str, revision: str | None) -> str:
    if os.path.isdir(source):
        return source
    if not is_hub_id(source):
        raise CLIError(f"Checkpoint {source!r} is not a directory (nor a Hub repo id).")
    if hub_offline():
        raise CLIError(
            f"{source!r} is not a local directory and the Hub cannot be reached (HF_HUB_OFFLINE is set): download "
            "the checkpoint where the Hub is reachable and pass its local directory."
        )
    from huggingface_hub import snapshot_download

    info(f"Downloading {source} from the Hub ...")
    try:
        return snapshot_download(source, revision=revision)
    except Exception as err:  # network errors come in many types (requests, httpx, hub errors)
        raise CLIError(
            f"Cannot download {source!r} from the Hub ({type(err).__name__}: {err}). If the Hub is unreachable from "
            "here, download the checkpoint elsewhere and pass its local directory."
        ) from err


def run(args) -> int:
    from transformers import AutoModel

    source = _resolve_source(args.source, args.revision)
    output = os.path.abspath(args.output)
    if os.path.abspath(source) == output:
        raise CLIError("The output directory must differ from the checkpoint directory.")
    config = config_of(source)
    architecture = architecture_of(config)
    records = os.path.join(source, "block_records.npy")
    has_records = os.path.isfile(records)
    # Refuse before anything is written or loaded.
    if has_records and not args.allow_pickle:
        raise CLIError(_PICKLE_REFUSAL.format(records=records))
    check_output_dir(output, args.overwrite)
    tokenizer = load_tokenizer(source)

    with atomic_output_dir(output, overwrite=args.overwrite) as tmp, reading_weights(source):
        if architecture == "RealmForOpenQA" or has_records:
            from ..models.modeling_openqa import RealmForOpenQA

            if has_records:
                # The conversion proper, streamed: pickled block texts + the `block_emb` buffer -> Arrow corpus + FAISS
                # index, written chunk by chunk (13.35M blocks in bounded memory: bench/convert.py).
                from ..retrieval.conversion import write_legacy_retriever

                info(f"Converting the corpus and its {args.index} index ...")
                write_legacy_retriever(
                    source,
                    os.path.join(tmp, RETRIEVER_SUBFOLDER),
                    allow_pickle=True,
                    index=args.index,
                    tokenizer=tokenizer,
                    corpus_format=args.corpus_format,
                )
                model = load_without_retriever(RealmForOpenQA, source)
                model.config.num_block_records = _saved_manifest(tmp)["num_blocks"]
            elif os.path.isdir(os.path.join(source, RETRIEVER_SUBFOLDER)):
                # Already in this format (e.g. re-saving as safetensors): keep its corpus.
                from ..retrieval.retriever import RealmRetriever

                retriever = RealmRetriever.from_pretrained(os.path.join(source, RETRIEVER_SUBFOLDER))
                model = RealmForOpenQA.from_pretrained(source, retriever=retriever)
            else:
                model = load_without_retriever(RealmForOpenQA, source)
                logger.warning(
                    "%s has no block_records.npy: converting the weights only; build a corpus with `realm-hf index`.",
                    source,
                )
            info(f"Loaded {source}; writing safetensors weights ...")
            model.save_pretrained(tmp, save_retriever=False)
            if model.retriever is not None:
                info(
                    f"Writing the corpus ({len(model.retriever)} blocks) and its {model.retriever.store.index_type} index ..."
                )
                model.retriever.save_pretrained(
                    os.path.join(tmp, RETRIEVER_SUBFOLDER), corpus_format=args.corpus_format
                )
        else:
            if not architecture:
                raise CLIError(f"{source}/config.json names no architecture: cannot tell which REALM model it is.")
            model = AutoModel.from_pretrained(source)
            info(f"Loaded {source} ({type(model).__name__}); writing safetensors weights ...")
            model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _write_conversion_card(tmp, model, args.source)
    info(f"Converted {args.source} ({architecture or 'RealmForOpenQA'}) to {output}.")
    return EXIT_OK


def _saved_manifest(directory: str) -> dict | None:
    path = os.path.join(directory, RETRIEVER_SUBFOLDER, MANIFEST_NAME)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _write_conversion_card(directory: str, model, source: str) -> None:
    if type(model).__name__ != "RealmForOpenQA":
        return
    try:
        from ..hub.cards import write_model_card

        write_model_card(
            directory,
            model=model,
            # The streamed conversion attaches no retriever to the model: the card reads the corpus facts from disk.
            retriever_manifest=_saved_manifest(directory),
            base_model=source if is_hub_id(source) and not os.path.isdir(source) else None,
            description=f"REALM Open-QA model converted from the legacy checkpoint `{source}` with `realm-hf convert`.",
        )
    except Exception as err:  # the card is a courtesy: never fail a conversion over it
        logger.warning("Could not write a model card: %s", err)
