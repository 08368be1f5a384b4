"""
The REALM models, one module per job (import the classes from `realm_hf`; nothing is re-exported here).

- `configuration_realm`, `tokenization_realm`, `initialization` (from any BERT-layout checkpoint)
- `modeling_base` (the shared base class), `modeling_embedder`, `modeling_reader`, `modeling_knowledge_aug` (each
  model's output dataclass lives with the model; `RealmForOpenQAOutput` with the answer path that builds it)
- `modeling_openqa` ([`RealmForOpenQA`]) with its parts: `openqa_answers`,
  `reader_inputs`, `retriever_losses`, `provenance` (the answer schema), `retriever_loading`
- `modeling_pretraining` ([`RealmForPreTraining`], its inputs, ICT warm start and component checkpoints)
- `modeling_ict` ([`RealmForInverseClozeTask`], the embedders' warm start; its collator and Trainer are in `training/`)
"""
