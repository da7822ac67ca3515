"""The kernel application: ipykernel's, with the Kiwi extension always loaded.

Kept apart from ``launcher`` because importing ipykernel must wait until the launcher has decided
whether to re-execute with the shim preloaded.
"""

from __future__ import annotations

from ipykernel.kernelapp import IPKernelApp

EXTENSION = "kiwi_jupyter"


class KiwiKernelApp(IPKernelApp):
    """An IPython kernel that loads ``kiwi_jupyter`` after the user's own extensions."""

    def init_extensions(self) -> None:
        # Added here rather than on the command line so that a user's own `extensions` or
        # `extra_extensions` setting adds to Kiwi instead of replacing it.
        if EXTENSION not in (*self.extensions, *self.extra_extensions):
            self.extra_extensions = [*self.extra_extensions, EXTENSION]
        super().init_extensions()
