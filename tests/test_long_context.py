"""Long-context tasks: LongBench's subsets read as LongSpec formats them, the longdoc set written from a corpus, and
the prompt-length bounds LongSpec selects by.

The templates are restated here from LongSpec's source (sail-sg/LongSpec @15e4998,
``longspec/test/inference_long-bench.py``), not copied from specbench's strings: the prompt is the benchmark, and a
space more or less changes every token after it. LongSpec's fixed wrapper ("<s>system\\nYou are a helpful
assistant</s>\\n<s>user\\n" before, "</s>\\n<s>assistant\\n" and "Summary:" or "Answer:" after) is not part of them.
"""

from __future__ import annotations

import json

import pytest
from conftest import refusal

from specbench.config import check_config, compose
from specbench.long_context import LONGBENCH_TASKS, LONGDOC, documents
from specbench.long_context.documents import cut_at_paragraph, longdoc_file, section_headings
from specbench.long_context.longbench import LONGBENCH_TEMPLATES
from specbench.long_context.prompt_length import check_prompt_bounds, within_prompt_length
from specbench.questions import ALL_TASKS, Prompt, read_questions
from specbench.run.selection import TaskSelection

# :11-12 (inside "<s>user\n" ... "</s>\n")
GOV_REPORT = ("You are given a report by a government agency. Write a one-page summary of the report.\n\nReport:\n"
              "{context}\n\nNow, write a one-page summary of the report.")
# :17-20
QMSUM = ("You are given a meeting transcript and a query containing a question or instruction. Answer the query in "
         "one or more sentences.\n\nTranscript:\n{context}\n\nNow, answer the query based on the above meeting "
         "transcript in one or more sentences.\n\nQuery: {input}")
# :25-26: "passages", and a space before the blank line
MULTI_NEWS = ("You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}\n\n"
              "Now, write a one-page summary of all the news.")
# :31 and :36, the same for both: a space before the newline, none between the code and "Now"
CODE = "Please complete the code given below. \n{context}Now, complete the code given."


def test_each_template_is_longspecs_user_part_word_for_word():
    assert LONGBENCH_TEMPLATES == {"gov_report": GOV_REPORT, "qmsum": QMSUM, "multi_news": MULTI_NEWS, "lcc": CODE,
                                   "repobench-p": CODE}
    assert LONGBENCH_TASKS == ("gov_report", "qmsum", "multi_news", "lcc", "repobench-p")  # its --task choices, :68-70
    assert set(LONGBENCH_TASKS) | {LONGDOC} <= set(ALL_TASKS)


def write_lines(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((json.dumps(record) if isinstance(record, dict) else record) + "\n" for record in records))
    return path


def longbench_folder(root):
    """A LongBench data folder of specbench's own made-up records, with the fields LongBench keeps, an unread subset
    beside them, and a blank line (it keeps its number)."""
    write_lines(root / "gov_report.jsonl", [
        {"input": "", "context": "The agency reviewed {three} programs.", "answers": ["..."], "length": 6,
         "dataset": "gov_report", "language": "en", "all_classes": None, "_id": "a1b2"},
        {"input": "", "context": "A second report.", "answers": ["..."], "length": 3, "_id": "c3d4"}])
    write_lines(root / "qmsum.jsonl", ["", {"input": "What was decided?", "context": "Alice: we ship on Monday."}])
    write_lines(root / "lcc.jsonl", [{"input": "", "context": "def add(a, b):\n    return a + b\n"}])
    write_lines(root / "narrativeqa.jsonl", [{"input": "Who?", "context": "A story."}])  # a subset LongSpec never ran
    return root


def test_a_longbench_folder_is_read_as_longspecs_prompts(tmp_path):
    prompts = read_questions(str(longbench_folder(tmp_path)), ["gov_report", "qmsum", "lcc"])
    assert [(prompt.question_id, prompt.task, prompt.category) for prompt in prompts] == [
        ("a1b2", "gov_report", "gov_report"), ("c3d4", "gov_report", "gov_report"),
        ("qmsum_2", "qmsum", "qmsum"), ("lcc_1", "lcc", "lcc")]
    assert prompts[0].turns == (GOV_REPORT.replace("{context}", "The agency reviewed {three} programs."),)
    assert prompts[2].turns == (QMSUM.replace("{context}", "Alice: we ship on Monday.")
                                .replace("{input}", "What was decided?"),)
    assert prompts[3].turns == ("Please complete the code given below. \ndef add(a, b):\n    return a + b\n"
                                "Now, complete the code given.",)


