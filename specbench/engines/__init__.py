"""The engines that decode a run's questions: ``base.Engine`` is the seam, ``specbench_loop`` and ``vllm`` the two
engines; the ``engine`` config group's ``_target_`` names the one a run uses (``specbench.config.choose_engine``)."""
