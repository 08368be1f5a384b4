"""`realm-hf index`: build a corpus + FAISS index from documents and save or attach it."""

from __future__ import annotations

import os

from ...constants import RETRIEVER_SUBFOLDER
from ..common import EXIT_OK, CLIError, State, architecture_of, config_of, default_device, info, load_tokenizer
from ..models import check_embedder_dir, embedder_from_dir
from ..outputs import atomic_output_dir, check_output_dir
from ..readers import load_documents


def run(args) -> int:
    from ...retrieval_realm import RealmRetriever

    if not args.output and not args.attach_to:
        raise CLIError("Say where the corpus goes: --output DIR and/or --attach-to MODEL_DIR.")
    model_dir = args.model or args.attach_to
    if not model_dir:
        raise CLIError("Give the model whose embedder builds the index: --model DIR (or --document-embedder DIR).")
    embedder_dir = args.document_embedder or model_dir
    for path, what in ((model_dir, "Model directory"), (embedder_dir, "Embedder directory")):
        if not os.path.isdir(path):
            raise CLIError(f"{what} {path!r} does not exist.")
    # The model is checked from its config before any document is read (reading can take minutes).
    check_embedder_dir(embedder_dir, "--document-embedder" if args.document_embedder else "--model")
    if args.output:
        check_output_dir(os.path.abspath(args.output), args.overwrite)
    attach_dir = None
    if args.attach_to:
        attach_config = config_of(args.attach_to)
        if architecture_of(attach_config) not in ("RealmForOpenQA", "RealmForPreTraining", ""):
            raise CLIError(f"--attach-to {args.attach_to}: a {architecture_of(attach_config)} has no retriever.")
        attach_dir = os.path.join(args.attach_to, RETRIEVER_SUBFOLDER)
        if os.path.isdir(attach_dir) and os.listdir(attach_dir) and not args.overwrite:
            raise CLIError(f"{args.attach_to} already has a retriever/; pass --overwrite to replace it.")
    if args.max_block_length < 8:
        raise CLIError(f"--max-block-length must be at least 8 wordpieces, got {args.max_block_length}.")

    documents = load_documents(
        args.documents, args.text_column, args.title_column, args.id_column, fmt=args.format, split=args.split
    )
    info(f"Read {len(documents)} documents from {', '.join(args.documents)}.")
    embedder, description = embedder_from_dir(embedder_dir)
    tokenizer = load_tokenizer(embedder_dir, model_dir)
    max_positions = getattr(embedder.config, "max_position_embeddings", None)
    if max_positions and args.max_block_length > max_positions:
        raise CLIError(
            f"--max-block-length {args.max_block_length} exceeds the embedder's max_position_embeddings "
            f"({max_positions})."
        )
    if args.attach_to:
        expected = config_of(args.attach_to).get("retriever_proj_size")
        if expected is not None and expected != embedder.config.retriever_proj_size:
            raise CLIError(
                f"The embedder makes {embedder.config.retriever_proj_size}-d vectors but {args.attach_to} expects "
                f"{expected}-d (retriever_proj_size): use that model's embedder."
            )
    device = default_device(args.device)
    info(f"Embedding with the {description} of {embedder_dir} on {device}, index {args.index}.")
    retriever = RealmRetriever.from_documents(
        documents,
        embedder.to(device).eval(),
        tokenizer,
        max_block_length=args.max_block_length,
        index=args.index,
        batch_size=args.batch_size,
        device=device,
        dtype=args.dtype,
        show_progress=not State.quiet,
        train_size=args.train_size,
    )
    info(f"Indexed {len(retriever)} blocks ({retriever.embedding_dim}-d, {args.index}).")
    if args.output:
        with atomic_output_dir(args.output, overwrite=args.overwrite) as tmp:
            retriever.save_pretrained(tmp, corpus_format=args.corpus_format)
        info(f"Saved the corpus and index to {args.output}.")
    if attach_dir:
        # save_pretrained swaps each entry in atomically, so a model directory never holds a half-written corpus.
        retriever.save_pretrained(attach_dir, corpus_format=args.corpus_format)
        info(f"Attached the corpus to {args.attach_to} (retriever/).")
    return EXIT_OK
