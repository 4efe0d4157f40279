"""Placement discovery, process order and execution plans (seed 003 Tables 3.2-3.3)."""

from dmetabench import plan


def table_32():
    hosts = {1: "A", 2: "A", 3: "B", 4: "B", 5: "B", 6: "C", 7: "C", 8: "C"}
    return plan.placement(hosts)


def test_placement_table():
    assert table_32() == {"A": [1, 2], "B": [3, 4, 5], "C": [6, 7, 8]}


def test_execution_plan_is_table_33():
    got = [(e.ppn, e.nodes, e.workers) for e in plan.execution_plan(table_32())]
    assert got == [
        (1, 1, (1,)),
        (1, 2, (1, 3)),
        (1, 3, (1, 3, 6)),
        (2, 1, (1, 2)),
        (2, 2, (1, 2, 3, 4)),
        (2, 3, (1, 2, 3, 4, 6, 7)),
        (3, 1, (3, 4, 5)),
        (3, 2, (3, 4, 5, 6, 7, 8)),
    ]


def test_steps():
    assert plan.steps(16, 5) == [1, 5, 10, 15]
    assert plan.steps(3, 1) == [1, 2, 3]
    assert [(e.ppn, e.nodes) for e in plan.execution_plan(table_32(), nodestep=2, ppnstep=2)] == [
        (1, 1),
        (1, 2),
        (2, 1),
        (2, 2),
    ]


def test_process_order_round_robin_over_nodes():
    # Fig. 3.9: seven processes on two nodes; rank 0 (the master) is not a worker.
    hosts = {1: "n1", 2: "n1", 3: "n1", 4: "n2", 5: "n2", 6: "n2"}
    assert plan.process_order(plan.placement(hosts)) == [1, 4, 2, 5, 3, 6]
