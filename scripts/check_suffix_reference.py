"""Compare specbench's SuffixDecoding drafts with the reference's (ArcticInference's suffix cache, the version
vLLM pins) on the same request streams, step by step.

    python scripts/check_suffix_reference.py                 # builds the reference once (a C++ compiler, cmake)
    python scripts/check_suffix_reference.py --state runs/bench/suffix/drafter_state.npz --tree-spec

The reference is not a dependency: its package needs CUDA torch to build. This script downloads its source
(``pip download arctic-inference==0.1.1``, PyPI), compiles only its suffix tree (csrc/suffix_decoding, with
nanobind) into the specbench cache, and imports it from there. Streams: random token sequences over small
alphabets (many repeats and ties), and with ``--state`` the answers of a suffix run (its saved global
tree: each answer a request whose prompt is the answer before it, so the global tree fills as in a run). At every step both implementations draft from the same context; a draft that differs is put
down to a tie when the reference's draft is one specbench makes had it broken a tie between equal counts the
other way (each of its tokens a most frequent continuation, with specbench's probabilities). Exit status 1 when
some draft differs other than at a tie.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specbench.storage.cache import cache_root  # noqa: E402
from specbench.reporting import reporting_user_errors  # noqa: E402
from specbench.decoding.contract import Draft, StepOutcome  # noqa: E402
from specbench.drafters.suffix import SuffixDecoding, _children, match_ends, speculate  # noqa: E402

REFERENCE = "arctic-inference==0.1.1"  # vLLM's pin (vllm/config/speculative.py _validate_suffix_decoding)
NANOBIND = "nanobind==2.9.2"  # the reference's build requirement (its pyproject.toml)


def build_reference(cache: Path) -> Path:
    """A directory holding an importable ``arctic_inference.suffix_decoding`` (the reference's Python cache over
    its compiled suffix tree), built once."""
    home = cache / "suffix-reference" / REFERENCE.replace("==", "-")
    package = home / "arctic_inference" / "suffix_decoding"
    if any(package.glob("_C*.so")):
        return home
    work = Path(tempfile.mkdtemp(prefix="suffix-reference-"))
    try:
        sdist = download_sdist(work)
        subprocess.run([sys.executable, "-m", "pip", "install", "--target", str(work / "nanobind"), NANOBIND],
                       check=True)
        with tarfile.open(sdist) as archive:
            archive.extractall(work, filter="data")
        source = next(work.glob("arctic_inference-*/"))
        build = work / "build"
        # The reference's CMakeLists asks `python -m nanobind --cmake_dir`: the interpreter must import it.
        env = {**os.environ, "PYTHONPATH": str(work / "nanobind")}
        subprocess.run(["cmake", "-S", str(source / "csrc" / "suffix_decoding"), "-B", str(build),
                        f"-DPython_EXECUTABLE={sys.executable}", "-DCMAKE_BUILD_TYPE=Release"], check=True, env=env)
        subprocess.run(["cmake", "--build", str(build), "-j", "2"], check=True, env=env)
        package.mkdir(parents=True, exist_ok=True)
        (home / "arctic_inference" / "__init__.py").write_text("")
        for name in ("__init__.py", "cache.py"):
            shutil.copy(source / "arctic_inference" / "suffix_decoding" / name, package / name)
        for library in build.glob("_C*.so"):
            shutil.copy(library, package / library.name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return home


def download_sdist(directory: Path) -> Path:
    """The reference's source archive, through pip (its index and certificates), without its dependencies."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", REFERENCE, "-d", str(directory)],
                   check=True)
    archives = list(directory.glob("arctic_inference-*.tar.gz"))
    if not archives:
        raise SystemExit(f"pip download {REFERENCE} gave no source archive: {sorted(p.name for p in directory.iterdir())}")
    return archives[0]


def reference_cache(home: Path, max_tree_depth: int, max_cached_requests: int):
    sys.path.insert(0, str(home))
    module = importlib.import_module("arctic_inference.suffix_decoding")
    return module.SuffixDecodingCache(max_tree_depth=max_tree_depth, max_cached_requests=max_cached_requests)


def random_streams(rng: np.random.Generator) -> list[list[tuple[list[int], list[int]]]]:
    """Request streams (prompt, response) of random tokens: small alphabets repeat often and tie often."""
    streams = []
    for alphabet in (3, 5, 12, 60):
        requests = []
        for _ in range(6):
            prompt = rng.integers(0, alphabet, rng.integers(1, 80)).tolist()
            # Responses that copy spans of the prompt and of earlier responses, as real answers do.
            pool = prompt + [t for _, earlier in requests for t in earlier]
            response = []
            while len(response) < 60:
                if rng.random() < 0.5 and len(pool) > 4:
                    start = int(rng.integers(0, len(pool) - 4))
                    response += pool[start : start + int(rng.integers(2, 12))]
                else:
                    response += rng.integers(0, alphabet, 3).tolist()
            requests.append((prompt, response[:60]))
        streams.append(requests)
    return streams


def response_streams(path: Path) -> list[list[tuple[list[int], list[int]]]]:
    """One stream of a suffix run's responses (its drafter_state.npz, the global tree's contents, in order):
    each response a request whose prompt is the response before it."""
    with np.load(path) as saved:
        tokens, lengths = saved["response_tokens"], saved["response_lengths"]
    bounds = np.concatenate(([0], np.cumsum(lengths)))
    responses = [tokens[start:end].tolist() for start, end in zip(bounds[:-1], bounds[1:])]
    return [[(responses[index - 1] if index else [0], response) for index, response in enumerate(responses)]]


