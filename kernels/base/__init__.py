"""The bottom layer: errors, safe files, the parameter catalogue, statistics, timers, FLOP counts, the machine's
description, process-group start-up and the figure-label helpers. Imports nothing else of the lab."""
