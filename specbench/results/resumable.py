"""Whether a run directory's results may be continued with these settings: the settings its run.json records
compared with the settings now, in one function with the one refusal message. The runner asks before loading
anything (over the keys the configuration fixes); ``RunDirectory.open`` asks again once the model is loaded
(over every key, weights, dtype and software included), before anything is written."""

from __future__ import annotations

from pathlib import Path

from specbench.errors import SpecbenchError

# Leaf names of settings recorded for the record only: a resumed run may differ in them (a new commit of
# specbench continues an earlier run).
MAY_DIFFER_ON_RESUME = ("git_sha",)


def settings_differences(earlier: dict, now: dict, keys=None) -> list[str]:
    """``key: earlier -> now`` for each setting (nested ones dotted) that differs, over ``keys`` (default: all).

    >>> settings_differences({"run": {"seed": 1}, "git_sha": "a"}, {"run": {"seed": 2}, "git_sha": "b"})
    ['run.seed: 1 -> 2']
    """
    def flat(node, prefix=""):
        if isinstance(node, dict):
            out = {}
            for name, value in node.items():
                out.update(flat(value, f"{prefix}{name}."))
            return out
        return {prefix[:-1]: node}

    keys = sorted(set(earlier) | set(now)) if keys is None else keys
    before = flat({key: earlier.get(key) for key in keys})
    after = flat({key: now.get(key) for key in keys})
    return [f"{key}: {before.get(key)!r} -> {after.get(key)!r}" for key in sorted(set(before) | set(after))
            if before.get(key) != after.get(key) and key.rsplit(".", 1)[-1] not in MAY_DIFFER_ON_RESUME]


def resume_refusal(run_dir: str | Path, earlier: dict, now: dict, keys=None) -> SpecbenchError | None:
    """The one-line refusal to continue the run in ``run_dir``, whose run.json holds ``earlier``, with the
    settings ``now``, naming every setting that differs over ``keys`` (default: every key of either); None when
    none does."""
    changed = settings_differences(earlier, now, keys)
    if not changed:
        return None
    return SpecbenchError(f"{run_dir} holds results of a run with other settings ({'; '.join(changed)}); "
                          "choose another hydra.run.dir or remove that directory")
