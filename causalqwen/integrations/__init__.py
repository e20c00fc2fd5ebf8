"""transformers and peft integration: Auto classes, model.generate, the pipeline, LoRA."""
