"""Result files of one run directory, written as questions finish so an interrupted run can resume.

    run.json                 settings that make results comparable; a resumed run must match them
    answers.jsonl            the method's answers, Spec-Bench model_answer schema (one line per question)
    baseline_answers.jsonl   the paired autoregressive answers, same schema (absent with run.baseline=false)
    steps.parquet            one row per decoding step of the method (columns: schema.STEP_COLUMNS)
    summary.json             per-task and overall speedup, acceptance, throughput, exactness (schema.SCHEMA_VERSION)
    drafter_state.npz        what the drafter carries across questions (Token Recycling's matrix) after the
                             questions listed in it, for drafters that carry any: a resumed run continues from it
    skipped.jsonl            questions that cannot be run here, and why: a prompt longer than the model's context
                             (cause "too_long"), a question that ran out of GPU memory ("out_of_memory", with
                             the memory figures of every GPU the target uses), or one whose request to vLLM did not
                             finish in engine.request_timeout_s ("timeout", with timeout_s)
    verify_latency.json      the start-up verify-latency calibration (with run.verify_padding or run.draft_budget)
    specbench.log            the run's log; .hydra/ the composed config and overrides (CLI runs)
    .specbench.lock          held by the process running here (pid, host, start); a second run is refused

Both answer files can be fed to Spec-Bench's own ``evaluation/speed.py`` as --file-path / --base-path.

The modules, lowest first:

    schema.py         what a decode returns (Answer, StepRecord) and the schema version; imports neither pandas
                      nor pyarrow, so the decoding loop can use it
    question_keys.py  question ids compared, stored and shown one way
    validation.py     what a line of each result file must hold to be counted (LineKind, record_problem)
    left_out.py       the one warning per file naming the lines or rows left out
    steps_file.py     steps.parquet written and read, its rows checked (StepRows)
    readers.py        every result file read the one way resuming, the summary and analysis share
    resumable.py      whether a run directory may be continued with these settings (the one refusal)
    summary.py        summary.json's statistics
    console.py        the summary as the terminal shows it
    run_directory.py  RunDirectory: opening, appending, rewriting a run's files

Every reader (resuming, the summary, ``python -m analysis``) reads these files through
``readers.read_run_results``: a line or step row counts only when it is a well-formed record of its file and of a
question of the run, the first one of its question, of a finished question; each file's others are named in one
warning and left out. Question ids are compared by ``question_keys.question_key`` (their JSON text), so ``1``
and ``"1"`` are two questions and big integers keep every digit. Every write goes through ``write_atomically``
or ``append_line``: a refusing filesystem is one line naming the file, and nothing half-written is left for a
reader to trust.
"""
