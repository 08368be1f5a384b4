"""`realm-hf push`: publish a model directory (and optionally its corpus) to the Hugging Face Hub."""

from __future__ import annotations

import os

from .common import EXIT_OK, CLIError, architecture_of, config_of, hub_offline, info, load_openqa, load_tokenizer


def run(args) -> int:
    if not os.path.isdir(args.model_dir):
        raise CLIError(f"Model directory {args.model_dir!r} does not exist.")
    architecture = architecture_of(config_of(args.model_dir))
    if hub_offline():
        raise CLIError(
            "Cannot push: HF_HUB_OFFLINE is set, so the Hub cannot be reached. Unset it (and log in with "
            "`hf auth login` or pass --token) to push."
        )
    if args.corpus_repo_id and architecture != "RealmForOpenQA":
        raise CLIError("--corpus-repo-id needs a RealmForOpenQA model directory (with a retriever/).")
    from ..hub import repositories as hub

    def hub_call(what: str, fn, *a, **kw):
        try:
            return fn(*a, **kw)
        except (CLIError, KeyboardInterrupt):
            raise
        except Exception as err:  # connection, auth and repo errors from huggingface_hub
            endpoint = args.endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
            raise CLIError(f"Could not {what} ({endpoint}): {type(err).__name__}: {err}") from err

    common = dict(private=args.private, token=args.token, revision=args.revision, endpoint=args.endpoint)
    if architecture == "RealmForOpenQA":
        model = load_openqa(args.model_dir, need_retriever=False, device="cpu")
        tokenizer = load_tokenizer(args.model_dir) if model.retriever is None else None
        save_retriever = model.retriever is not None and not args.no_corpus
        if args.corpus_repo_id:
            if model.retriever is None:
                raise CLIError(f"{args.model_dir} has no retriever/ to push as a corpus.")
            pushed = hub_call(
                f"push the corpus to {args.corpus_repo_id}",
                hub.push_corpus_to_hub,
                model.retriever,
                args.corpus_repo_id,
                commit_message=args.commit_message,
                **common,
            )
            # Pin the commit so that the model always loads the index it was pushed with.
            revision = getattr(pushed, "oid", None) or args.revision
            hub.set_retriever_reference(model.config, args.corpus_repo_id, revision=revision, repo_type="dataset")
            save_retriever = False
            info(f"Pushed the corpus to dataset repo {args.corpus_repo_id}.")
        pushed = hub_call(
            f"push to {args.repo_id}",
            hub.push_to_hub,
            model,
            args.repo_id,
            tokenizer=tokenizer,
            commit_message=args.commit_message,
            save_retriever=save_retriever,
            **common,
        )
    else:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=args.endpoint, token=args.token)
        repo_id = hub_call(
            f"create {args.repo_id}", api.create_repo, args.repo_id, private=args.private, exist_ok=True
        ).repo_id
        if args.revision:
            hub_call(f"create branch {args.revision}", api.create_branch, repo_id, branch=args.revision, exist_ok=True)
        with hub.expected_data_files():  # a model directory holds its corpus files on purpose
            pushed = hub_call(
                f"upload to {repo_id}",
                api.upload_folder,
                repo_id=repo_id,
                folder_path=args.model_dir,
                revision=args.revision,
                commit_message=args.commit_message or f"Upload {architecture or 'REALM model'}",
            )
    url = getattr(pushed, "commit_url", None) or getattr(pushed, "repo_url", None) or args.repo_id
    info(f"Pushed {args.model_dir} to {url}.")
    return EXIT_OK
