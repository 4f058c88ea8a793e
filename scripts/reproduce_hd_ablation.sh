#!/usr/bin/env bash
# The hd_ablation experiment: sweep (resumable), then table, figures and report in results/hd_ablation/.
exec "$(dirname "$0")/reproduce.sh" hd_ablation "$@"
