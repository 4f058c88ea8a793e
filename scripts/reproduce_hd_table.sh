#!/usr/bin/env bash
# The hd_table experiment: sweep (resumable), then table, figures and report in results/hd_table/.
exec "$(dirname "$0")/reproduce.sh" hd_table "$@"
