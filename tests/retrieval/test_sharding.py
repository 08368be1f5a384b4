"""ShardedRealmRetriever: a corpus split across processes searches, refreshes, saves and loads like one retriever.

The 2-process tests share one `accelerate launch` of tests/scripts/sharded_worker.py (gloo on CPU, ~20 s); they
compare what the processes returned with a single-process RealmRetriever built here from the same data.

What "identical" means: for Flat, and for IVF-Flat probing every list (nprobe = nlist in the single index and in each
shard's own index), block ids, stored embeddings, texts and token ids are equal, and scores are equal bit for bit
(FAISS computes each inner product with the same kernel whether a vector sits in one index or in a shard), except
the batch of 41 questions, which FAISS scores with BLAS matrix products of other shapes (equal to float32 rounding,
a relative 1e-6). Equal scores
(ties) would be ordered by block id in the merge, by FAISS's heap order in one index; random vectors have none.
"""

import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from realm_hf import RealmForOpenQA, ShardedRealmRetriever
from realm_hf.retrieval.refresh import embed_corpus
from realm_hf.retrieval.retriever import RealmRetriever
from tests.support.paths import SCRIPTS

WORKER_PATH = os.path.join(SCRIPTS, "sharded_worker.py")
_spec = importlib.util.spec_from_file_location("sharded_worker", WORKER_PATH)
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

INDEXES = list(worker.SEARCH_PARAMS)
BLAS_CASE = worker.BATCHES.index((24, 17))


