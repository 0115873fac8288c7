"""From run records to judged numbers: the runs' tables (runs.py), which points to trust (trust.py) and the
project's criteria (criteria.py). pandas, no torch; the report and the analysis notebooks read these."""
