"""localcluster/client_specs.py on its own: the Specs of a map, made in one loop for plain
arguments, are the Specs that one ``spec`` call per task makes. No processes."""
from __future__ import annotations

import pytest

from localcluster.client_specs import Options, Specs


def double(x, y=0):
    return 2 * x + y


@pytest.mark.parametrize("pure", [True, False])
def test_a_map_of_plain_arguments_makes_the_specs_one_call_each_would(pure):
    specs = Specs("client-1")
    opts = Options(pure, 2, 5.0, 3, frozenset({"w0"}), True, (("GPU", 1.0),))
    how = specs.how(double, pure)
    argss = [(i,) for i in range(50)] + [("a", 2), (1.5,), ()]
    many = specs.many(argss, opts, how)
    one = [specs.spec(double, args, {}, None, opts, how) for args in argss]
    fields = ("fn_id", "fn", "args", "deps", "priority", "retries", "timeout", "workers", "loose",
              "resources", "submitter")
    assert [[getattr(s, f) for f in fields] for s in many] == [[getattr(s, f) for f in fields] for s in one]
    if pure:        # the same call, the same key: one result for both
        assert [s.key for s in many] == [s.key for s in one]
    else:           # every task a key of its own, never made before
        keys = {s.key for s in many} | {s.key for s in one}
        assert len(keys) == 2 * len(argss) and all(k.startswith("double-") for k in keys)


def test_a_map_with_an_argument_that_is_not_plain_is_left_to_spec():
    specs = Specs("client-1")
    opts = Options(False, 0, None, 0, None, False)
    assert specs.many([(1,), ([1, 2],)], opts, specs.how(double, False)) is None
