"""LongBench's subsets as LongSpec evaluates them: each record of ``<subset>.jsonl`` made into one user turn by the
subset's template (sail-sg/LongSpec @15e4998, ``longspec/test/inference_long-bench.py``, cited by line below).

LongSpec wraps every template in a fixed conversation of its own (``<s>system\\nYou are a helpful assistant</s>\\n
<s>user\\n`` ... ``</s>\\n<s>assistant\\n``, the answer opened with ``Summary:`` for gov_report and multi_news,
``Answer:`` for qmsum). specbench keeps the user's part alone and renders it in the target's own prompt format, as
it renders every question; the answer is not opened for the model (docs/fidelity.md).
"""

from __future__ import annotations

from specbench.errors import SpecbenchError

# The code subsets share one template (:31 lcc, :36 repobench-p); repobench-p's record also holds an "input"
# (the code to continue from, which LongBench's own prompt appends), which LongSpec's template leaves out, as here.
_CODE_COMPLETION = "Please complete the code given below. \n{context}Now, complete the code given."

# The user part of each of LongSpec's templates (dataset2prompt, :8-39), byte for byte: the prompt is the
# benchmark, and a space more or less changes every token after it.
LONGBENCH_TEMPLATES = {
    "gov_report": ("You are given a report by a government agency. Write a one-page summary of the report.\n\n"
                   "Report:\n{context}\n\nNow, write a one-page summary of the report."),  # :11-12
    "qmsum": ("You are given a meeting transcript and a query containing a question or instruction. "
              "Answer the query in one or more sentences.\n\nTranscript:\n{context}\n\n"
              "Now, answer the query based on the above meeting transcript in one or more sentences.\n\n"
              "Query: {input}"),  # :17-20
    "multi_news": ("You are given several news passages. Write a one-page summary of all news. \n\n"
                   "News:\n{context}\n\nNow, write a one-page summary of all the news."),  # :25-26
    "lcc": _CODE_COMPLETION,
    "repobench-p": _CODE_COMPLETION,
}

# The record fields each template reads: LongSpec formats with str.format(**record), which fails on a missing one.
TEMPLATE_FIELDS = {subset: ("context", "input") if "{input}" in template else ("context",)
                   for subset, template in LONGBENCH_TEMPLATES.items()}


def longbench_turn(subset: str, record: dict, where: str) -> str:
    """The user turn LongSpec's template makes of ``record`` (a LongBench line of ``subset``); a field the template
    reads that is missing or not a string is one line naming ``where`` (file and line). A blank context is refused
    too: the prompt would be the template's instructions around nothing."""
    values = {}
    for field in TEMPLATE_FIELDS[subset]:
        value = record.get(field)
        if not isinstance(value, str):
            state = "has no" if field not in record else f"has a {type(value).__name__} as its"
            raise SpecbenchError(f'{where}: this LongBench {subset} record {state} "{field}"; LongSpec\'s {subset} '
                                 f'prompt reads the string fields {", ".join(TEMPLATE_FIELDS[subset])}')
        values[field] = value
    if not values["context"].strip():
        raise SpecbenchError(f'{where}: this LongBench {subset} record\'s "context" is empty; every record must hold '
                             'the text its prompt is about')
    # str.format parses only the template: braces inside the context (code, above all) are kept as they are.
    return LONGBENCH_TEMPLATES[subset].format(**values)


def longbench_question_id(subset: str, record: dict, line: int, where: str) -> int | str:
    """The record's ``_id`` (LongBench's, a hex string), or ``<subset>_<line>`` for a record without one."""
    if "_id" not in record:
        return f"{subset}_{line}"
    question_id = record["_id"]
    if not isinstance(question_id, (int, str)) or isinstance(question_id, bool):
        raise SpecbenchError(f'{where}: "_id" must be a string or an integer, got {question_id!r}')
    return question_id
