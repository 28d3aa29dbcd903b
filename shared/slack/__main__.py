"""python -m shared.slack"""

import sys

from pydantic import ValidationError

from shared.runtime import run
from shared.slack.bootstrap import bootstrap_for
from shared.slack.handlers import SERVICE
from shared.slack.settings import SlackSettings


def main() -> None:
    try:
        settings = SlackSettings()
    except ValidationError as error:
        missing = ", ".join(
            "SPOTRAIN_SLACK_" + str(e["loc"][0]).upper() for e in error.errors() if e["loc"]
        )
        sys.stderr.write(f"spotrain slack bot: invalid or missing settings: {missing}\n")
        raise SystemExit(2) from None
    run(SERVICE, bootstrap_for(settings), lambda: settings)


if __name__ == "__main__":
    main()