@pytest.fixture(scope="module")
def full_retrievers():
    return {index: worker.search_corpus(index) for index in INDEXES}


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded")
    three_shards = out / "three-shards"
    ShardedRealmRetriever.from_retriever(worker.search_corpus("Flat"), num_shards=3).save_pretrained(three_shards)
    env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1")
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launcher += ["--main_process_port", "29527", "--num_machines", "1", "--mixed_precision", "no"]
    launcher += ["--dynamo_backend", "no"]
    command = [*launcher, WORKER_PATH, str(out), str(three_shards)]
    result = subprocess.run(command, env=env, timeout=600, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [record["world_size"] for record in records] == [2, 2]
    return out, records


def expected_search(full, case, rank, **params):
    queries = worker.questions(case)[rank]
    out = full.search(queries, worker.K, return_embeddings=True, return_token_ids=True, **params)
    return out, (out.block_token_ids, out.block_token_lengths)


def assert_same_search(got: dict, expected, exact_scores: bool):
    out, (tokens, lengths) = expected
    assert got["ids"] == out.block_ids.tolist()
    if exact_scores:
        assert got["scores"] == out.scores.tolist()
    else:
        torch.testing.assert_close(torch.tensor(got["scores"]), out.scores, rtol=1e-6, atol=1e-6)
    assert got["texts"] == [[block["text"] for block in row] for row in out.blocks]
    assert torch.equal(torch.tensor(got["embeddings"]).view_as(out.block_embeddings), out.block_embeddings)
    assert got["lengths"] == lengths.tolist()
    assert torch.equal(torch.tensor(got["tokens"], dtype=torch.int32).view_as(tokens), tokens)


# ---------------------------------------------------------------------------------------------------------------------
# Two processes
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("index", INDEXES)
def test_two_processes_return_the_single_retrievers_blocks_and_scores(two_processes, full_retrievers, index):
    _, records = two_processes
    full, params = full_retrievers[index], worker.SEARCH_PARAMS[index]
    for rank, record in enumerate(records):
        # Each process holds half of the blocks, and counts all of them.
        assert record[f"{index}/local_blocks"] == list(range(150 * rank, 150 * (rank + 1)))
        assert record[f"{index}/num_blocks"] == worker.NUM_BLOCKS
        for case, got in enumerate(record[index]):
            if worker.BATCHES[case][rank] == 0:
                assert got["ids"] == [] and got["scores"] == []
                continue
            expected = expected_search(full, case, rank, **params)
            assert_same_search(got, expected, exact_scores=case != BLAS_CASE or "IVF" in index)


@pytest.mark.parametrize("index", INDEXES)
def test_sharded_save_loads_back_on_two_processes_and_on_one(two_processes, full_retrievers, index):
    out, records = two_processes
    folder = out / ("saved-" + index.split(",")[0].lower())
    assert sorted(os.listdir(folder)) == [
        "shard-00000-of-00002",
        "shard-00001-of-00002",
        "sharded_retriever_manifest.json",
    ]
    manifest = json.loads((folder / "sharded_retriever_manifest.json").read_text())
    assert manifest["num_shards"] == 2 and manifest["num_blocks"] == worker.NUM_BLOCKS
    assert [shard["first_row"] for shard in manifest["shards"]] == [0, 150]
    assert all(entry["sha256"] for entry in manifest["files"].values())
    for record in records:
        assert record[f"{index}/reloaded"] == record[index]
    # One process holds both shards and answers exactly as the two did.
    loaded = ShardedRealmRetriever.from_pretrained(folder)
    assert len(loaded.shards) == 2 and len(loaded) == worker.NUM_BLOCKS
    params = worker.SEARCH_PARAMS[index]
    for rank in range(len(records)):
        for case in range(len(worker.BATCHES)):
            queries = worker.questions(case)[rank]
            if not len(queries):
                continue
            got = loaded.search(queries, worker.K, return_embeddings=True, **params)
            expected = full_retrievers[index].search(queries, worker.K, return_embeddings=True, **params)
            assert torch.equal(got.block_ids, expected.block_ids)
            torch.testing.assert_close(got.scores, expected.scores, rtol=1e-6, atol=1e-6)
            assert torch.equal(got.block_embeddings, expected.block_embeddings)
    if "IVF" in index:
        # Not exhaustive (one list per shard): still the same shards, so the same answers as on two processes.
        for rank, record in enumerate(records):
            got = loaded.search(worker.questions(0)[rank], worker.K, nprobe=1)
            assert got.block_ids.tolist() == record["ivf_nprobe1"]["ids"]
            assert got.scores.tolist() == record["ivf_nprobe1"]["scores"]
    else:
        merged = loaded.to_retriever()
        queries = worker.questions(BLAS_CASE)[0]
        assert torch.equal(merged.search(queries, 5).block_ids, full_retrievers[index].search(queries, 5).block_ids)


def test_processes_that_disagree_get_one_clear_error_each(two_processes):
    _, records = two_processes
    for record in records:
        # 3 shards cannot be shared by 2 processes: every process says so (none waits for the other).
        assert "holds 3 shards, which cannot be split evenly over 2 processes" in record["three_shards_error"]
        assert "on 2 of 2 processes" in record["three_shards_error"]
        assert "same k, rerank_factor and search parameters" in record["k_mismatch_error"]
        # The data of another process's blocks comes with the search that found them, not from a lookup.
        assert "are not held by this process" in record["remote_lookup_error"]


def test_each_process_splits_and_embeds_its_share_of_the_documents(two_processes):
    _, records = two_processes
    model = RealmForOpenQA.from_pretrained(worker.LEGACY_OPENQA, allow_pickle=True)
    single = RealmRetriever.from_documents(
        worker.documents(), model.embedder, model.retriever.tokenizer, max_block_length=48, show_progress=False
    )
    ids = [block_id for record in records for block_id in record["documents"]["block_ids"]]
    assert ids == single.store.block_ids.tolist()
    assert all(record["documents"]["num_blocks"] == len(single) for record in records)
    assert all(record["documents"]["block_ids"] for record in records)
    assert [d for record in records for d in record["documents"]["doc_ids"]] == list(single.corpus["doc_id"])
    assert [t for record in records for t in record["documents"]["texts"]] == list(single.corpus["text"])
    embeddings = torch.tensor([e for record in records for e in record["documents"]["embeddings"]])
    torch.testing.assert_close(embeddings, single.store.embeddings(torch.tensor(ids)), rtol=0, atol=1e-5)


def test_refresh_under_training_refreshes_each_shard_locally(two_processes):
    out, records = two_processes
    # The worker's callback could not gather (its `_gather` raises): every refresh was local, and none failed.
    assert [(r["refreshes"], r["failed_refreshes"], r["stale_after"]) for r in records] == [(2, 0, False)] * 2
    assert records[0]["refresh_local_blocks"] == list(range(6)) and records[1]["refresh_local_blocks"] == list(
        range(6, 12)
    )
    # A single retriever re-embedded with the trained document embedder holds what the shards hold.
    torch.manual_seed(0)
    model = RealmForOpenQA.from_pretrained(worker.LEGACY_OPENQA, allow_pickle=True)
    model.add_document_embedder()
    embed_corpus(model.retriever, model.document_embedder, show_progress=False)
    before = model.retriever.store.embeddings(torch.arange(12))
    model.document_embedder.load_state_dict(load_file(out / "document_embedder.safetensors"))
    embed_corpus(model.retriever, model.document_embedder, show_progress=False)
    after = model.retriever.store.embeddings(torch.arange(12))
    shards = torch.cat([torch.tensor(record["refresh_local_embeddings"][0]) for record in records])
    torch.testing.assert_close(shards, after, rtol=0, atol=1e-5)
    assert not torch.allclose(shards, before, atol=1e-3), "training did not change the document embedder"
    for record in records:
        expected = model.retriever.search(torch.tensor(record["refresh_queries"]), 12)
        assert record["refresh_ids"] == expected.block_ids.tolist()
        torch.testing.assert_close(torch.tensor(record["refresh_scores"]), expected.scores, rtol=0, atol=1e-5)


def test_trainer_checkpoints_save_and_restore_every_shard(two_processes):
    out, records = two_processes
    for record in records:
        assert record["trainer_refreshes"] == 1
        # Resuming swapped the checkpoint's shard back in, over a deliberately different live one.
        assert record["scrambled"] and record["restored"] and record["resumed_refresh_count"] == 1
    checkpoint = out / "trainer" / "checkpoint-2"
    loaded = ShardedRealmRetriever.from_pretrained(checkpoint / "retriever")
    assert loaded.shard_sizes == [6, 6]
    # The shards hold the corpus embedded by the document embedder saved in the same checkpoint.
    trained = RealmForOpenQA.from_pretrained(checkpoint, load_retriever=False)
    single = RealmForOpenQA.from_pretrained(worker.LEGACY_OPENQA, allow_pickle=True).retriever
    embed_corpus(single, trained.document_embedder, show_progress=False)
    ids = torch.arange(12)
    torch.testing.assert_close(loaded.embeddings(ids), single.store.embeddings(ids), rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# One process
# ---------------------------------------------------------------------------------------------------------------------


def test_one_process_holds_every_shard_and_searches_like_the_retriever(full_retrievers):
    full = full_retrievers["Flat"]
    sharded = ShardedRealmRetriever.from_retriever(full, num_shards=3)
    assert sharded.shard_sizes == [100, 100, 100] and len(sharded) == 300
    queries = torch.from_numpy(worker.questions(0)[1])
    got, expected = sharded.search(queries, 9), full.search(queries, 9)
    assert torch.equal(got.block_ids, expected.block_ids) and torch.equal(got.scores, expected.scores)
    assert got.blocks == expected.blocks
    # Lookups of the retrieved ids (what RealmForOpenQA does after a search) match the retriever's.
    assert torch.equal(sharded.embeddings(got.block_ids), full.store.embeddings(got.block_ids))
    assert sharded.texts(got.block_ids) == full.store.texts(got.block_ids)
    assert sharded.blocks(got.block_ids) == full.store.blocks(got.block_ids)
    tokens, lengths = sharded.token_ids(got.block_ids)
    expected_tokens, expected_lengths = full.store.token_ids(got.block_ids, full.tokenizer)
    assert torch.equal(tokens, expected_tokens) and torch.equal(lengths, expected_lengths)
    # Ids that no search of this thread returned are looked up in the shards this process holds (here: all).
    assert sharded.texts(torch.tensor([0, 299, -1])) == full.store.texts(torch.tensor([0, 299, -1]))
    with pytest.raises(ValueError, match="k=301.*number of blocks"):
        sharded.search(queries, 301)


def test_corrupt_or_missing_shard_files_are_refused(full_retrievers, tmp_path):
    saved = tmp_path / "sharded"
    ShardedRealmRetriever.from_retriever(full_retrievers["Flat"], num_shards=2).save_pretrained(saved)
    with pytest.raises(OSError, match="sharded.*`ShardedRealmRetriever.from_pretrained`"):
        RealmRetriever.from_pretrained(saved)

    corrupt = tmp_path / "corrupt"
    shutil.copytree(saved, corrupt)
    index_file = corrupt / "shard-00001-of-00002" / "index.faiss"
    data = bytearray(index_file.read_bytes())
    data[-1] ^= 0xFF
    index_file.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="shard-00001-of-00002/index.faiss is corrupt.*sha256"):
        ShardedRealmRetriever.from_pretrained(corrupt)

    missing = tmp_path / "missing"
    shutil.copytree(saved, missing)
    shutil.rmtree(missing / "shard-00000-of-00002")
    with pytest.raises(OSError, match="shard-00000-of-00002/.* is missing.*sharded_retriever_manifest.json"):
        ShardedRealmRetriever.from_pretrained(missing)

    with pytest.raises(OSError, match="single retriever directory, not a sharded save"):
        full_retrievers["Flat"].save_pretrained(tmp_path / "single")
        ShardedRealmRetriever.from_pretrained(tmp_path / "single")


def test_a_model_saved_with_a_sharded_retriever_leaves_the_shards_to_their_own_save(tmp_path, caplog):
    model = RealmForOpenQA.from_pretrained(worker.LEGACY_OPENQA, allow_pickle=True)
    model.set_retriever(ShardedRealmRetriever.from_retriever(model.retriever))
    with caplog.at_level(logging.WARNING, logger="realm_hf.models.modeling_openqa"):
        model.save_pretrained(tmp_path / "model")
    assert "not saved with the model" in caplog.text
    assert not (tmp_path / "model" / "retriever").exists()
    assert (tmp_path / "model" / "config.json").exists()
    # It answers through the shards like through the retriever it was split from.
    questions = ["What is the capital of France?"]
    sharded_answer = model.answer(questions)
    model.set_retriever(model.retriever.to_retriever())
    assert model.answer(questions) == sharded_answer


def test_building_before_the_process_group_exists_is_refused(full_retrievers, monkeypatch):
    # Under `accelerate launch`, before `Accelerator()`: each process would silently hold every shard.
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="torch.distributed.*`Accelerator"):
        ShardedRealmRetriever.from_retriever(full_retrievers["Flat"])


