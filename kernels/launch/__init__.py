"""Starting a run: the configuration resolved once on the driver (config.py) and the ranks started and watched
(ranks.py). The `lab train` command (kernels/train.py) is its entry point."""
