"""`RealmTokenizer`: a folder without its vocabulary is an error naming the file, not a tokenizer that reads every
word as [UNK]."""

import pytest


def test_tokenizer_without_vocabulary_names_the_missing_file(tiny, tmp_path):
    from transformers import AutoTokenizer

    from realm_hf import RealmTokenizer

    with pytest.raises(OSError, match="no tokenizer.json or vocab.txt"):
        RealmTokenizer.from_pretrained(tmp_path)
    with pytest.raises(OSError, match="'google/realm-cc-news-pretrained-openqa'.*local folder.*HF_HUB_OFFLINE"):
        RealmTokenizer.from_pretrained("google/realm-cc-news-pretrained-openqa")
    saved = tmp_path / "tokenizer"
    tiny[1].save_pretrained(saved)
    assert len(AutoTokenizer.from_pretrained(saved)) == len(tiny[1])
    (saved / "tokenizer.json").unlink()  # tokenizer_config.json names RealmTokenizer: AutoTokenizer resolves to it
    with pytest.raises(OSError, match="no tokenizer.json or vocab.txt"):
        AutoTokenizer.from_pretrained(saved)