def test_one_subset_file_is_read_as_the_subset_its_name_says(tmp_path):
    path = write_lines(tmp_path / "multi_news.jsonl", [{"context": "Passage one.\nPassage two.", "_id": 7}])
    [prompt] = read_questions(str(path))
    assert (prompt.question_id, prompt.task) == (7, "multi_news")
    assert prompt.turns[0] == MULTI_NEWS.replace("{context}", "Passage one.\nPassage two.")


@pytest.mark.parametrize("name, records, expected", [
    ("gov_report.jsonl", [{"context": "x", "_id": "1"}, {"input": "", "_id": "2"}],
     'gov_report.jsonl, line 2: this LongBench gov_report record has no "context"'),
    ("gov_report.jsonl", [{"input": "", "answers": []}], 'line 1: this LongBench gov_report record has no "context"'),
    ("qmsum.jsonl", [{"context": "Bob: hi."}], 'line 1: this LongBench qmsum record has no "input"; LongSpec\'s '
                                               'qmsum prompt reads the string fields context, input'),
    ("lcc.jsonl", [{"context": ["code"]}], 'has a list as its "context"'),
    ("lcc.jsonl", [{"context": "  \n"}], "\"context\" is empty"),
    ("lcc.jsonl", [{"context": "a", "_id": "x"}, {"context": "b", "_id": "x"}], "line 2: _id 'x' appears twice"),
    ("narrativeqa.jsonl", [{"input": "Who?", "context": "A story."}],
     "'narrativeqa' is not one specbench has LongSpec's prompt for; name the file one of gov_report.jsonl, "
     "qmsum.jsonl, multi_news.jsonl, lcc.jsonl, repobench-p.jsonl"),
], ids=["missing-context", "no-context-at-all", "qmsum-without-input", "context-not-text", "blank-context",
        "id-twice", "unknown-subset"])
def test_a_faulty_longbench_file_is_one_line_naming_file_line_and_what_is_valid(tmp_path, name, records, expected):
    path = write_lines(tmp_path / name, records)
    message = refusal(read_questions, str(path))
    assert str(path) in message and expected in message


def test_a_record_of_no_known_form_is_refused_naming_both_forms(tmp_path):
    path = write_lines(tmp_path / "other.jsonl", [{"prompt": "hello", "answer": "hi"}])
    message = refusal(read_questions, str(path))
    assert "line 1: missing question_id, category, turns" in message
    assert '"turns"' in message and "LongBench's records" in message and "repobench-p.jsonl" in message


def test_a_folder_of_mixed_forms_or_without_a_selected_subset_is_one_line(tmp_path):
    mixed = longbench_folder(tmp_path / "mixed")
    write_lines(mixed / "question.jsonl", [{"question_id": 1, "category": "qa", "turns": ["Why?"]}])
    assert "a folder mixing question files" in refusal(read_questions, str(mixed), ["qa"])

    posing = longbench_folder(tmp_path / "posing")
    write_lines(posing / "lcc.jsonl", [{"question_id": 1, "category": "qa", "turns": ["Why?"]}])
    message = refusal(read_questions, str(posing), ["lcc"])
    assert "a folder mixing forms" in message and "lcc.jsonl holds question records" in message

    partial = longbench_folder(tmp_path / "partial")
    message = refusal(read_questions, str(partial), list(LONGBENCH_TASKS))
    assert "a LongBench data folder without multi_news.jsonl, repobench-p.jsonl, which task.tasks selects" in message

    (tmp_path / "empty").mkdir()
    assert "and none of LongBench's gov_report.jsonl" in refusal(read_questions, str(tmp_path / "empty"))


