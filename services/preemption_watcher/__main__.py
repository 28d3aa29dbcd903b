"""python -m services.preemption_watcher"""

from services.preemption_watcher.bootstrap import bootstrap
from services.preemption_watcher.handlers import SERVICE
from services.preemption_watcher.settings import PreemptionWatcherSettings
from shared.runtime import run

if __name__ == "__main__":
    run(SERVICE, bootstrap, PreemptionWatcherSettings)
