"""Preemption sources, each behind `SignalSource`: one kind of notice into `NodeSignal`s."""