def test_longbench_without_a_path_says_to_point_task_path_at_the_users_copy():
    message = refusal(TaskSelection.of(compose(["task=longbench"]).task).read)
    assert message.startswith("task.path is null, but LongBench's gov_report, qmsum, multi_news, lcc, repobench-p")
    assert "(specbench ships none of its text): point task.path at your LongBench data folder" in message


# --- the prompt-length bounds -------------------------------------------------------------------------------------

def prompts_of(*lengths, task="gov_report"):
    return [Prompt(f"q{index}", task, task, ("x" * length,)) for index, length in enumerate(lengths)]


def count(prompt):
    return len(prompt.turns[0])


def test_the_bounds_keep_more_than_the_least_and_at_most_the_most(caplog):
    prompts = prompts_of(1200, 1201, 5000, 14384, 14385)
    with caplog.at_level("INFO"):
        kept = within_prompt_length(prompts, count, 1200, 14384)
    assert [count(prompt) for prompt in kept] == [1201, 5000, 14384]  # LongSpec: 1200 < length <= context - 2000
    assert "3 of 5 questions kept" in caplog.text and "1 dropped as shorter, 1 as longer" in caplog.text
    assert [count(p) for p in within_prompt_length(prompts, count, 1200, None)] == [1201, 5000, 14384, 14385]
    message = refusal(within_prompt_length, prompts, count, 20000, None)
    assert message == ("none of the 5 selected questions has a prompt of more than 20,000 and any number tokens "
                       "(theirs: from 1,200 to 14,385); lower task.min_prompt_tokens or raise task.max_prompt_tokens")


@pytest.mark.parametrize("least, most, expected", [
    (None, None, None), (0, None, None), (1200, None, (1200, None)), (None, 100, (0, 100)),
    (-1, None, "task.min_prompt_tokens must be a number of tokens (0 or more) or null, got -1"),
    (True, None, "task.min_prompt_tokens must be a number of tokens (0 or more) or null, got True"),
    (None, 0, "task.max_prompt_tokens must be a positive number of tokens or null, got 0"),
    (1200, 1200, "task.max_prompt_tokens=1200 keeps no prompt of more than task.min_prompt_tokens=1200 tokens"),
])
def test_the_bounds_are_checked_in_one_line(least, most, expected):
    if expected is None or isinstance(expected, tuple):
        assert check_prompt_bounds(least, most) == expected
    else:
        assert refusal(check_prompt_bounds, least, most).startswith(expected)


def test_the_limit_takes_the_first_questions_the_bounds_keep(tmp_path):
    """LongSpec runs the first --test_length prompts its filter kept (inference_long-bench.py:129-137)."""
    task = compose(["task=gov_report", f"task.path={tmp_path}", "task.limit_per_task=2"]).task
    selection = TaskSelection.of(task)
    prompts = prompts_of(100, 2000, 50, 3000, 4000)
    assert [prompt.question_id for prompt in selection.fit(prompts, count)] == ["q1", "q3"]
    unbounded = TaskSelection.of(compose(["task=qa", "task.limit_per_task=2"]).task)
    assert unbounded.bounds is None and unbounded.fit(prompts, None) == prompts  # counts nothing


def test_every_other_task_has_no_bounds_and_bad_bounds_are_refused_before_loading():
    from specbench.config import group_options

    for option in group_options("task"):
        bounds = TaskSelection.of(compose([f"task={option}"]).task).bounds
        assert bounds == ((1200, None) if option in (*LONGBENCH_TASKS, "longbench", LONGDOC) else None), option
    message = refusal(check_config, compose(["task=longdoc", "task.max_prompt_tokens=1000"]))
    assert message.startswith("task.max_prompt_tokens=1000 keeps no prompt of more than task.min_prompt_tokens=1200")


