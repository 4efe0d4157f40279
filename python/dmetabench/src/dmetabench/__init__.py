"""DMetabench: a distributed metadata benchmark framework (after Biardzki, seed 003 ch. 3).

A master process discovers where its workers run, derives an execution plan over numbers
of nodes and processes per node, and runs benchmark plugins (prepare / doBench / cleanup)
on the chosen workers. A supervisor thread in every worker logs the operations completed
at every interval, so results keep the time dimension; `dmetabench analyze` turns them into
per-interval totals, rates, standard deviation and COV, and stonewall averages.
"""

__version__ = "0.1.0"
