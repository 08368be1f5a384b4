"""
The `realm-hf` argument parser and the rules the commands share with it (exit statuses, training-config keys, what
reads as a Hub repo id): light, imported by the console script [`realm_hf_cli`] before anything heavy and by the
commands in [`realm_hf.cli`]. A module of its own so that the package's CLI imports these without importing the entry
point that runs it (`realm_hf_cli` imports `realm_hf.cli.common`): no import cycle.
"""

from __future__ import annotations

import argparse
import os
import re

EXIT_OK = 0
EXIT_ERROR = 2  # bad input and usage errors alike: `error: ...` on stderr

# Top-level keys of a training config; values that are paths are resolved against the config file's directory.
TRAIN_KEYS = {
    "task": "finetune (Open-QA, default) or pretrain (REALM masked-LM pre-training)",
    "model": "REALM model directory to start from (RealmForOpenQA for finetune, RealmForPreTraining for pretrain)",
    "init_from_bert": "BERT-layout checkpoint directory to initialise a new model from (instead of `model`)",
    "model_config": "RealmConfig overrides when initialising from BERT (e.g. retriever_proj_size, reader_beam_size)",
    "legacy_embedder": "pretrain: legacy RealmEmbedder/RealmScorer directory (with legacy_encoder)",
    "legacy_encoder": "pretrain: legacy RealmKnowledgeAugEncoder directory",
    "allow_pickle": "allow unpickling a legacy block_records.npy (trusted files only)",
    "corpus": "saved corpus + index directory (RealmRetriever.save_pretrained / realm-hf index)",
    "documents": "documents file(s) (JSONL/CSV/Parquet with title/text) to build the corpus from",
    "text_column": "text column of `documents` (default text)",
    "title_column": "title column of `documents` (default title)",
    "index": "FAISS factory string when building the corpus (default Flat)",
    "max_block_length": "wordpieces per block when building the corpus (default 288)",
    "train_file": "finetune: QA JSONL/CSV/Parquet (question, answers); pretrain: texts (text[, block_id])",
    "eval_file": "held-out file in the same format",
    "train_from_corpus": "pretrain: use the corpus blocks themselves as training texts",
    "question_column": "question column of the QA files (default question)",
    "answers_column": "answers column of the QA files (default answers)",
    "output_dir": "where checkpoints and the final model (with its retriever) go",
    "training_args": "transformers TrainingArguments fields (learning_rate, max_steps, ...)",
    "refresh_steps": "re-index the corpus every N steps with the document embedder (RealmReindexCallback)",
    "reindex_background": "refresh in a background thread while training goes on (default true)",
    "reindex_batch_size": "blocks per embedding batch when re-indexing (default 128)",
    "train_document_embedder": "finetune: train a document embedder too (end-to-end retriever training); false: query side only",
    "staleness_sample": "finetune: log recall@10 of the stale index against each refresh on this many train questions",
    "recall_ks": "finetune: recall@k cut-offs for evaluation (default [1, 5])",
    "retriever_warmup": "finetune: first train the question embedder on REALM's retrieval loss alone "
    "({max_steps, per_device_train_batch_size, learning_rate})",
    "reader_warmup": "finetune: then train the reader on cloze questions of the corpus read against their own block, "
    "and on train_file questions with a doc_id read against their article's block ({max_steps, "
    "per_device_train_batch_size, learning_rate, cloze_per_block, question_share})",
    "lora": "finetune: LoRA settings ({r, alpha, dropout, targets, target_modules}); saves adapter/ and merges",
    "embedder_lr_ratio": "pretrain: the embedders' learning rate relative to the encoder's (default 1: one rate)",
    "masking": "pretrain: DataCollatorForSalientSpanMasking options (max_length, mask_rate, seed, ...)",
    "export_components": "pretrain: also write embedder/, encoder/ (legacy layouts) into the output",
    "seed": "random seed, set before the model is built (default: training_args.seed or 42)",
}
_EPILOGS = {
    "index": """examples:
  realm-hf index docs.jsonl --model my-realm-model --output my-corpus
  realm-hf index docs.csv --text-column body --title-column headline --model my-realm-model \\
      --index HNSW32 --output my-corpus
  realm-hf index docs.jsonl --model my-realm-model --attach-to my-realm-model --index Flat+bm25 --overwrite
  realm-hf index saved_dataset_dir --model my-realm-model --attach-to my-realm-model --overwrite
  realm-hf index docs.parquet --model qa-model --document-embedder pretrained-embedder --output corpus""",
    "ask": """examples:
  realm-hf ask "who designed the torre alba lighthouse?" --model my-realm-model
  realm-hf ask --file questions.txt --model my-realm-model --top-k 3 --json > answers.jsonl
  realm-hf ask "who wrote it?" --context "Unix was written by Ken Thompson." --model my-realm-model""",
    "train": """examples:
  realm-hf train examples/train_config_example.json
  realm-hf train config.yaml --set training_args.max_steps=100 --set lora.r=16 --output-dir runs/lora16

config keys (JSON or YAML; relative paths are relative to the config file):
"""
    + "\n".join(f"  {key:<24}{help_}" for key, help_ in TRAIN_KEYS.items()),
    "evaluate": """examples:
  realm-hf evaluate dev.jsonl --model my-realm-model --ks 1 5 20 --output metrics.json
  realm-hf evaluate dev.jsonl --model my-realm-model --ks 100 --run-file run.trec --run-tag realm-dense
  realm-hf evaluate dev.csv --answers-column golds --answers-separator ";" --model my-realm-model

QA files: JSONL (or a JSON array), CSV or Parquet with a question column and an answers column holding a list of
strings, one string, a JSON list or SQuAD's {"text": [...]}; an `id` column names each question in --run-file.""",
    "convert": """examples:
  realm-hf convert path/to/realm-orqa-nq-openqa realm-orqa-nq --allow-pickle
  realm-hf convert google/realm-orqa-nq-openqa realm-orqa-nq --allow-pickle --index HNSW32
  realm-hf convert path/to/realm-cc-news-pretrained-embedder embedder-converted

Legacy RealmForOpenQA checkpoints keep their block texts in a pickled block_records.npy; unpickling can run
arbitrary code, so it needs --allow-pickle (for files you trust). The output holds no pickle: safetensors
weights, the tokenizer, and retriever/ (Arrow corpus, FAISS index, manifest).""",
    "serve": """examples:
  realm-hf serve my-realm-model
  realm-hf serve me/realm-foldoc --port 8080 --top-k 5
  REALM_HF_SERVE_WRITE_TOKEN=... realm-hf serve my-realm-model   # allows adding and removing documents

Opens a Gradio page (http://127.0.0.1:7860 by default) and the same answers through Gradio's API
(`gradio_client.Client(url).predict("who wrote unix?", 3, api_name="/answer")`), in the schema of
`realm-hf ask --json`. Needs `pip install 'realm-hf[serve]'`. Documents added or removed through the server change
the corpus in memory only. See docs/serving.md.""",
    "push": """examples:
  realm-hf push my-realm-model --repo-id me/realm-foldoc
  realm-hf push my-realm-model --repo-id me/realm-foldoc --corpus-repo-id me/foldoc-corpus --private""",
}


