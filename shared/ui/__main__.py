"""python -m shared.ui"""

from shared.ui.run import main

if __name__ == "__main__":
    main()
