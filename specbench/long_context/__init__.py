"""Long-context tasks: LongBench's five subsets as LongSpec evaluates them (``longbench``), specbench's own set
written from the Python documentation (``documents``), and the prompt-length bounds LongSpec selects prompts by
(``prompt_length``). ``specbench.questions`` reads LongBench's files as it reads every question file;
``specbench.run.selection`` adds the written set and selects by prompt length.
"""

# The subsets LongSpec's script evaluates (its --task choices, longspec/test/inference_long-bench.py:68-70 @15e4998),
# in its order; each is a task named as the subset.
LONGBENCH_TASKS = ("gov_report", "qmsum", "multi_news", "lcc", "repobench-p")
# specbench's own long-context task (``documents``).
LONGDOC = "longdoc"
