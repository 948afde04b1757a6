"""The OpInfo expected-failure file (tests/opinfo_expected_failures.toml): read, diff, rewrite.

The file groups known failures by cause::

    [[cause]]
    reason = "why these fail"
    cases = ["<op>[.<variant>] <dtype> <forward|backward> <samples>", ...]

where <samples> is "all" or sample indices such as "0,3-5". A case may appear under several
causes with different samples. Ops whose CPU result is undefined compare by shape and dtype::

    [[undefined]]
    reason = "why the CPU's values mean nothing"
    ops = ["empty", ...]
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, Tuple

PATH = Path(__file__).resolve().parent / "opinfo_expected_failures.toml"

HEADER = """\
# PyTorch's OpInfo corpus on the ipu (tests/test_opinfo.py): the cases known to fail, by cause.
# A case is "<op>[.<variant>] <dtype> <forward|backward> <samples>", <samples> being "all" or
# sample indices ("0,3-5"). The test fails on a failure that is not listed here AND on a listed
# sample that passes: when you fix something, delete its lines (the list only shrinks).
# `python tests/opinfo_corpus.py --update` rewrites the lists from a full run, keeping reasons.
"""


def parse_samples(text: str, count: Optional[int] = None) -> Set[int]:
    """"all" (needs `count`) or "0,3-5" -> a set of sample indices."""
    if text == "all":
        if count is None:
            raise ValueError('"all" needs the number of samples')
        return set(range(count))
    indices: Set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        indices.update(range(int(first), int(last or first) + 1))
    return indices


def format_samples(indices: Iterable[int], count: int) -> str:
    ordered = sorted(indices)
    if len(ordered) == count:
        return "all"
    runs: List[Tuple[int, int]] = []
    for i in ordered:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


@dataclass
class Cause:
    reason: str
    cases: Dict[str, str] = field(default_factory=dict)  # case key -> samples text


@dataclass
class Undefined:
    reason: str
    ops: List[str] = field(default_factory=list)


@dataclass
class ExpectedFailures:
    causes: List[Cause] = field(default_factory=list)
    undefined: List[Undefined] = field(default_factory=list)

    @staticmethod
    def load(path: Path = PATH) -> "ExpectedFailures":
        data = tomllib.loads(path.read_text()) if path.exists() else {}
        result = ExpectedFailures()
        for entry in data.get("cause", []):
            cause = Cause(entry["reason"])
            for line in entry.get("cases", []):
                key, _, samples = line.rpartition(" ")
                if len(key.split(" ")) != 3 or not samples:
                    raise ValueError(f"{path}: '{line}' is not '<op> <dtype> <direction> "
                                     "<samples>'")
                if key in cause.cases:
                    raise ValueError(f"{path}: {key} is listed twice under '{cause.reason}'")
                cause.cases[key] = samples
            result.causes.append(cause)
        for entry in data.get("undefined", []):
            result.undefined.append(Undefined(entry["reason"], list(entry.get("ops", []))))
        return result

    def keys(self) -> Set[str]:
        return {key for cause in self.causes for key in cause.cases}

    def undefined_ops(self) -> Dict[str, str]:
        return {op: u.reason for u in self.undefined for op in u.ops}

    def expected(self, key: str, count: int) -> Dict[int, str]:
        """Sample index -> reason, for the listed failures of case `key` (of `count` samples)."""
        found: Dict[int, str] = {}
        for cause in self.causes:
            if key in cause.cases:
                for index in parse_samples(cause.cases[key], count):
                    found[index] = cause.reason
        return found

    def updated(self, key: str, count: int, failures: Dict[int, str],
                new_reason) -> None:
        """Makes the entries of `key` list exactly `failures`: samples that pass leave their
        cause; failures not listed go to the cause `new_reason(message)` names."""
        listed: Set[int] = set()
        for cause in self.causes:
            if key not in cause.cases:
                continue
            keep = parse_samples(cause.cases[key], count) & set(failures)
            listed |= keep
            if keep:
                cause.cases[key] = format_samples(keep, count)
            else:
                del cause.cases[key]
        new: Dict[str, Set[int]] = {}
        for index, message in failures.items():
            if index not in listed:
                new.setdefault(new_reason(message), set()).add(index)
        for reason, indices in new.items():
            cause = next((c for c in self.causes if c.reason == reason), None)
            if cause is None:
                cause = Cause(reason)
                self.causes.append(cause)
            previous = parse_samples(cause.cases[key], count) if key in cause.cases else set()
            cause.cases[key] = format_samples(previous | indices, count)

    def write(self, path: Path = PATH) -> None:
        lines = [HEADER]
        for u in self.undefined:
            lines.append("[[undefined]]")
            lines.append(f"reason = {_quote(u.reason)}")
            lines.append("ops = [" + ", ".join(_quote(op) for op in u.ops) + "]\n")
        for cause in self.causes:
            if not cause.cases:
                continue
            lines.append("[[cause]]")
            lines.append(f"reason = {_quote(cause.reason)}")
            lines.append("cases = [")
            for key in sorted(cause.cases):
                lines.append(f"  {_quote(key + ' ' + cause.cases[key])},")
            lines.append("]\n")
        path.write_text("\n".join(lines))


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
