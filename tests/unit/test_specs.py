"""localcluster/client/specs.py on its own: the Specs of a map, made in one loop for plain
arguments, are the Specs that the one making of a task (worker/api.py's ``ClientApi.make_task``,
over the Client's transport) makes one by one. No processes."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from localcluster.client.transport import GatewayTransport
from localcluster.worker.api import DEFAULT_OPTIONS, ClientApi, Options


def made_by(client_id="client-1"):
    """The Client's Specs, and the one making of a task over the Client's transport (no cluster:
    making a task reaches neither the gateway nor the table)."""
    transport = GatewayTransport(SimpleNamespace(id=client_id), SimpleNamespace(journal=None), None, lambda: None)
    api = ClientApi(transport)

    def spec(fn, args, kwargs, key, opts, how=None):
        return api.make_task(how or transport.function(fn, opts.pure), args, kwargs, key, opts)
    return transport.specs, SimpleNamespace(spec=spec)


def double(x, y=0):
    return 2 * x + y


@pytest.mark.parametrize("pure", [True, False])
def test_a_map_of_plain_arguments_makes_the_specs_one_call_each_would(pure):
    specs, one_by_one = made_by()
    opts = Options(pure, 2, 5.0, 3, frozenset({"w0"}), True, (("GPU", 1.0),))
    how = specs.how(double, pure)
    argss = [(i,) for i in range(50)] + [("a", 2), (1.5,), ()]
    many = specs.many(argss, opts, how)
    one = [one_by_one.spec(double, args, {}, None, opts, how) for args in argss]
    fields = ("fn_id", "fn", "args", "deps", "priority", "retries", "timeout", "workers", "loose",
              "resources", "submitter")
    assert [[getattr(s, f) for f in fields] for s in many] == [[getattr(s, f) for f in fields] for s in one]
    if pure:        # the same call, the same key: one result for both
        assert [s.key for s in many] == [s.key for s in one]
    else:           # every task a key of its own, never made before
        keys = {s.key for s in many} | {s.key for s in one}
        assert len(keys) == 2 * len(argss) and all(k.startswith("double-") for k in keys)


def test_a_map_with_an_argument_that_is_not_plain_is_left_to_spec():
    specs, _ = made_by()
    opts = Options(False, 0, None, 0, None, False)
    assert specs.many([(1,), ([1, 2],)], opts, specs.how(double, False)) is None


@pytest.mark.parametrize("pure", [True, False])
def test_the_tasks_of_one_function_under_the_default_options_share_one_terms(pure):
    """64 bytes a task, not 128: the function and the options live in one Terms that the
    Specs of a map, and of submits with the defaults, share; other options get their own."""
    specs, one_by_one = made_by()
    default = DEFAULT_OPTIONS[pure]
    how = specs.how(double, pure)
    made = specs.many([(i,) for i in range(3)], default, how)
    made += [one_by_one.spec(double, (i,), {}, None, default) for i in range(3, 6)]
    assert len({id(s.terms) for s in made}) == 1 and made[0].terms is specs.how(double, pure).terms
    assert (made[0].fn_id, made[0].priority, made[0].resources) == (how.fn_id, 0, None)
    other = one_by_one.spec(double, (1,), {}, None, Options(pure, 1, None, 5, None, False))
    assert other.terms is not made[0].terms and (other.priority, other.retries, other.fn) == (5, 1, how.fn_bytes)
    renamed = made[0].with_key("k-1")
    assert renamed.key == "k-1" and renamed.terms is made[0].terms and renamed.kept is made[0].kept
