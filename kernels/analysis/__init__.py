"""From run records to judged numbers and their typeset form: the runs' tables (runs.py), which points to trust
(trust.py), the criteria's machinery (criteria.py; the criteria themselves belong to the workloads), and the
helpers every document section draws with: LaTeX (tex.py), figures (figures.py) and the benchmark tables
(benchmarks.py). pandas and matplotlib, no torch; the report, the workloads' reporting modules and the analysis
notebooks read these."""
