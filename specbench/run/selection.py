"""The questions a run decodes, as its task group selects them, in two steps around loading the target: ``read``
before anything loads (the question file, the tasks, the limit), ``fit`` once the target's prompt format can count
a prompt's tokens (the long-context tasks' prompt-length bounds, then their limit). The runner,
``python -m specbench.prepare`` and scripts/bench_engines.py select through it, so all three decode the same
questions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specbench.long_context import LONGDOC
from specbench.long_context.documents import longdoc_file
from specbench.long_context.prompt_length import check_prompt_bounds, within_prompt_length
from specbench.questions import Prompt, check_selection, read_questions, select_questions


@dataclass(frozen=True)
class TaskSelection:
    """The task group's selection. ``bounds``: (least, exclusive; most, inclusive or None) from
    task.min_prompt_tokens and task.max_prompt_tokens, None when the task has neither (every task but the
    long-context ones): then ``fit`` changes nothing and counts nothing."""

    path: str | None
    tasks: tuple[str, ...]
    limit_per_task: int | None
    bounds: tuple[int, int | None] | None

    @classmethod
    def of(cls, task) -> TaskSelection:
        """From the task group's node, its values checked (``check_selection``, ``check_prompt_bounds``)."""
        tasks = tuple(task.tasks)
        check_selection(list(tasks), task.limit_per_task)
        bounds = check_prompt_bounds(task.get("min_prompt_tokens"), task.get("max_prompt_tokens"))
        return cls(task.path, tasks, task.limit_per_task, bounds)

    def read(self) -> list[Prompt]:
        """The selected questions before their prompts are counted: those of ``path`` (``read_questions``) and,
        when the path is null and ``longdoc`` is selected, the set written from the corpus (written once; a run
        of other tasks neither needs the corpus nor reads it). With bounds the limit waits for ``fit``, since
        LongSpec runs the first prompts its length filter keeps (inference_long-bench.py:117-130)."""
        prompts = read_questions(self.path, self.tasks)
        if self.path is None and LONGDOC in self.tasks:
            prompts = [*prompts, *read_questions(str(longdoc_file()))]
        limit = self.limit_per_task if self.bounds is None else None
        return select_questions(prompts, list(self.tasks), limit)

    def fit(self, questions: list[Prompt], count_tokens: Callable[[Prompt], int]) -> list[Prompt]:
        """``questions`` (what ``read`` gave) kept by prompt length, ``count_tokens`` counting a prompt's first
        turn as the target reads it (``Engine.prompt_tokens``), then cut to the limit; ``questions`` as they are
        when the task has no bounds."""
        if self.bounds is None:
            return questions
        return select_questions(within_prompt_length(questions, count_tokens, *self.bounds), list(self.tasks),
                                self.limit_per_task)
