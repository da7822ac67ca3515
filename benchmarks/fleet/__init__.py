"""The fleet simulator: notebook traces replayed through the real scheduler core in simulated
time, to judge scheduling policies (``python -m benchmarks.fleet``).

It drives ``nodeside.scheduler.core.Scheduler`` through ``nodeside.testing.Replay`` (the
daemon's and the clients' part, in virtual time, with the spans it records), as the tests do,
and is no part of the product: nothing here is compiled into the daemon or shipped in the wheel
(docs/decisions/0012-a-testing-module.md).

- the engine's model: ``switching`` (what moving working sets over the host link costs, the
  ``MemoryMoves`` a fleet's replay is given);
- the fleet: ``workload`` (who the notebooks are and when they ask), ``runs`` (one replay and
  its figures; the runs compared), ``seeds`` (many seeds in worker processes), ``report``
  (the tables), ``cli`` (the command);
- what a run measures beside its figures: ``bound`` (floors under short cells' slowdown),
  ``explain`` (where their waiting went), ``shares`` (pools' shares in contention);
- references and variants: ``oracle`` (a clairvoyant policy), ``hints`` (it on hinted
  estimates), ``turns`` (holders taking turns at several switch costs), ``memory`` (handoffs
  whose way out and way in overlap, as a chunked evictor's would);
- the node's host memory: ``tiers`` (host RAM as a budget, spills to a disk tier, restores on
  intent, the daemon's rules in the memory model), ``tier_sweep`` (notebooks per GPU carried,
  host RAM only against host + disk, ``--tiers``);
- ``timeline``: the timelines in docs/.
"""
