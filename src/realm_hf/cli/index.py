"""`realm-hf index`: build a corpus + FAISS index from documents and save or attach it."""

from __future__ import annotations

import os

from ..constants import RETRIEVER_SUBFOLDER
from .common import (
    EXIT_OK,
    CLIError,
    State,
    architecture_of,
    atomic_output_dir,
    check_embedder_dir,
    check_output_dir,
    config_of,
    default_device,
    embedder_from_dir,
    info,
    load_tokenizer,
)
from .readers import load_documents

#: What `--index FACTORY+SUFFIX` may add beside the FAISS index: a sparse index saved with it, which `ask`,
#: `evaluate`, the pipeline and `from_pretrained` then search together with the dense one (retrieval/bm25.py).
SPARSE_SUFFIXES = ("bm25",)


def split_index_spec(spec: str) -> tuple[str, str | None]:
    """
    `"Flat+bm25"` -> `("Flat", "bm25")`: the FAISS factory string and the sparse index to build beside it (`None`).
    A `+` followed by a letter names a sparse index; FAISS's own `+` (e.g. `PQ8+16`, a digit) stays in the factory.
    """
    factory, plus, suffix = spec.rpartition("+")
    if not plus or not suffix[:1].isalpha():
        return spec, None
    if suffix.lower() not in SPARSE_SUFFIXES:
        allowed = ", ".join(f"'+{name}'" for name in SPARSE_SUFFIXES)
        raise CLIError(
            f"--index {spec!r}: unknown suffix '+{suffix}'. After the FAISS factory string, {allowed} adds a sparse "
            "index (e.g. --index Flat+bm25); without a suffix the index is dense only."
        )
    if not factory:
        raise CLIError(f"--index {spec!r}: name the dense FAISS index before '+{suffix}' (e.g. Flat+{suffix}).")
    return factory, suffix.lower()


def run(args) -> int:
    from ..retrieval.faiss_build import IndexFactoryError
    from ..retrieval.retriever import RealmRetriever

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
    factory, sparse = split_index_spec(args.index)
    if sparse == "bm25":
        try:  # checked before any document is read
            from ..retrieval.bm25 import require_bm25s  # local import: retrieval pulls in faiss and datasets

            require_bm25s()
        except ImportError:
            raise CLIError(
                f"--index {args.index}: the BM25 index needs the `bm25s` package: pip install 'realm-hf[hybrid]' "
                f"(or use --index {factory} for the dense index alone)."
            ) from None
    if args.max_block_length < 8:
        raise CLIError(f"--max-block-length must be at least 8 wordpieces, got {args.max_block_length}.")
    # Checked before any document is read or embedded: a bad --batch-size or --dtype failed only after the model had
    # loaded, and a negative --train-size was taken (an IVF index trained on a slice cut from the end).
    if args.batch_size < 1:
        raise CLIError(f"--batch-size must be at least 1, got {args.batch_size}.")
    if args.train_size is not None and args.train_size < 1:
        raise CLIError(
            f"--train-size must be at least 1 vector (leave it out to train on all), got {args.train_size}."
        )
    if args.dtype is not None:
        from ..precision import parse_dtype  # deferred: it imports torch

        try:
            dtype = parse_dtype(args.dtype)
        except ValueError:
            dtype = None  # named below, with the int8 case
        if dtype is None or dtype == "int8":
            raise CLIError(
                f"--dtype must be fp32, bf16, auto or fp16 (GPUs only) for embedding a corpus, got {args.dtype!r} "
                "(int8 is for answering: `realm-hf ask --dtype int8`)."
            )

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
    try:
        # The factory string is tried before any block is embedded (`store_from_documents`).
        retriever = RealmRetriever.from_documents(
            documents,
            embedder.to(device).eval(),
            tokenizer,
            max_block_length=args.max_block_length,
            index=factory,
            batch_size=args.batch_size,
            device=device,
            dtype=args.dtype,
            show_progress=not State.quiet,
            train_size=args.train_size,
        )
    except IndexFactoryError as err:
        raise CLIError(f"--index {args.index!r}: {err}") from None
    info(f"Indexed {len(retriever)} blocks ({retriever.embedding_dim}-d, {factory}).")
    if sparse == "bm25":
        # Saved beside the dense index, under the same manifest; loading the model or corpus brings it back.
        retriever.use_bm25()
        info(f"Built the BM25 index of the {len(retriever)} blocks (hybrid retrieval: BM25 candidates, dense scores).")
    if args.output:
        with atomic_output_dir(args.output, overwrite=args.overwrite) as tmp:
            retriever.save_pretrained(tmp, corpus_format=args.corpus_format)
        info(f"Saved the corpus and index to {args.output}.")
    if attach_dir:
        # save_pretrained swaps each entry in atomically, so a model directory never holds a half-written corpus.
        retriever.save_pretrained(attach_dir, corpus_format=args.corpus_format)
        info(f"Attached the corpus to {args.attach_to} (retriever/).")
    return EXIT_OK
