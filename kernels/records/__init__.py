"""Run records and checkpoints as files: the record schema (schema.py) and the self-verifying checkpoint file
(checkpoint_file.py). Above base/ only."""
