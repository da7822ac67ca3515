"""``python -m kiwi_jupyter.kernel -f CONNECTION_FILE``: the Kiwi kernel (see ``launcher``)."""

from kiwi_jupyter.kernel.launcher import main

if __name__ == "__main__":
    main()
