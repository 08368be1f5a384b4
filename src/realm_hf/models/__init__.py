"""
The REALM models, one module per job (import the classes from `realm_hf`; nothing is re-exported here).

- `configuration_realm`, `tokenization_realm`, `initialization` (from any BERT-layout checkpoint)
- `modeling_base` (the shared base class), `modeling_embedder`, `modeling_reader`, `modeling_knowledge_aug` (each
  model's output dataclass lives with the model; `RealmForOpenQAOutput` with the answer path that builds it)
- `modeling_openqa` ([`RealmForOpenQA`], with its end-to-end document embedder) and its parts: `openqa_answers` and
  `provenance` (the answer path and schema the pipeline and CLI share), `reader_inputs` (shared with the warm-ups),
  `retriever_losses`
- `retriever_owner` (the capability of a model that owns a retriever) and `retriever_loading` (its one loader)
- `modeling_pretraining` ([`RealmForPreTraining`], its inputs, ICT warm start and component checkpoints)
- `modeling_ict` ([`RealmForInverseClozeTask`], the embedders' warm start; its collator and Trainer are in `training/`)
"""
