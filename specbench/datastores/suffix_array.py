"""A token datastore with a suffix array: every occurrence of a token sequence in a corpus, found by binary
search, with the continuations that followed it (REST's retrieval, HD's statistics database).

On disk a datastore is a directory:

    manifest.json   format version, corpus description, document and token counts, tokenizer fingerprint, and
                    each file's size, modification time and SHA-256 (checked on load: storage.manifest.verify_files)
    tokens.npy      int32 token ids of all documents, each followed by SEPARATOR
    suffixes.npy    int32/int64 suffix array of tokens.npy (positions in lexicographic order)
"""

from __future__ import annotations

import bisect
import shlex
from pathlib import Path

import numpy as np

from specbench.storage.manifest import read_manifest, verify_files
from specbench.storage.publish import replace_directory
from specbench.errors import SpecbenchError, damage_reason

FORMAT_VERSION = 1
SEPARATOR = -1  # ends every document; queries never contain it, so no match or continuation crosses documents
BUILD_COMMAND = "python scripts/build_datastore.py --model MODEL --corpus CORPUS"


class TokenDatastore:
    """Token ids and their suffix array, searchable by exact token-sequence match."""

    def __init__(self, tokens: np.ndarray, suffixes: np.ndarray, manifest: dict):
        assert tokens.ndim == 1 and suffixes.shape == tokens.shape
        self.tokens = tokens
        self.suffixes = suffixes
        self.manifest = manifest
        # Big-endian bytes order like the integers they encode (tokens are shifted to be non-negative), so
        # comparing byte slices compares token sequences: the binary search runs on C-level slicing.
        self._bytes = (tokens.astype(np.int64) - SEPARATOR).astype(">u4").tobytes()

    # ---- building and storage -------------------------------------------------------------------------

    @staticmethod
    def build(documents, manifest: dict) -> TokenDatastore:
        """A datastore from an iterable of token-id sequences (one per document)."""
        from pydivsufsort import divsufsort

        pieces, count = [], 0
        for document in documents:
            ids = np.asarray(document, dtype=np.int32)
            if ids.size == 0:
                continue
            pieces.append(ids)
            pieces.append(np.array([SEPARATOR], dtype=np.int32))
            count += 1
        if not pieces:
            raise SpecbenchError("the corpus holds no text: nothing to build a datastore from")
        tokens = np.concatenate(pieces)
        suffixes = divsufsort(tokens, force64=tokens.size >= 2**31)
        manifest = {**manifest, "format_version": FORMAT_VERSION, "documents": count, "tokens": int(tokens.size)}
        return TokenDatastore(tokens, suffixes, manifest)

    def save(self, directory: str | Path) -> None:
        def write(staging: Path) -> None:
            np.save(staging / "tokens.npy", self.tokens)
            np.save(staging / "suffixes.npy", self.suffixes)

        replace_directory(directory, write, self.manifest)

    @staticmethod
    def load(directory: str | Path, tokenizer_fingerprint: str | None = None, vocab_size: int | None = None,
             command: str = BUILD_COMMAND) -> TokenDatastore:
        """Load a datastore, checking that it is whole (``verify_files``; array sizes and dtypes as the manifest
        says), was built with the expected tokenizer and, given ``vocab_size`` (the target's embedding rows),
        holds no token id outside the vocabulary. ``command`` (scripts/build_datastore.py without ``--out``)
        is what the errors suggest to rebuild it."""
        directory = Path(directory)
        rebuild = f"rebuild it with `{command} --out {shlex.quote(str(directory))}`"
        manifest = read_manifest(directory, "datastore", rebuild)
        if manifest.get("format_version") != FORMAT_VERSION:
            raise SpecbenchError(f"{directory}: datastore format {manifest.get('format_version')}, expected {FORMAT_VERSION}; {rebuild}")
        problem = verify_files(directory, manifest)
        if problem:
            raise SpecbenchError(f"{directory}: damaged datastore ({problem}); {rebuild}")
        try:
            tokens = np.load(directory / "tokens.npy", mmap_mode="r")
            suffixes = np.load(directory / "suffixes.npy", mmap_mode="r")
        except Exception as error:  # numpy raises OSError, ValueError, EOFError, pickle's errors, ...
            raise SpecbenchError(f"{directory}: damaged datastore ({damage_reason(error)}); {rebuild}") from None
        if not isinstance(tokens, np.ndarray) or not isinstance(suffixes, np.ndarray):  # an .npz under the name
            raise SpecbenchError(f"{directory}: damaged datastore (tokens.npy or suffixes.npy holds no array); "
                                 f"{rebuild}")
        if (tokens.ndim != 1 or tokens.dtype != np.int32 or suffixes.dtype not in (np.int32, np.int64)
                or tokens.shape != suffixes.shape or tokens.shape[0] != manifest.get("tokens")):
            raise SpecbenchError(f"{directory}: damaged datastore (tokens.npy {tokens.dtype}{list(tokens.shape)}, "
                                 f"suffixes.npy {suffixes.dtype}{list(suffixes.shape)}, manifest.json: "
                                 f"{manifest.get('tokens')} tokens); {rebuild}")
        tokenizer = manifest.get("tokenizer") if isinstance(manifest.get("tokenizer"), dict) else {}
        if tokenizer_fingerprint is not None and tokenizer.get("fingerprint") != tokenizer_fingerprint:
            raise SpecbenchError(
                f"{directory} was built with another tokenizer ({tokenizer.get('name')}) than "
                f"the target's; build one for this model with `{command} --out NEW_DIR`"
            )
        tokens, suffixes = np.asarray(tokens), np.asarray(suffixes)
        if tokens.size:
            # A separator is the only negative id; any id past the vocabulary would fail mid-run, in the model.
            bad = out_of_vocabulary(tokens, SEPARATOR, vocab_size)
            if bad is not None:
                raise SpecbenchError(f"{directory}: token id {bad} in tokens.npy is outside the target's vocabulary "
                                     f"(ids 0..{(vocab_size or 0) - 1}, {SEPARATOR} ends a document); {rebuild}")
            if int(suffixes.min()) < 0 or int(suffixes.max()) >= tokens.size:
                raise SpecbenchError(f"{directory}: damaged datastore (suffixes.npy points outside tokens.npy); {rebuild}")
        return TokenDatastore(tokens, suffixes, manifest)

    # ---- search -----------------------------------------------------------------------------------------

    def _key(self, query_length: int):
        width = 4 * query_length
        data, suffixes = self._bytes, self.suffixes

        def key(rank: int) -> bytes:
            start = 4 * int(suffixes[rank])
            return data[start : start + width]

        return key

    def find(self, query: np.ndarray) -> tuple[int, int]:
        """Suffix-array ranks [lo, hi) of the suffixes that start with ``query`` (empty when lo == hi)."""
        target = (np.asarray(query, dtype=np.int64) - SEPARATOR).astype(">u4").tobytes()
        key = self._key(len(query))
        lo = bisect.bisect_left(range(self.suffixes.size), target, key=key)
        hi = bisect.bisect_right(range(self.suffixes.size), target, lo=lo, key=key)
        return lo, hi

    def longest_suffix_match(self, context: np.ndarray, max_length: int, min_length: int) -> tuple[int, int, int]:
        """The longest suffix of ``context`` (``max_length`` down to ``min_length`` tokens) that occurs in the
        datastore, as (length, lo, hi); length 0 when none does.

        If a suffix occurs, every shorter suffix occurs too, so the longest one is found by bisecting on the
        length instead of trying each length in turn.
        """
        best = (0, 0, 0)
        low, high = min_length, min(max_length, context.size)
        while low <= high:
            length = (low + high) // 2
            lo, hi = self.find(context[context.size - length :])
            if hi > lo:
                best = (length, lo, hi)
                low = length + 1
            else:
                high = length - 1
        return best

    def continuation_matrix(self, lo: int, hi: int, offset: int, length: int, max_matches: int,
                            sample: str = "even") -> np.ndarray:
        """[m, length] tokens following the matches of ranks [lo, hi), each starting ``offset`` tokens after
        the match start; positions past the end of a document hold SEPARATOR. Rows stay in suffix-array
        order, so equal prefixes are adjacent. More than ``max_matches`` matches are thinned evenly
        (``sample="even"``) or cut to the first ``max_matches`` in suffix-array order (``"first"``, REST's
        DraftRetriever: the matches whose continuations sort first)."""
        ranks = np.arange(lo, hi)
        if ranks.size > max_matches:
            if sample == "first":
                ranks = ranks[:max_matches]
            else:
                ranks = ranks[np.linspace(0, ranks.size - 1, max_matches).astype(np.int64)]
        starts = self.suffixes[ranks].astype(np.int64) + offset
        positions = np.minimum(starts[:, None] + np.arange(length), self.tokens.size - 1)
        matrix = self.tokens[positions]
        # Everything from a document's separator on is no continuation.
        ended = np.logical_or.accumulate(matrix == SEPARATOR, axis=1)
        matrix[ended] = SEPARATOR
        return matrix


