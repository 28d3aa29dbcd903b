"""`python -m services.scaler.simulation` is `spotrain simulate`: the cluster replay, or
with `deadline` first, the single-job deadline head-to-head, with `teams` first, a trace
shared by teams under fair share."""

import sys

from services.scaler.simulation import deadline, replay, teams

if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] == ["deadline"]:
        sys.exit(deadline.main(argv[1:]))
    if argv[:1] == ["teams"]:
        sys.exit(teams.main(argv[1:]))
    sys.exit(replay.main(argv))
