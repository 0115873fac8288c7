"""Slurm orchestration: studies, job-array sweeps, submission, accounting and the bigMNIST build jobs."""
