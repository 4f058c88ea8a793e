"""What decodes a run's questions: the ``Engine`` interface the runner talks to (``base``) and its implementations;
today the specbench loop (``specbench_loop``, with its warm-up, calibration and drafter state beside it)."""
