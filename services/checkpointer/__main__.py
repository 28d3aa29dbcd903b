"""python -m services.checkpointer"""

from services.checkpointer.bootstrap import bootstrap
from services.checkpointer.handlers import SERVICE
from services.checkpointer.settings import CheckpointerSettings
from shared.runtime import run

if __name__ == "__main__":
    run(SERVICE, bootstrap, CheckpointerSettings)
