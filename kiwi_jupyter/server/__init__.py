"""The Jupyter server extension: the REST endpoints the Kiwi GPU panel reads, and the embedded
scheduler that makes `jupyter lab` on a laptop work with no other step.

Files by role: ``app`` declares the extension, its options and its lifetime; ``handlers`` the
endpoints; ``link`` talks to the daemon without blocking the server; ``embedded`` runs a private
``kiwi-scheduler`` when no daemon answers. Importing this package imports no Jupyter code until
``app`` is imported, so the entry point in ``kiwi_jupyter`` stays cheap.
"""