def probability(text: str) -> float:
    """An argparse type: a number from 0 to 1 (a span probability), checked when the arguments are parsed."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a probability from 0 to 1, got {text!r}") from None
    if not 0.0 <= value <= 1.0:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"expected a probability from 0 to 1, got {text}")
    return value


def metadata_condition(text: str) -> tuple[str, str]:
    """
    An argparse type: `COLUMN=VALUE`, one condition of a metadata filter, as `(column, value text)`; the value is
    read in the column's type once the corpus is loaded (`realm_hf.cli.ask.metadata_filter`).
    """
    column, sep, value = text.partition("=")
    if not sep or not column.strip():
        raise argparse.ArgumentTypeError(f"expected COLUMN=VALUE (e.g. topic=science), got {text!r}")
    return column.strip(), value


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("realm-hf")
    except metadata.PackageNotFoundError:  # a source tree on PYTHONPATH, not installed: ask the package itself
        from realm_hf.version import __version__

        return __version__


class _VersionAction(argparse.Action):
    """`--version`, looked up only when asked for (argparse's own action needs the string when the parser is built)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help="show the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"realm-hf {_version()}")
        parser.exit()


def _add_common(parser: argparse.ArgumentParser, top_level: bool) -> None:
    # On subcommands the defaults are suppressed so that `realm-hf --debug ask ...` is not reset by the subparser.
    default = False if top_level else argparse.SUPPRESS
    parser.add_argument("--debug", action="store_true", default=default, help="show tracebacks on errors")
    parser.add_argument(
        "-q", "--quiet", action="store_true", default=default, help="no progress bars or status messages"
    )


def build_parser() -> argparse.ArgumentParser:
    """The `realm-hf` argument parser (one subparser per command)."""
    parser = argparse.ArgumentParser(
        prog="realm-hf",
        description="REALM (retrieval-augmented language models) for the Hugging Face ecosystem.",
        epilog="Run `realm-hf <command> --help` for a command's options and examples.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_VersionAction)
    _add_common(parser, top_level=True)
    commands = parser.add_subparsers(dest="command", metavar="<command>")

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            help=help_,
            description=help_,
            epilog=_EPILOGS.get(name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _add_common(sub, top_level=False)
        return sub

    # index
    p = add("index", "Build a corpus and FAISS index from documents (JSONL/CSV/Parquet or a saved dataset).")
    p.add_argument("documents", nargs="+", help="documents file(s), or one `datasets.save_to_disk` directory")
    p.add_argument("--model", help="REALM model directory whose embedder builds the index (default: --attach-to)")
    p.add_argument("--document-embedder", help="embed with this RealmEmbedder (or scorer/model) directory instead")
    p.add_argument("--output", help="directory to save the corpus + index in")
    p.add_argument("--attach-to", metavar="MODEL_DIR", help="also save it as MODEL_DIR/retriever/")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output or retriever/")
    p.add_argument("--text-column", default="text", help="column with the document text (default: text)")
    p.add_argument("--title-column", default="title", help="column with the title (default: title; optional)")
    p.add_argument("--id-column", help="column with a document id (kept as doc_id, for remove_documents)")
    p.add_argument("--format", default="auto", choices=["auto", "json", "csv", "parquet", "dataset"])
    p.add_argument("--split", default="train", help="split of a saved DatasetDict (default: train)")
    p.add_argument(
        "--index",
        default="Flat",
        help="FAISS factory string: Flat, HNSW32, IVF1024,Flat, ... (default: Flat); add +bm25 (e.g. Flat+bm25) to "
        "build a BM25 index beside it for hybrid retrieval (needs realm-hf[hybrid])",
    )
    p.add_argument(
        "--max-block-length", type=int, default=288, help="wordpieces per block, title included (default: 288)"
    )
    p.add_argument("--batch-size", type=int, default=64, help="blocks per embedding batch (default: 64)")
    p.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    p.add_argument("--dtype", help="autocast dtype for embedding: bf16, auto (bf16 where native) or fp16 (GPUs)")
    p.add_argument("--train-size", type=int, help="vectors to train IVF/PQ indexes on (default: all)")
    p.add_argument(
        "--corpus-format", default="arrow", choices=["arrow", "parquet"], help="corpus storage (default: arrow)"
    )
    p.set_defaults(command="index")

    # ask
    p = add("ask", "Answer questions with a REALM model (retrieval from its corpus, then the reader).")
    p.add_argument("questions", nargs="*", metavar="QUESTION", help="question(s) to answer")
    p.add_argument("--model", required=True, help="RealmForOpenQA directory (with retriever/) or Hub id")
    p.add_argument("--file", help="questions file: one per line, or JSONL with 'question'; '-' reads stdin")
    p.add_argument("--top-k", type=int, default=1, help="answers per question (default: 1)")
    p.add_argument("--num-blocks", type=int, help="blocks retrieved and read per question (default: reader_beam_size)")
    p.add_argument("--max-answer-len", type=int, help="longest answer in wordpieces (default: max_span_width)")
    p.add_argument(
        "--filter",
        type=metadata_condition,
        action="append",
        metavar="COLUMN=VALUE",
        help="retrieve only blocks whose corpus column COLUMN holds VALUE (read in the column's type: year=1999 is a "
        "number in a column of numbers, text in a column of text); repeat it: the same column gives any of its "
        "values, several columns must all match",
    )
    p.add_argument("--context", help="answer from this passage instead of retrieving")
    p.add_argument(
        "--no-answer-threshold",
        type=probability,
        metavar="P",
        help="answer 'no answer' when the best span's probability is under P (0 to 1; default: the model's "
        "config.no_answer_threshold, else always the best span)",
    )
    p.add_argument("--json", action="store_true", help="JSON lines: question, rank, answer, score, start, end, block")
    p.add_argument("--batch-size", type=int, default=8, help="questions per forward pass (default: 8)")
    p.add_argument("--device", help="cpu, cuda, ... (default: cuda if available)")
    p.add_argument(
        "--dtype",
        default="fp32",
        help="compute dtype: fp32 (default), bf16 (autocast; fp32 with a warning where the CPU/GPU has no native "
        "bf16), auto (bf16 only where native) or int8 (CPUs only: int8 linear layers in the reader's encoder)",
    )
    p.add_argument("--allow-pickle", action="store_true", help="allow a legacy block_records.npy (trusted files only)")
    p.set_defaults(command="ask")

    # train
    p = add("train", "Fine-tune (Open-QA) or pre-train (REALM) a model from a JSON/YAML config file.")
    p.add_argument("config", help="config file (.json, .yaml or .yml)")
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override a config value (dotted keys, YAML values)"
    )
    p.add_argument("--output-dir", help="override output_dir")
    p.add_argument("--resume-from-checkpoint", help="checkpoint directory to resume from")
    p.set_defaults(command="train")

    # evaluate
    p = add("evaluate", "Exact match, F1 and retrieval recall@k, MRR@k and nDCG@k of a REALM model on a QA file.")
    p.add_argument("qa_file", help="JSONL/CSV/Parquet file with questions and gold answers")
    p.add_argument("--model", required=True, help="RealmForOpenQA directory (with retriever/) or Hub id")
    p.add_argument(
        "--ks", type=int, nargs="+", default=[1, 5, 20], help="recall@k, MRR@k, nDCG@k cut-offs (default: 1 5 20)"
    )
    p.add_argument("--output", help="write the metrics as JSON here")
    p.add_argument("--predictions", help="write per-question predictions (JSONL) here")
    p.add_argument(
        "--run-file",
        help="write the retrieved blocks as a TREC run here (qid Q0 block_id rank score tag; down to the deepest --ks)",
    )
    p.add_argument("--run-tag", help="the run's name, the last column of --run-file (default: realm-hf)")
    p.add_argument("--question-column", default="question")
    p.add_argument("--answers-column", default="answers")
    p.add_argument("--answers-separator", default="|", help="separator of answers in a CSV text cell (default: |)")
    p.add_argument("--format", default="auto", choices=["auto", "json", "csv", "parquet", "dataset"])
    p.add_argument("--limit", type=int, help="evaluate the first N questions only")
    p.add_argument("--batch-size", type=int, default=16, help="questions per forward pass (default: 16)")
    p.add_argument("--device", help="cpu, cuda, ... (default: cuda if available)")
    p.add_argument("--allow-pickle", action="store_true", help="allow a legacy block_records.npy (trusted files only)")
    p.set_defaults(command="evaluate")

    # convert
    p = add("convert", "Convert a legacy REALM checkpoint (google/realm-* layout) to safetensors + Arrow + FAISS.")
    p.add_argument("source", help="legacy checkpoint directory (or Hub id, downloaded when the Hub is reachable)")
    p.add_argument("output", help="output directory (written atomically)")
    p.add_argument("--allow-pickle", action="store_true", help="unpickle block_records.npy (trusted files only)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing, non-empty output directory")
    p.add_argument("--index", default="Flat", help="FAISS factory string for the corpus (default: Flat, exact)")
    p.add_argument(
        "--corpus-format", default="arrow", choices=["arrow", "parquet"], help="corpus storage (default: arrow)"
    )
    p.add_argument("--revision", help="Hub revision when SOURCE is a repo id")
    p.set_defaults(command="convert")

    # serve
    p = add("serve", "Serve a REALM model: a web page and an API that answer questions with their source (Gradio).")
    p.add_argument("model", metavar="MODEL_DIR_OR_REPO", help="RealmForOpenQA directory (with retriever/) or Hub id")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=7860, help="port (default: 7860)")
    p.add_argument("--top-k", type=int, default=3, help="answers per question the page starts with (default: 3)")
    p.add_argument("--num-blocks", type=int, help="blocks retrieved and read per question (default: reader_beam_size)")
    p.add_argument(
        "--no-answer-threshold",
        type=probability,
        metavar="P",
        help="show 'no answer' when the best span's probability is under P (default: the model's "
        "config.no_answer_threshold, else 0.1; 0 answers every question)",
    )
    p.add_argument(
        "--write-token",
        help="token that allows adding and removing documents (default: $REALM_HF_SERVE_WRITE_TOKEN; "
        "none: writes are refused). Prefer the environment variable: arguments are visible to other users",
    )
    p.add_argument("--concurrency", type=int, default=4, help="questions answered at the same time (default: 4)")
    p.add_argument(
        "--allowed-host",
        action="append",
        metavar="NAME",
        help="a host name served besides loopback and --host, e.g. the public name of a proxy in front (repeatable; "
        "*.example.org for subdomains); requests naming another host are refused",
    )
    p.add_argument(
        "--max-request-size",
        type=int,
        default=1 << 20,
        help="the largest request body read, in bytes (default: 1048576)",
    )
    p.add_argument(
        "--dtype",
        default="fp32",
        help="compute dtype: fp32 (default), bf16 (autocast where native), auto (bf16 only where native) or int8 "
        "(CPUs only: int8 linear layers in the reader's encoder)",
    )
    p.add_argument("--title", default="REALM question answering", help="the page's title")
    p.add_argument("--device", help="cpu, cuda, ... (default: cuda if available)")
    p.add_argument("--allow-pickle", action="store_true", help="allow a legacy block_records.npy (trusted files only)")
    p.set_defaults(command="serve")

    # push
    p = add("push", "Push a model directory (weights, tokenizer, retriever/, model card) to the Hugging Face Hub.")
    p.add_argument("model_dir", help="model directory to push")
    p.add_argument("--repo-id", required=True, help="target model repo, e.g. me/realm-foldoc")
    p.add_argument("--private", action="store_true", default=None, help="create the repo as private")
    p.add_argument("--revision", help="branch to push to (created if needed)")
    p.add_argument("--corpus-repo-id", help="push the corpus + index as this dataset repo and reference it")
    p.add_argument("--no-corpus", action="store_true", help="push the model without its corpus")
    p.add_argument("--commit-message")
    p.add_argument("--token", help="Hub token (default: the logged-in token)")
    p.add_argument("--endpoint", help="Hub endpoint (default: HF_ENDPOINT or huggingface.co)")
    p.set_defaults(command="push")
    return parser


def is_hub_id(name: str) -> bool:
    """Whether `name` reads as a Hub repo id (`owner/name` or `name`) rather than a local path."""
    # "owner/name" or "name": no path syntax. Anything else that does not exist is a missing local path.
    if name.startswith((".", "/", "~")) or os.sep in name.replace("/", "", 1) or name.count("/") > 1:
        return False
    # huggingface_hub's rule for each part (letters, digits, '-', '_', '.'; no '--' or '..'; not starting or ending
    # with '-' or '.'), so that e.g. "my-model/" is a missing directory, not a repo to look for.
    parts = name.split("/")
    if not all(_HUB_NAME.fullmatch(part) and "--" not in part and ".." not in part for part in parts):
        return False
    return not name.endswith((".json", ".jsonl", ".csv", ".parquet"))


_HUB_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?")
