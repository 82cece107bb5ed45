"""The packed path's heart and what every layer shares: ModelConfig, token selection and buckets,
the model, input checks, preprocessing, files written atomically, the checkpoint format."""