def a_tie_break_away(drafter: SuffixDecoding, context: np.ndarray, theirs) -> bool:
    """Whether the reference's path draft is one specbench could have made had it broken ties between equal
    counts the other way: in the per-request or the global tree, from the reference's match length, each of its
    tokens is a most frequent continuation, at least one of them tied with another, and its probabilities are
    those of specbench's counts."""
    pattern = context[-drafter.max_tree_depth:]
    length = theirs.match_len
    if length < 1 or not theirs.token_ids:
        return False
    for tree in (drafter.local, drafter.global_tree):
        tokens, ends = tree.tokens, match_ends(tree, pattern, length)
        prob, fits, tied = np.float32(1.0), ends.size > 0, False
        for token, their_prob in zip(theirs.token_ids, theirs.probs):
            if not fits:
                break
            children = {child: (count, following) for child, count, following in _children(tokens, ends)}
            best = max((count for count, _ in children.values()), default=0)
            count, following = children.get(token, (0, None))
            if count == 0 or count < best:
                fits = False
                break
            tied |= sum(1 for other, _ in children.values() if other == best) > 1
            if ends.size > 1:
                prob = prob * (np.float32(count) / np.float32(ends.size))
            fits = abs(float(prob) - their_prob) < 1e-6
            ends = following
        if fits and tied:
            return True
    return False


def same_probabilities(drafter: SuffixDecoding, context: np.ndarray, theirs) -> bool:
    """For tree drafts: whether specbench's draft has the reference's probabilities, node for node once sorted,
    so that the two differ only in which of equally probable nodes they took (the reference's heap and
    specbench's order equal probabilities differently)."""
    pattern = context[-drafter.max_tree_depth:]
    settings = (drafter.max_tree_depth, drafter.max_spec_tokens, drafter.max_spec_factor, drafter.max_spec_offset,
                drafter.min_token_prob, True)
    mine = speculate(drafter.local, pattern, *settings)
    responses = speculate(drafter.global_tree, pattern, *settings)
    if responses.score > mine.score:
        mine = responses
    return len(mine.probs) == len(theirs.probs) and np.allclose(sorted(mine.probs), sorted(theirs.probs), atol=1e-6)


def compare(streams, home: Path, settings: dict, tree_spec: bool) -> tuple[int, int, int]:
    """(steps, identical drafts, drafts that differ first at a tie)."""
    steps = identical = ties = 0
    failures = []
    for stream in streams:
        depth, cached = settings["max_tree_depth"], settings["max_cached_requests"]
        reference = reference_cache(home, depth, cached)
        drafter = SuffixDecoding(tree_spec=tree_spec, **settings)
        for request, (prompt, response) in enumerate(stream):
            reference.start_request(request, prompt)
            drafter.begin(np.array(prompt, dtype=np.int64))
            context = list(prompt)
            for token in response:
                reference.add_active_response(request, [token])
                drafter.accept(np.array([token]), StepOutcome(step=1, draft=Draft.empty(),
                                                              target_tokens=np.array([token]), accepted_nodes=()))
                context.append(token)
                theirs = reference.speculate(request, context[-depth:], max_spec_tokens=drafter.max_spec_tokens,
                                             max_spec_factor=drafter.max_spec_factor,
                                             max_spec_offset=drafter.max_spec_offset,
                                             min_token_prob=drafter.min_token_prob, use_tree_spec=tree_spec)
                mine = drafter.propose(np.array(context, dtype=np.int64))
                steps += 1
                mine_tokens = mine.token_ids.tolist()
                same = mine_tokens == list(theirs.token_ids)
                if same and tree_spec and mine.parents is not None:
                    same = mine.parents.tolist() == list(theirs.parents)
                if same:
                    identical += 1
                    continue
                if not tree_spec and a_tie_break_away(drafter, np.array(context), theirs):
                    ties += 1
                    continue
                if tree_spec and same_probabilities(drafter, np.array(context), theirs):
                    ties += 1
                    continue
                failures.append((request, len(context), mine_tokens, list(theirs.token_ids)))
            reference.stop_request(request)
    for request, length, mine, theirs in failures[:10]:
        print(f"  differs: request {request}, context {length}: specbench {mine} reference {theirs}")
    return steps, identical, ties


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", type=Path, help="a suffix run's drafter_state.npz: its responses as a stream")
    parser.add_argument("--tree-spec", action="store_true", help="compare tree drafts too")
    parser.add_argument("--max-tree-depth", type=int, default=24)
    parser.add_argument("--max-cached-requests", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    home = build_reference(cache_root(None))
    streams = random_streams(np.random.default_rng(args.seed))
    if args.state is not None:
        streams += response_streams(args.state)
    settings = {"max_tree_depth": args.max_tree_depth, "max_cached_requests": args.max_cached_requests}
    modes = [False, True] if args.tree_spec else [False]
    failed = False
    for tree_spec in modes:
        steps, identical, ties = compare(streams, home, settings, tree_spec)
        others = steps - identical - ties
        failed |= others > 0
        print(f"{'tree' if tree_spec else 'path'} drafts: {steps} steps, {identical} identical "
              f"({100 * identical / steps:.2f}%), {ties} differ only between equal counts, {others} otherwise")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(reporting_user_errors("check_suffix_reference", main)())
