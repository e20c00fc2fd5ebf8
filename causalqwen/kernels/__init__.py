"""Fast paths of the decision head and its loss: the tiled kernel and its torch.compile wrapper."""
