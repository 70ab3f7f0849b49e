"""cuGraphExecUpdate's verdict on the simulated driver (backends/drivers/sim_update.py): which update is refused and
which node the refusal names, walking back from the exit nodes as the CUDA driver documents it. The same cases
run on the CUDA driver in tests/gpu/test_exec_update_rules_gpu.py, which must give the same verdicts."""

import numpy as np
import pytest

from graphdiag.backends.drivers.sim import SimDriver
from graphdiag.backends.drivers.sim_graph import Node
from graphdiag.backends.drivers.sim_update import match_graphs
from support.update_cases import CASES, Graphs


@pytest.fixture
def graphs():
    d = SimDriver(memory_bytes=1 << 20)
    g = Graphs(d)
    yield g
    g.close()
    d.close()


@pytest.mark.parametrize("name", sorted(CASES))
def test_update_verdict(graphs, name):
    old, new, expected = CASES[name]
    assert graphs.verdict(lambda: old(graphs), lambda: new(graphs)) == expected


def _chain(pdl: list[bool]) -> list[Node]:
    return [Node("kernel", f"k{i}", deps=(i - 1,) if i else (), programmatic=p) for i, p in enumerate(pdl)]


def test_the_refusal_names_the_last_changed_node_not_the_first():
    """86 nodes with the edge type changed at node 3 and node 85 (graphdiag's tiny F16 graph with fusion off,
    1 -> 2 sequences: layer 0's Q projection and the output mat-mul leave mmvf for MMF): node 85 named, as the
    CUDA driver named it on the H100."""
    old = _chain([True] * 86)
    new = _chain([i not in (3, 85) for i in range(86)])
    m = match_graphs(old, new)
    assert not m.outcome.ok and m.outcome.result.name == "TOPOLOGY_CHANGED"
    assert m.outcome.error_node == ("node 85 of 86: kernel k85; its edge from node 84 became ordinary "
                                    "(PDL launch changed)")


def test_a_crosswise_pairing_gives_each_node_its_partners_parameters():
    """Branches joined the other way: the executable's branch nodes take each other's parameters, keep their
    own edges and ids, and the replay computes the new graph's work."""
    d = SimDriver(memory_bytes=1 << 20)
    g = Graphs(d)
    d.set_pdl(True)
    x = d.instantiate(g.fork_join(1, 1))
    ids = [n.node_id for n in x.nodes]
    new = g.fork_join(1, 1, (1, 0))
    new.nodes[1].label, new.nodes[2].label = "first branch", "second branch"
    assert d.exec_update(x, new).ok
    assert [n.label for n in x.nodes[1:3]] == ["second branch", "first branch"]
    assert [n.node_id for n in x.nodes] == ids and [n.deps for n in x.nodes] == [(), (0,), (0,), (0, 1, 2)]
    d.graph_launch(x, g.s0)
    out = np.zeros(64, np.float32)
    d.memcpy_dtoh(out, g.bufs[2])
    np.testing.assert_array_equal(out, 3)
    g.close()
    d.close()
