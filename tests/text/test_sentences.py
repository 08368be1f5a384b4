"""The one sentence rule (`realm_hf.text.sentences`) that block splitting, ICT and the warm-ups share."""

from realm_hf.text.sentences import sentence_spans, split_sentences


def test_sentence_spans_keep_abbreviations_initials_and_numbered_senses():
    text = "A type of RAM, e.g. DRAM. It was made by D. Howe in 1966. Fine!\n1. Sense one. next one"
    assert [text[s:e] for s, e in sentence_spans(text)] == [
        "A type of RAM, e.g. DRAM.",
        "It was made by D. Howe in 1966.",
        "Fine!",
        "1. Sense one.",
        "next one",
    ]
    assert split_sentences("paris is big. the seine flows.") == ["paris is big.", "the seine flows."]
