#!/usr/bin/env bash
# The sampling experiment: sweep (resumable), then table, figures and report in results/sampling/.
exec "$(dirname "$0")/reproduce.sh" sampling "$@"
