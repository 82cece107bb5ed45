"""Evaluation: the standard depth metrics, the packed/masked/dense accuracy of a checkpoint, figures."""
