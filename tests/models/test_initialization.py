"""Starting REALM models from BERT (`realm_hf.models.initialization`): what `init_from_bert` records in the config."""

from realm_hf import RealmForOpenQA


def test_init_from_bert_records_an_untrained_reader_and_no_local_path(legacy_vocab_bert):
    from realm_hf.models.initialization import init_from_bert
    from realm_hf.models.modeling_pretraining import RealmForPreTraining

    model = init_from_bert(RealmForOpenQA, legacy_vocab_bert, retriever_proj_size=8, span_hidden_size=8)
    assert model.config.reader_trained is False
    assert model.config.base_model is None  # a local path is not a Hub id, and would leak into published configs
    named = init_from_bert(RealmForOpenQA, legacy_vocab_bert, base_model="google/bert_uncased_L-2_H-128_A-2")
    assert named.config.base_model == "google/bert_uncased_L-2_H-128_A-2"
    # A model without a reader has nothing untrained to report.
    assert init_from_bert(RealmForPreTraining, legacy_vocab_bert, retriever_proj_size=8).config.reader_trained is True
