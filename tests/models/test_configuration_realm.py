"""`RealmConfig`: values checked where they enter, each error naming the field and the value."""

import pytest


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("reader_beam_size", 0, r"`reader_beam_size`.*at least 1.*got 0"),
        ("reader_beam_size", -3, r"`reader_beam_size`.*at least 1.*got -3"),
        ("searcher_beam_size", 2.5, r"`searcher_beam_size`.*at least 1.*got 2.5"),
        ("max_span_width", 0, r"`max_span_width`.*at least 1.*got 0"),
        ("reader_seq_len", 3, r"`reader_seq_len`.*at least 10.*max_span_width=10.*got 3"),
    ],
)
def test_config_values_name_the_field(field, value, message):
    from realm_hf import RealmConfig

    with pytest.raises(ValueError, match=message):
        RealmConfig(**{field: value})


def test_config_json_with_a_bad_value_names_the_field_at_load(tmp_path):
    from realm_hf import RealmConfig

    RealmConfig(reader_seq_len=64, max_span_width=4).save_pretrained(tmp_path)
    text = (tmp_path / "config.json").read_text().replace('"max_span_width": 4', '"max_span_width": 0')
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError, match="`max_span_width`"):
        RealmConfig.from_pretrained(tmp_path)
