"""Placement discovery, process ordering and execution plans (seed 003 §3.3.3-3.3.4)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlanEntry:
    """One benchmark configuration: `nodes` nodes with `ppn` processes each."""

    ppn: int
    nodes: int
    workers: tuple[int, ...]

    @property
    def procs(self) -> int:
        return len(self.workers)


def placement(hosts: dict[int, str]) -> dict[str, list[int]]:
    """Node name -> worker ranks on it (ascending), from each worker's reported host."""
    table: dict[str, list[int]] = {}
    for rank in sorted(hosts):
        table.setdefault(hosts[rank], []).append(rank)
    return table


def node_order(table: dict[str, list[int]]) -> list[str]:
    """Nodes in the order the plan uses them: the order their first worker appears."""
    return sorted(table, key=lambda n: min(table[n]))


def process_order(table: dict[str, list[int]]) -> list[int]:
    """Workers in benchmark order (Fig. 3.9): first one process of every node, then a second
    of every node, and so on. A path list is matched to processes in this order."""
    nodes = node_order(table)
    order: list[int] = []
    depth = max((len(v) for v in table.values()), default=0)
    for i in range(depth):
        for n in nodes:
            if i < len(table[n]):
                order.append(table[n][i])
    return order


def steps(maximum: int, step: int) -> list[int]:
    """1, step, 2*step, ... up to maximum (step 1: every value)."""
    if maximum < 1:
        return []
    if step <= 1:
        return list(range(1, maximum + 1))
    values = {1} | set(range(step, maximum + 1, step))
    return sorted(values)


def execution_plan(table: dict[str, list[int]], nodestep: int = 1, ppnstep: int = 1) -> list[PlanEntry]:
    """Every (processes per node, nodes) combination the placement allows (Table 3.3).

    For `ppn` processes per node only nodes with at least `ppn` workers qualify; a
    configuration of `n` nodes takes the first `ppn` workers of the first `n` of them."""
    nodes = node_order(table)
    max_ppn = max((len(v) for v in table.values()), default=0)
    plan = []
    for ppn in steps(max_ppn, ppnstep):
        usable = [n for n in nodes if len(table[n]) >= ppn]
        for count in steps(len(usable), nodestep):
            workers = tuple(w for n in usable[:count] for w in table[n][:ppn])
            plan.append(PlanEntry(ppn=ppn, nodes=count, workers=workers))
    return plan
