#!/usr/bin/env bash
# The beyond experiment (recycling, samd, eagle, eagle2, eagle3, hybrid, each +budget): sweep (resumable), then table, figures and report in
# results/beyond/; `python -m analysis tables runs/experiments/hd_table runs/experiments/beyond` shows both grids.
exec "$(dirname "$0")/reproduce.sh" beyond "$@"
