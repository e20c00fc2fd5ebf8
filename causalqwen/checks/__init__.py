"""Input checks, each at one public door: ``doors`` (the model's forward and generation inputs, one host
synchronisation), ``tokenizer_door`` (the tokenizer's arguments), ``values`` (masks, labels, thresholds, the
shared value checks) and ``float32`` (the exact float32 faithfulness rule V1 that number literals must pass)."""
