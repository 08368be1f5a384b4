"""
realm-hf on the Hugging Face Hub (import the functions from their modules; nothing is re-exported here).

- `repositories`: publishing a model (and its corpus) and loading the retriever a repo references
- `auto_map`: transformers' Auto classes pointed at realm-hf in saved directories
- `cards` (generate and write model and corpus cards, keeping what people wrote), `card_content` (what the cards say:
  per-task text, metadata, Markdown sections); the Trainers' `create_model_card` is a capability of the Trainers
  (`realm_hf.training.saving`)
"""