def test_a_run_selects_by_the_prompt_as_the_target_reads_it(tmp_path):
    """tiny-random's plain format around a byte vocabulary: "USER: " + turn + "\\nASSISTANT:" and the BOS token,
    so a prompt is len(turn) + 18 tokens."""
    from specbench.runner import run_benchmark

    contexts = {"a": 40, "b": 200, "c": 120, "d": 300}
    folder = write_lines(tmp_path / "data" / "lcc.jsonl",
                         [{"context": "x" * size, "_id": name} for name, size in contexts.items()]).parent
    overhead = len(CODE.replace("{context}", "")) + 18
    overrides = ["model=tiny-random", "task=lcc", f"task.path={folder}", "run.max_new_tokens=4", "run.warmup_runs=0",
                 f"task.min_prompt_tokens={overhead + 100}", f"task.max_prompt_tokens={overhead + 250}"]
    summary = run_benchmark(compose(overrides), str(tmp_path / "run"))
    answered = [json.loads(line)["question_id"] for line in (tmp_path / "run" / "answers.jsonl").read_text().splitlines()]
    assert answered == ["b", "c"] and summary["tasks"]["overall"]["questions"] == 2
    assert list(summary["tasks"]) == ["lcc", "overall"]  # a task of ALL_TASKS: summarized in its own row
    summary = run_benchmark(compose([*overrides, "task.limit_per_task=1"]), str(tmp_path / "limited"))
    assert summary["tasks"]["overall"]["questions"] == 1  # the first kept: b, though a comes first in the file
    assert json.loads((tmp_path / "limited" / "answers.jsonl").read_text().splitlines()[0])["question_id"] == "b"


# --- longdoc: the set written from a corpus -----------------------------------------------------------------------

def synthetic_document(number: int, paragraphs: int = 130) -> str:
    """A reStructuredText page of specbench's own words: a title, then sections of numbered paragraphs."""
    lines = ["*" * 20, f"  Page {number:02d}", "*" * 20, ""]
    for index in range(paragraphs):
        if index % 15 == 0:
            heading = f"Section {number}.{index // 15}"
            lines += [heading, "=" * len(heading), ""]
        lines += [f"Paragraph {index} of page {number} says the same few words again, so that it is long enough "
                  f"to be cut at a paragraph boundary; number {index} ends here.", ""]
    return "\n".join(lines)


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    """A specbench cache whose python-docs corpus is 14 long pages of made-up text (one without any heading) and a
    short one; the cache is $SPECBENCH_CACHE while the test runs."""
    cache = tmp_path / "cache"
    root = cache / "corpora" / "python-docs"
    for number in range(14):
        (root / f"part{number % 3}").mkdir(parents=True, exist_ok=True)
        (root / f"part{number % 3}" / f"page{number:02d}.rst.txt").write_text(synthetic_document(number))
    (root / "part0" / "short.rst.txt").write_text(synthetic_document(99, paragraphs=3))
    (root / "part1" / "plain.rst.txt").write_text(synthetic_document(98).replace("=", " ").replace("*", " "))
    monkeypatch.setenv("SPECBENCH_CACHE", str(cache))
    return root


def test_a_paragraph_is_never_cut_in_two():
    text = "One one.\n\nTwo two two.\n  \nThree."
    assert cut_at_paragraph(text, 100) == text
    assert cut_at_paragraph(text, 24) == "One one.\n\nTwo two two."  # the blank line of spaces ends a paragraph too
    assert cut_at_paragraph(text, 22) == "One one.\n\nTwo two two." and cut_at_paragraph(text, 21) == "One one."
    assert cut_at_paragraph(text, 5) == ""
    assert section_headings("***\n  Top\n***\n\nA\n-\n\nTitle\n===\n\nB\n==========\n") == ["Top", "B"]


