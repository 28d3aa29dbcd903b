"""python -m services.scaler"""

from services.scaler.bootstrap import bootstrap
from services.scaler.handlers import SERVICE
from services.scaler.settings import ScalerSettings
from shared.runtime import run

if __name__ == "__main__":
    run(SERVICE, bootstrap, ScalerSettings)
