"""Slurm orchestration: the cluster profiles, studies, job-array sweeps, accounting and the bigMNIST build jobs."""