def prefix_group_starts(matrix: np.ndarray) -> np.ndarray:
    """[m, length] bool for rows sorted lexicographically: entry (i, d) is True when row i's first d+1 tokens
    differ from row i-1's, i.e. row i starts a new group of equal (d+1)-token prefixes.

    Example: rows [5 1], [5 1], [5 2], [6 0] -> [[T T], [F F], [F T], [T T]].
    """
    starts = np.ones(matrix.shape, dtype=bool)
    if matrix.shape[0] > 1:
        starts[1:] = np.logical_or.accumulate(matrix[1:] != matrix[:-1], axis=1)
    return starts


def out_of_vocabulary(ids: np.ndarray, lowest: int, vocab_size: int | None) -> int | None:
    """The first id in ``ids`` below ``lowest`` (the smallest id the format allows: 0, or a separator) or, given
    ``vocab_size``, at or above it; None when all are in range. Two passes over the array (min and max), then a
    search only when one is out of range."""
    if ids.size == 0:
        return None
    low, high = int(ids.min()), int(ids.max())
    if low >= lowest and (vocab_size is None or high < vocab_size):
        return None
    bad = (ids < lowest) if vocab_size is None else (ids < lowest) | (ids >= vocab_size)
    return int(ids.reshape(-1)[np.flatnonzero(bad.reshape(-1))[0]])
