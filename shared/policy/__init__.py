"""The platform's domain rules, pure: no I/O, no clock, no randomness, no bus, no client.

- `deadline`: for one job, run on spot, on on-demand, or wait (the scaler, the checkpointer
  and the simulator decide with it).
- `fairshare` and `teams`: what each team is guaranteed and may borrow, and the teams file
  as a value (`shared.teams_file` reads it).
- `elastic`: how many workers a multi-node job runs with.
- `pool_knowledge`: what has been learnt of each pool (losses, stock-outs, windows).
- `cost`: prices, the ledger, attribution of node time to jobs, the billing export's check
  (`shared.prices` reads the packaged catalog).

Everything here is checked: an import contract keeps the bus, the runtime, the clients and
the cloud libraries out, and the architecture test reads every module for async, clock
reads and I/O libraries.
"""
