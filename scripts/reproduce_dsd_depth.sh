#!/usr/bin/env bash
# The dsd_depth experiment: sweep (resumable), then table, figures and report in results/dsd_depth/.
exec "$(dirname "$0")/reproduce.sh" dsd_depth "$@"
