from __future__ import annotations

from sshddp.cli import main

if __name__ == "__main__":
    main()
