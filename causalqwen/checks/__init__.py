"""Input checks, each at one public door: ``doors`` (the model's forward and generation inputs, one host
synchronisation), ``tokenizer_door`` (the tokenizer's arguments) and ``values`` (the shared value checks, the
finite-parameter check of training)."""
