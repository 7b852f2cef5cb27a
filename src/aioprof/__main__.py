"""`python -m aioprof`: see aioprof.cli."""
from aioprof.cli import main

if __name__ == "__main__":
    main()