def test_a_sharded_save_replaces_what_the_folder_held_all_or_nothing(full_retrievers, tmp_path, monkeypatch):

    full = full_retrievers["Flat"]
    folder = tmp_path / "corpus"
    full.save_pretrained(folder)  # a single retriever saved here first
    ShardedRealmRetriever.from_retriever(full, num_shards=3).save_pretrained(folder)
    assert sorted(os.listdir(folder)) == [f"shard-0000{i}-of-00003" for i in range(3)] + [
        "sharded_retriever_manifest.json"
    ]
    two = ShardedRealmRetriever.from_retriever(full, num_shards=2)
    two.save_pretrained(folder)
    assert sorted(os.listdir(folder)) == [f"shard-0000{i}-of-00002" for i in range(2)] + [
        "sharded_retriever_manifest.json"
    ]
    before = (folder / "sharded_retriever_manifest.json").read_bytes()

    # A shard that fails to write leaves the previous save untouched.
    def failing_write(shard, directory, *args):
        if directory.endswith("shard-00001-of-00003"):
            raise OSError("disk full")
        return write(shard, directory, *args)

    write = RealmRetriever.write
    monkeypatch.setattr(RealmRetriever, "write", failing_write)
    with pytest.raises(OSError, match="disk full"):
        ShardedRealmRetriever.from_retriever(full, num_shards=3).save_pretrained(folder)
    assert (folder / "sharded_retriever_manifest.json").read_bytes() == before
    assert sorted(os.listdir(folder)) == [f"shard-0000{i}-of-00002" for i in range(2)] + [
        "sharded_retriever_manifest.json"
    ]
    assert ShardedRealmRetriever.from_pretrained(folder).shard_sizes == [150, 150]