def test_the_set_is_twelve_questions_from_the_corpus_pages_in_both_prompts(corpus):
    records = [json.loads(line) for line in longdoc_file().read_text(encoding="utf-8").splitlines()]
    assert [record["question_id"] for record in records] == [f"longdoc_{n}" for n in range(1, 13)]
    assert {record["category"] for record in records} == {"longdoc"}
    assert [record["template"] for record in records] == ["gov_report", "qmsum"] * 6
    # 14 eligible pages (short and plain are not) in sorted path order, 12 of them evenly spaced
    eligible = sorted(f"part{n % 3}/page{n:02d}.rst.txt" for n in range(14))
    assert [record["source"] for record in records] == [eligible[n * 14 // 12] for n in range(12)]
    first, second = records[0], records[1]
    page = synthetic_document(int(first["source"][-10:-8]))
    context = first["turns"][0][len("You are given a report by a government agency. Write a one-page summary of "
                                    "the report.\n\nReport:\n"):-len("\n\nNow, write a one-page summary of the report.")]
    assert 14_000 <= len(context) <= 18_000 and page.startswith(context) and page[len(context):].startswith("\n\n")
    number = int(second["source"][-10:-8])
    assert second["turns"][0].endswith(f"in one or more sentences.\n\nQuery: What does the document say about "
                                       f"Section {number}.0?")
    prompts = TaskSelection.of(compose(["task=longdoc"]).task).read()
    assert [prompt.question_id for prompt in prompts] == [record["question_id"] for record in records]


def test_the_set_is_written_once_per_corpus_content_and_the_same_each_time(corpus, monkeypatch, tmp_path):
    path = longdoc_file()
    written = path.read_bytes()

    def must_not_write(documents):
        raise AssertionError("written again")

    with monkeypatch.context() as patched:
        patched.setattr(documents, "longdoc_records", must_not_write)
        assert longdoc_file() == path and path.read_bytes() == written  # cached: read, not written again

    other = tmp_path / "other-cache" / "corpora"
    other.mkdir(parents=True)
    (other / "python-docs").symlink_to(corpus, target_is_directory=True)
    monkeypatch.setenv("SPECBENCH_CACHE", str(other.parent))
    again = longdoc_file()
    assert again != path and again.name == path.name and again.read_bytes() == written  # same corpus, same set

    (corpus / "part2" / "page02.rst.txt").write_text(synthetic_document(2, paragraphs=131))
    assert longdoc_file().name != path.name  # an edited corpus is another set


def test_without_the_corpus_longdoc_is_one_line_and_other_tasks_never_look_for_it(monkeypatch, tmp_path):
    monkeypatch.setattr(documents, "default_corpus_dirs", lambda cache: [])
    message = refusal(TaskSelection.of(compose(["task=longdoc"]).task).read)
    assert message.startswith("task=longdoc is written from the Python documentation (the corpus python-docs), which "
                              "is not here: run ./setup.sh on a Debian/Ubuntu machine, or `apt-get install python3-doc`")
    assert len(TaskSelection.of(compose(["task=qa"]).task).read()) == 4


def test_a_corpus_without_twelve_long_pages_is_one_line(corpus):
    for page in sorted(corpus.rglob("page*.rst.txt"))[:3]:
        page.unlink()
    assert "task=longdoc takes 12 documents of at least 14,000 characters with a section heading from the corpus " \
           "python-docs, which has 11" in refusal(longdoc_file)


@pytest.mark.slow
def test_the_set_from_the_real_python_docs_is_3000_to_5000_tokens_a_prompt(tmp_path, monkeypatch):
    """The token counts docs/usage.md gives, in the embedded model's chat template, from the python-docs corpus of
    the user's cache (the test cache links its models/ there), written into a cache of the test's own."""
    from conftest import TEST_CACHE
    from hydra.utils import instantiate

    real_cache = (TEST_CACHE / "models").resolve().parent
    if not (real_cache / "corpora" / "python-docs").is_dir():
        pytest.skip("the python-docs corpus is not in the specbench cache (./setup.sh unpacks it)")
    (tmp_path / "corpora").mkdir()
    (tmp_path / "corpora" / "python-docs").symlink_to(real_cache / "corpora" / "python-docs")
    (tmp_path / "models").symlink_to(real_cache / "models")
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    prompts = TaskSelection.of(compose(["task=longdoc"]).task).read()
    model = instantiate(compose(["model=smollm2-135m"]).model, device="cpu")
    counts = [len(model.encode_conversation([prompt.turns[0]], [])) for prompt in prompts]
    assert len(counts) == 12 and all(3000 <= count <= 5000 for count in counts), counts
