"""python -m services.submitter"""

from services.submitter.bootstrap import bootstrap
from services.submitter.handlers import SERVICE
from services.submitter.settings import SubmitterSettings
from shared.runtime import run

if __name__ == "__main__":
    run(SERVICE, bootstrap, SubmitterSettings)
