"""What a benchmark's JSON must get right whatever its figures: each verdict follows from its number."""
import operator

OPS = {">=": operator.ge, "<=": operator.le}


def bar(target: dict) -> tuple[str, float]:
    """The (op, bound) of a target entry, in any of the benchmarks' spellings."""
    if "op" in target:
        return target["op"], float(target["value"] if "value" in target else target["target"])
    op, value = target["target"].split()
    return op, float(value)


def check_verdicts(targets: dict) -> None:
    """Every ``pass`` is the comparison of ``measured`` with the bar (None when nothing was measured)."""
    assert targets, "no targets"
    for key, target in targets.items():
        op, bound = bar(target)
        measured = target["measured"]
        if measured is None or measured != measured:
            assert target["pass"] is None, key
        else:
            assert target["pass"] is OPS[op](measured, bound), (key, target)
